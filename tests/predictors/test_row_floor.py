"""The per-row floor: every query keeps its m nearest allowed keys on top of a base graph."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.attention.masks import layer_allowed
from sparsefinder.methods.spec import PredictorSpec, predict_layer
from sparsefinder.predictors import Distance, Window
from sparsefinder.predictors.row_floor import RowFloor
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
    spec = PredictorSpec.of("distance-floor", {"threshold": 0.0, "floor": 3})
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
        PredictorSpec.of("distance-floor:budget", {"target_sparsity": 0.9, "floor": 0})
    with pytest.raises(ValueError, match="missing"):
        PredictorSpec.of("distance-floor:budget", {"target_sparsity": 0.9})
