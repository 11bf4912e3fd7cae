"""Distance(t): edge iff ||q'_i - k'_j|| <= t (paper §4.3)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerances import bound

from sparsefinder.predictors import Distance, Predictor
from sparsefinder.predictors.distance import pairwise_sq_dist

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

# Head 0 uses a 3-4-5 triangle so every distance below is exact in float32.
Q = torch.tensor(
    [
        [[0.0, 0.0], [3.0, 4.0], [1.0, 0.0]],
        [[0.0, 0.0], [0.0, 2.0], [0.0, 4.0]],
    ]
)
K = torch.tensor(
    [
        [[0.0, 0.0], [0.0, 1.0], [3.0, 4.0]],
        [[0.0, 1.0], [0.0, 3.0], [0.0, 9.0]],
    ]
)


def reference(q: torch.Tensor, k: torch.Tensor, t: float) -> torch.Tensor:
    return (q[:, :, None, :] - k[:, None, :, :]).double().norm(dim=-1) <= t


def test_is_a_predictor_with_readable_repr() -> None:
    assert isinstance(Distance(1.0), Predictor)
    assert repr(Distance(1.5)) == "Distance(threshold=1.5)"


def test_hand_computed_small_example() -> None:
    # head 0 distances: [[0, 1, 5], [5, sqrt 18, 0], [1, sqrt 2, sqrt 20]]
    # head 1 distances: [[1, 3, 9], [1, 1, 7], [3, 1, 5]]
    expected_t1 = torch.tensor(
        [
            [[True, True, False], [False, False, True], [True, False, False]],
            [[True, False, False], [True, True, False], [False, True, False]],
        ]
    )
    assert torch.equal(Distance(1.0).predict(Q, K), expected_t1)
    expected_t5 = torch.tensor(
        [
            [[True, True, True], [True, True, True], [True, True, True]],
            [[True, True, False], [True, True, False], [True, True, True]],
        ]
    )
    assert torch.equal(Distance(5.0).predict(Q, K), expected_t5)
    expected_t0 = torch.zeros(2, 3, 3, dtype=torch.bool)
    expected_t0[0, 0, 0] = expected_t0[0, 1, 2] = True  # identical points only
    assert torch.equal(Distance(0.0).predict(Q, K), expected_t0)


def test_output_shape_and_dtype_for_n_not_m() -> None:
    q, k = torch.randn(3, 5, 4), torch.randn(3, 7, 4)
    mask = Distance(2.0).predict(q, k)
    assert mask.shape == (3, 5, 7)
    assert mask.dtype == torch.bool


def _sq_dist_err(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(heads, n, m) bound on two float32 evaluations of |q − k|² (directly, or expanded as
    |q|² + |k|² − 2·q·k, which cancels): r + 3 roundings at the magnitude of the expansion's
    terms, (|q| + |k|)²."""
    norms = q.double().norm(dim=-1)[:, :, None] + k.double().norm(dim=-1)[:, None, :]
    return bound(1.0, terms=q.shape[-1] + 3) * norms.square()


@settings(max_examples=40, deadline=None)
@given(
    heads=st.integers(1, 3),
    n=st.integers(1, 12),
    m=st.integers(1, 12),
    r=st.integers(1, 6),
    t=st.floats(0.0, 4.0),
    seed=st.integers(0, 2**16),
)
def test_matches_brute_force_away_from_the_boundary(heads, n, m, r, t, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(heads, n, r, generator=gen), torch.randn(heads, m, r, generator=gen)
    sq = (q[:, :, None, :] - k[:, None, :, :]).double().square().sum(-1)
    # float32 squared distances are within _sq_dist_err of the exact ones: only pairs that
    # close to t² may land on either side
    clear = (sq - t * t).abs() > _sq_dist_err(q, k)
    assert torch.equal(Distance(t).predict(q, k)[clear], reference(q, k, t)[clear])


@settings(max_examples=30, deadline=None)
@given(t1=st.floats(0.0, 5.0), t2=st.floats(0.0, 5.0), seed=st.integers(0, 2**16))
def test_larger_threshold_never_removes_edges(t1, t2, seed) -> None:
    lo, hi = sorted((t1, t2))
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 10, 4, generator=gen), torch.randn(2, 10, 4, generator=gen)
    small, large = Distance(lo).predict(q, k), Distance(hi).predict(q, k)
    assert not (small & ~large).any()


def test_causal_has_no_future_edges_and_keeps_the_past() -> None:
    q = torch.zeros(2, 6, 4)
    k = torch.zeros(2, 6, 4)  # every pair at distance 0
    mask = Distance(0.5).predict(q, k, causal=True)
    assert torch.equal(mask, torch.ones(2, 6, 6, dtype=torch.bool).tril())


def test_rejects_negative_threshold_with_a_fix() -> None:
    with pytest.raises(ValueError, match=r"threshold must be >= 0"):
        Distance(-0.1)
    with pytest.raises(ValueError, match="threshold"):
        Distance(float("nan"))


def test_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="agree on heads"):
        Distance(1.0).predict(torch.zeros(2, 3, 4), torch.zeros(3, 3, 4))


def test_pairwise_sq_dist_is_non_negative_and_matches_brute_force() -> None:
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 6, 4, generator=gen), torch.randn(2, 5, 4, generator=gen)
    q[0, 0] = k[0, 0] = 1e3  # identical large points: the expansion cancels badly here
    dist = pairwise_sq_dist(q, k)
    assert (dist >= 0).all()
    brute = (q[:, :, None, :] - k[:, None, :, :]).pow(2).sum(-1)
    assert ((dist - brute).abs() <= _sq_dist_err(q, k)).all()


def test_threshold_exactly_at_a_distance_keeps_the_pair() -> None:
    """``<=``: a key at distance exactly t is an edge; t = 0 keeps only coinciding points.

    Integer coordinates make every squared distance exact in float32 (3-4-5 triangles)."""
    q = torch.tensor([[[0.0, 0.0], [3.0, 4.0]]])
    k = torch.tensor([[[0.0, 0.0], [3.0, 4.0], [6.0, 8.0], [0.0, 5.0]]])
    # distances: q0 → 0, 5, 10, 5;  q1 → 5, 0, 5, √10
    assert Distance(0.0).predict(q, k).tolist() == [[[True, False, False, False],
                                                    [False, True, False, False]]]
    assert Distance(5.0).predict(q, k).tolist() == [[[True, True, False, True],
                                                    [True, True, True, True]]]
    just_below = Distance(torch.nextafter(torch.tensor(5.0), torch.tensor(0.0)).item())
    assert just_below.predict(q, k).tolist() == [[[True, False, False, False],
                                                  [False, True, False, True]]]
    assert Distance(10.0).predict(q, k).all()
    assert not Distance(0.0).predict(q + 0.5, k).any()
    with pytest.raises(ValueError, match=r"^threshold must be >= 0, got nan; pass a "
                                         r"non-negative distance$"):
        Distance(float("nan"))
    assert Distance(-0.0).predict(q, k).tolist() == Distance(0.0).predict(q, k).tolist()


def test_half_precision_inputs_are_compared_in_float32() -> None:
    gen = torch.Generator().manual_seed(9)
    q = (torch.randn(2, 30, 4, generator=gen) * 30).to(torch.bfloat16)
    k = (torch.randn(2, 20, 4, generator=gen) * 30).to(torch.bfloat16)
    for t in (5.0, 20.0, 40.0):
        assert torch.equal(Distance(t).predict(q, k), Distance(t).predict(q.float(), k.float()))
    assert pairwise_sq_dist(q, k).dtype == torch.float32
