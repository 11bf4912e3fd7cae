"""The compiled distance pass: the threshold test, each row's floor and the allowed keys in
one loop, equal to the definition on every layout.

The vectors are small integers, so every squared distance is an integer that float32 holds
exactly whatever the order of the sums: the comparisons below are exact on every CPU.
Thresholds are half-integers, so no distance lies on one."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.attention.masks import allowed_key_range, layer_allowed
from sparsefinder.predictors import Distance, distance_pass
from sparsefinder.predictors.row_floor import RowFloor, floor_counts
from sparsefinder.predictors.threshold_distance import ThresholdDistance

_COMPILED = distance_pass.applies(torch.zeros(1, 1, 1), torch.zeros(1, 1, 1))
# numerical: re-run under other CPU kernels (make test-portable)
pytestmark = [pytest.mark.numerical,
              pytest.mark.skipif(not _COMPILED, reason="numba is not importable")]

# (n, m, causal, sliding window): full, causal, a key prefix, local causal / bidirectional,
# an odd number of rows (the last row is paired with itself)
LAYOUTS = [(24, 24, False, None), (24, 24, True, None), (17, 29, True, None),
           (23, 23, True, 5), (22, 22, False, 4), (1, 9, False, None)]


def _integer_qk(heads: int, n: int, m: int, rank: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-3, 4, (heads, n, rank), generator=gen).float()
    k = torch.randint(-3, 4, (heads, m, rank), generator=gen).float()
    return q, k


def _reference(q, k, sq_thresholds, causal, window) -> tuple[torch.Tensor, torch.Tensor]:
    """(threshold mask restricted to the allowed keys, squared distances) in float64."""
    d2 = (q.double()[:, :, None] - k.double()[:, None]).pow(2).sum(-1)
    mask = d2 <= sq_thresholds.double()[:, None, None]
    allowed = layer_allowed(q.shape[1], k.shape[1], causal=causal, sliding_window=window)
    return (mask if allowed is None else mask & allowed), d2


@pytest.mark.parametrize(("n", "m", "causal", "window"), LAYOUTS)
@pytest.mark.parametrize("rank", [3, 8, 11])
def test_the_threshold_pass_is_the_definition(n, m, causal, window, rank) -> None:
    q, k = _integer_qk(3, n, m, rank, seed=n + rank)
    t2 = torch.tensor([10.5, 30.5, -0.5])  # head 2 keeps nothing
    got = distance_pass.threshold_pass(q, k, t2, causal=causal, sliding_window=window)
    want, _ = _reference(q, k, t2, causal, window)
    assert got.dtype == torch.bool and torch.equal(got, want)


@pytest.mark.parametrize(("n", "m", "causal", "window"), LAYOUTS)
@pytest.mark.parametrize(("floor", "rank"), [(1, 8), (4, 8), (4, 11)])
def test_a_short_row_gets_its_nearest_allowed_keys(n, m, causal, window, floor, rank) -> None:
    q, k = _integer_qk(3, n, m, rank, seed=7 * n + floor)
    t2 = torch.tensor([20.5, 40.5, -0.5])
    _, per_row = allowed_key_range(n, m, causal=causal, sliding_window=window)
    wanted = floor_counts(floor, None, per_row)
    got = distance_pass.threshold_pass(q, k, t2, causal=causal, sliding_window=window,
                                       floor=wanted)
    threshold, d2 = _reference(q, k, t2, causal, window)
    allowed = layer_allowed(n, m, causal=causal, sliding_window=window)
    allowed = torch.ones(n, m, dtype=torch.bool) if allowed is None else allowed
    assert not (got & ~allowed).any()
    assert (got | ~threshold).all()  # every pair within the threshold is kept
    for h in range(3):
        for i in range(n):
            kept = got[h, i]
            extra = kept & ~threshold[h, i]
            if int(threshold[h, i].sum()) >= int(wanted[i]):
                assert not extra.any()  # a row that meets its floor keeps nothing more
                continue
            assert int(kept.sum()) == int(wanted[i])  # the floor's count, no more
            others = allowed[i] & ~kept
            if others.any() and extra.any():  # the added keys are the nearest (ties allowed)
                assert d2[h, i][extra].max() <= d2[h, i][others].min()


@pytest.mark.parametrize(("m", "floor"), [(64, 5), (64, 1), (37, 12), (12, 12), (200, 12)])
def test_a_short_rows_floor_is_its_nearest_keys_ties_to_the_lower_key(m, floor) -> None:
    """Exactly the row's ``floor`` smallest distances, equal ones taken in key order (a
    stable sort in float64 is the reference): small integers make many ties, so the bound
    that skips far keys must keep every key the ordering can still reach."""
    q, k = _integer_qk(4, 9, m, 5, seed=m + floor)
    t2 = torch.full((4,), -0.5)  # no key within the threshold: every row is short
    got = distance_pass.threshold_pass(q, k, t2, floor=torch.full((9,), floor))
    _, d2 = _reference(q, k, t2, False, None)
    nearest = d2.sort(dim=-1, stable=True).indices[..., :floor]
    want = torch.zeros_like(got).scatter_(-1, nearest, True)
    assert torch.equal(got, want)


def test_nan_distances_are_never_nearer_than_a_number() -> None:
    """A key with a NaN coordinate is not among a row's nearest while enough keys have a
    distance; a NaN query (no distance at all) keeps its first ``floor`` keys."""
    q, k = _integer_qk(1, 3, 40, 4, seed=5)
    k[0, 1] = float("nan")  # the nearest key of no row
    q[0, 2] = float("nan")
    got = distance_pass.threshold_pass(q, k, torch.tensor([-0.5]), floor=torch.full((3,), 6))
    assert not got[0, :2, 1].any() and int(got[0, :2].sum()) == 12
    _, d2 = _reference(q[:, :2], k, torch.tensor([-0.5]), False, None)
    d2[..., 1] = float("inf")
    nearest = d2.sort(dim=-1, stable=True).indices[..., :6]
    assert torch.equal(got[:, :2], torch.zeros_like(got[:, :2]).scatter_(-1, nearest, True))
    assert got[0, 2].tolist() == [True] * 6 + [False] * 34


def test_the_predictors_take_the_pass_and_agree_with_their_tensor_form() -> None:
    """Distance, ThresholdDistance and RowFloor(distance) run the pass on a CPU; their
    tensor-op forms (float64 input) give the same graph on integer data."""
    q, k = _integer_qk(4, 20, 20, 6, seed=3)
    t2 = torch.tensor([9.5, 15.5, 25.5, 4.5])
    for causal in (False, True):
        assert torch.equal(ThresholdDistance(t2).predict(q, k, causal=causal),
                           ThresholdDistance(t2).predict(q.double(), k.double(), causal=causal))
        assert torch.equal(Distance(3.5).predict(q, k, causal=causal),
                           Distance(3.5).predict(q.double(), k.double(), causal=causal))
    floored = RowFloor(ThresholdDistance(t2), 3, row_share=0.5)
    fast = floored.predict(q, k, causal=True, sliding_window=6)
    slow = floored.predict(q.double(), k.double(), causal=True, sliding_window=6)
    assert torch.equal(fast.sum(-1), slow.sum(-1))  # ties may pick other keys, not more


def test_what_the_pass_does_not_take() -> None:
    q = torch.zeros(2, 4, distance_pass.MAX_RANK + 1)
    assert not distance_pass.applies(q, q)  # rank above MAX_RANK: the tensor path
    assert not distance_pass.applies(q[..., :4].double(), q[..., :4].double())
    assert distance_pass.applies(q[..., :4], q[..., :4])


def test_heads_split_over_threads_give_the_same_graph() -> None:
    q, k = _integer_qk(5, 512, 512, 8, seed=11)  # above the size that is split
    t2 = torch.full((5,), 40.5)
    floor = torch.full((512,), 3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = distance_pass.threshold_pass(q, k, t2, floor=floor)
        torch.set_num_threads(2)
        split = distance_pass.threshold_pass(q, k, t2, floor=floor)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, split)
