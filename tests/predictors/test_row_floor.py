"""The per-row floor: every query keeps its m nearest allowed keys on top of a base graph."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.attention.masks import layer_allowed
from sparsefinder.methods.spec import PredictorSpec, predict_layer
from sparsefinder.predictors import Distance, Window
from sparsefinder.predictors.row_floor import RowFloor, floor_counts
from sparsefinder.predictors.threshold_distance import ThresholdDistance

HEADS, N, R = 3, 24, 4
LAYOUTS = [(False, None), (True, None), (True, 5), (False, 5)]  # full, causal, local ×2


def _qk(seed: int = 0, m: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(HEADS, N, R, generator=gen), torch.randn(HEADS, m, R, generator=gen)


def _nearest_reference(q, k, floor, causal, window) -> torch.Tensor:
    """Each row's ``floor`` nearest allowed keys, row by row (the test's slow reference)."""
    n, m = q.shape[1], k.shape[1]
    allowed = layer_allowed(n, m, causal=causal, sliding_window=window)
    dist = torch.cdist(q.double(), k.double())
    out = torch.zeros(HEADS, n, m, dtype=torch.bool)
    for h in range(HEADS):
        for i in range(n):
            keys = torch.arange(m) if allowed is None else allowed[i].nonzero()[:, 0]
            order = dist[h, i, keys].argsort()[:floor]
            out[h, i, keys[order]] = True
    return out


@pytest.mark.parametrize(("causal", "window"), LAYOUTS)
@pytest.mark.parametrize("floor", [1, 3, 8])
def test_floor_alone_is_each_rows_nearest_allowed_keys(causal, window, floor) -> None:
    q, k = _qk()
    got = RowFloor(None, floor).predict(q, k, causal=causal, sliding_window=window)
    assert torch.equal(got, _nearest_reference(q, k, floor, causal, window))
    allowed = layer_allowed(N, N, causal=causal, sliding_window=window)
    per_row = torch.full((N,), N) if allowed is None else allowed.sum(-1)
    # every row keeps exactly min(floor, allowed) keys, none outside what it may see
    assert torch.equal(got.sum(-1), per_row.clamp(max=floor).expand(HEADS, -1))
    if allowed is not None:
        assert not (got & ~allowed).any()


@pytest.mark.parametrize(("causal", "window"), LAYOUTS)
def test_floor_unites_the_base_graph_with_the_nearest_keys(causal, window) -> None:
    q, k = _qk(1)
    t2 = torch.tensor([0.5, 2.0, -1.0])  # head 2's threshold keeps nothing
    base = ThresholdDistance(t2)
    got = RowFloor(base, 2).predict(q, k, causal=causal, sliding_window=window)
    want = base.predict(q, k, causal=causal) | _nearest_reference(q, k, 2, causal, window)
    allowed = layer_allowed(N, N, causal=causal, sliding_window=window)
    if allowed is not None:
        want &= allowed
    assert torch.equal(got, want)
    assert (got.sum(-1) >= 1).all()  # no row left without support, unlike the threshold
    assert (base.predict(q, k, causal=causal)[2].sum(-1) == 0).all()


def test_the_fast_distance_path_equals_the_general_union() -> None:
    """A distance base is tested in the same pass as the floor; any other base is predicted
    and OR-ed: both give the same graph."""
    q, k = _qk(2)
    general = RowFloor(Window(3), 2).predict(q, k, causal=True)
    assert torch.equal(general, (Window(3).predict(q, k, causal=True)
                                 | RowFloor(None, 2).predict(q, k, causal=True)))
    fast = RowFloor(Distance(1.0), 2).predict(q, k, causal=True)
    per_head = RowFloor(ThresholdDistance(torch.ones(HEADS)), 2).predict(q, k, causal=True)
    assert torch.equal(fast, per_head)
    assert torch.equal(fast, Distance(1.0).predict(q, k, causal=True)
                       | RowFloor(None, 2).predict(q, k, causal=True))


def test_a_prefix_of_keys_and_a_floor_wider_than_the_rows() -> None:
    q, k = _qk(3, m=N + 6)  # 6 cached keys before the queries
    got = RowFloor(None, 40).predict(q, k, causal=True)
    assert torch.equal(got, layer_allowed(N, N + 6, causal=True).expand(HEADS, -1, -1))


def test_predict_layer_spends_the_floor_inside_a_local_window() -> None:
    """Through the one prediction path, a local layer's rows get their m keys in the window
    (choosing among all keys and cutting afterwards would leave some rows short)."""
    q, k = _qk(4)
    spec = PredictorSpec.of("distance", {"threshold": 0.0, "floor": 3})
    predictor = spec.build(None, 0)
    mask = predict_layer(predictor, q, k, causal=True, sliding_window=4)
    assert torch.equal(mask.sum(-1), torch.arange(1, N + 1).clamp(max=3).expand(HEADS, -1))


def test_errors() -> None:
    with pytest.raises(ValueError, match="floor"):
        RowFloor(None, 0)
    with pytest.raises(TypeError, match="predict"):
        RowFloor("distance", 2)
    q, k = _qk()
    with pytest.raises(ValueError, match="calibrated for 2 heads"):
        RowFloor(ThresholdDistance(torch.ones(2)), 1).predict(q, k)
    with pytest.raises(ValueError, match="floor must be an integer"):
        PredictorSpec.of("distance:budget", {"target_sparsity": 0.9, "floor": -1})
    with pytest.raises(ValueError, match="floor must be an integer"):
        PredictorSpec.of("distance", {"threshold": 1.0, "floor": 65})


class _Budget:
    """A per-row budget base that honours local windows: each row's ``per_row`` highest key
    indices among those it may see (its choice changes with the window and with causality:
    a full row picks the last keys, which a causal row may not see)."""

    honours_window = True
    returns_fresh_mask = True

    def __init__(self, per_row: int) -> None:
        self.per_row = per_row

    def predict(self, q, k, *, causal=False, sliding_window=None):
        n, m = q.shape[1], k.shape[1]
        allowed = layer_allowed(n, m, causal=causal, sliding_window=sliding_window)
        allowed = torch.ones(n, m, dtype=torch.bool) if allowed is None else allowed
        rank = allowed.flip(-1).cumsum(-1).flip(-1)  # 1-based rank from the row's last key
        return (allowed & (rank <= self.per_row)).expand(q.shape[0], -1, -1).clone()


class _BlindBudget(_Budget):
    """The same budget, for a base that knows causality but not local windows."""

    honours_window = False

    def predict(self, q, k, *, causal=False):
        return super().predict(q, k, causal=causal)


class _Cached:
    """A base that hands out the same tensor every call and does not promise a fresh one
    (nor take ``sliding_window=``): the floor must copy it, never write into it."""

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask

    def predict(self, q, k, *, causal=False):
        return self.mask


def test_the_default_layout_is_the_full_one() -> None:
    q, k = _qk(5)
    assert torch.equal(RowFloor(None, 3).predict(q, k),
                       _nearest_reference(q, k, 3, False, None))


@pytest.mark.parametrize(("causal", "window"), LAYOUTS)
def test_a_window_aware_base_chooses_inside_the_window(causal, window) -> None:
    """The base is asked with the layer's window, so its per-row budget is spent on keys
    the row may see; the floor is added on top."""
    q, k = _qk(6)
    got = RowFloor(_Budget(2), 1).predict(q, k, causal=causal, sliding_window=window)
    want = (_Budget(2).predict(q, k, causal=causal, sliding_window=window)
            | _nearest_reference(q, k, 1, causal, window))
    assert torch.equal(got, want)
    if window is not None and not causal:  # asked without the window, the budget lands
        # on the row's last keys, outside a bidirectional window
        blind = _Budget(2).predict(q, k, causal=causal) & layer_allowed(
            N, N, causal=causal, sliding_window=window)
        assert not torch.equal(blind, _Budget(2).predict(q, k, causal=causal,
                                                          sliding_window=window))


@pytest.mark.parametrize(("causal", "window"), LAYOUTS)
def test_a_base_without_window_support_is_cut_and_never_modified(causal, window) -> None:
    q, k = _qk(7)
    cached = torch.zeros(HEADS, N, N, dtype=torch.bool)
    cached[:, :, 0] = True  # every row keeps key 0
    before = cached.clone()
    got = RowFloor(_Cached(cached), 2).predict(q, k, causal=causal, sliding_window=window)
    allowed = layer_allowed(N, N, causal=causal, sliding_window=window)
    want = before | _nearest_reference(q, k, 2, causal, window)
    if allowed is not None:
        want &= allowed
    assert torch.equal(got, want)
    assert torch.equal(cached, before)  # the base's tensor is untouched
    assert got is not cached


def test_a_distance_threshold_keeps_exact_ties_and_is_squared() -> None:
    """Integer points: ‖q − k‖ equals the threshold exactly for some pairs (kept, ``≤``);
    a threshold t ≠ 1 is compared as t² (1.5² = 2.25, not 1.5³)."""
    q = torch.zeros(1, 2, 2)
    k = torch.tensor([[[1.0, 0.0], [0.0, 1.5], [2.0, 0.0], [3.0, 0.0]]])
    got = RowFloor(Distance(1.5), 1).predict(q, k)
    assert torch.equal(got[0, 0], torch.tensor([True, True, False, False]))
    got = RowFloor(Distance(1.0), 1).predict(q, k)
    assert torch.equal(got[0, 0], torch.tensor([True, False, False, False]))  # the tie
    assert torch.equal(RowFloor(Distance(1.5), 1).predict(q, k),
                       RowFloor(ThresholdDistance(torch.tensor([2.25])), 1).predict(q, k))


def test_one_query_row_and_one_short_row_still_get_the_floor() -> None:
    q, k = _qk(8)
    single = RowFloor(ThresholdDistance(torch.full((HEADS,), -1.0)), 2).predict(q[:, :1], k)
    assert torch.equal(single.sum(-1), torch.full((HEADS, 1), 2))
    # a threshold that keeps every key except in row 5 of head 0: exactly one short row
    far = q.clone()
    far[0, 5] = 1e4
    got = RowFloor(Distance(1e3), 3).predict(far, k)
    assert torch.equal(got.sum(-1)[0, 5], torch.tensor(3))
    assert int((got.sum(-1) < N).sum()) == 1


@pytest.mark.parametrize("floor", [True, 2.0, "2"])
def test_a_floor_that_is_not_an_integer_is_refused(floor) -> None:
    with pytest.raises(ValueError, match="integer"):
        RowFloor(None, floor)


@pytest.mark.parametrize(("causal", "window"), LAYOUTS)
def test_a_base_is_asked_with_the_layers_causality(causal, window) -> None:
    """A base without window support is still asked causally (and then cut to the window):
    a full-row budget asked of a causal layer would land on keys it may not see."""
    q, k = _qk(9)
    got = RowFloor(_BlindBudget(2), 1).predict(q, k, causal=causal, sliding_window=window)
    want = (_BlindBudget(2).predict(q, k, causal=causal)
            | _nearest_reference(q, k, 1, causal, window))
    allowed = layer_allowed(N, N, causal=causal, sliding_window=window)
    if allowed is not None:
        want &= allowed
    assert torch.equal(got, want)
    if causal:
        assert not torch.equal(got, RowFloor(_BlindBudget(2), 1).predict(
            q, k, causal=False, sliding_window=window) & allowed)


def _capped_reference(q, k, floor, row_share, causal, window) -> torch.Tensor:
    """Row i's ``min(floor, max(1, ⌊row_share · allowed_i⌋))`` nearest allowed keys, row by
    row (the formula written out, not the library's counts)."""
    n, m = q.shape[1], k.shape[1]
    allowed = layer_allowed(n, m, causal=causal, sliding_window=window)
    dist = torch.cdist(q.double(), k.double())
    out = torch.zeros(HEADS, n, m, dtype=torch.bool)
    for i in range(n):
        keys = torch.arange(m) if allowed is None else allowed[i].nonzero()[:, 0]
        count = min(floor, max(1, int(row_share * len(keys))))
        for h in range(HEADS):
            out[h, i, keys[dist[h, i, keys].argsort()[:count]]] = True
    return out


@pytest.mark.parametrize(("causal", "window"), LAYOUTS)
@pytest.mark.parametrize(("floor", "row_share"), [(5, 0.1), (3, 0.25), (8, 1.0), (4, 0.01)])
def test_a_capped_floor_keeps_the_formulas_keys_in_every_row(causal, window, floor,
                                                             row_share) -> None:
    q, k = _qk(10)
    got = RowFloor(None, floor, row_share).predict(q, k, causal=causal, sliding_window=window)
    assert torch.equal(got, _capped_reference(q, k, floor, row_share, causal, window))
    allowed = layer_allowed(N, N, causal=causal, sliding_window=window)
    per_row = torch.full((N,), N) if allowed is None else allowed.sum(-1)
    want = torch.tensor([min(floor, max(1, int(row_share * a))) for a in per_row.tolist()])
    assert torch.equal(got.sum(-1), want.expand(HEADS, -1))
    assert torch.equal(floor_counts(floor, row_share, per_row), want)
    if allowed is not None:
        assert not (got & ~allowed).any()


@pytest.mark.parametrize(("causal", "window"), LAYOUTS)
def test_a_capped_floor_over_a_threshold_adds_the_capped_keys(causal, window) -> None:
    """The one-pass distance path (only the rows short of their own count are ranked) and
    the general path give the base ∪ the capped floor."""
    q, k = _qk(11)
    t2 = torch.tensor([0.5, 2.0, -1.0])
    base = ThresholdDistance(t2)
    got = RowFloor(base, 4, 0.15).predict(q, k, causal=causal, sliding_window=window)
    want = base.predict(q, k, causal=causal) | _capped_reference(q, k, 4, 0.15, causal, window)
    allowed = layer_allowed(N, N, causal=causal, sliding_window=window)
    if allowed is not None:
        want &= allowed
    assert torch.equal(got, want)
    general = RowFloor(_Cached(base.predict(q, k, causal=causal)), 4, 0.15).predict(
        q, k, causal=causal, sliding_window=window)
    assert torch.equal(general, want)


def test_a_cap_that_never_binds_gives_the_uncapped_masks() -> None:
    q, k = _qk(12)
    for causal, window in LAYOUTS:
        for base in (None, ThresholdDistance(torch.tensor([0.5, 2.0, -1.0]))):
            uncapped = RowFloor(base, 1).predict(q, k, causal=causal, sliding_window=window)
            capped = RowFloor(base, 1, 1.0).predict(q, k, causal=causal, sliding_window=window)
            assert torch.equal(capped, uncapped)


@pytest.mark.parametrize("row_share", [0.0, 1.5, -0.1, True, "0.5"])
def test_a_row_share_outside_zero_one_is_refused(row_share) -> None:
    with pytest.raises(ValueError, match="row_share"):
        RowFloor(None, 2, row_share)
