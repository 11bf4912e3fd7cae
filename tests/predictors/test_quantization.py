"""Quantization(β): equal-population bins per dimension (paper §4.4)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsefinder.predictors import Predictor, Quantization


def reference_bins(x: torch.Tensor, bins: int) -> np.ndarray:
    """Bin ids from numpy's stable double argsort: independent of the implementation."""
    arr = x.numpy()
    ranks = np.argsort(np.argsort(arr, axis=1, kind="stable"), axis=1, kind="stable")
    return ranks // math.ceil(arr.shape[1] / bins)


def reference_mask(q: torch.Tensor, k: torch.Tensor, bins: int) -> torch.Tensor:
    bq, bk = reference_bins(q, bins), reference_bins(k, bins)
    return torch.from_numpy((bq[:, :, None, :] == bk[:, None, :, :]).any(-1))


def test_is_a_predictor_with_readable_repr() -> None:
    assert isinstance(Quantization(2), Predictor)
    assert repr(Quantization(3)) == "Quantization(bins=3)"


def test_n_buckets_is_r_times_bins() -> None:
    assert Quantization(3).n_buckets(4) == 12


@pytest.mark.parametrize(("n", "bins"), [(10, 6), (10, 4), (7, 7), (3, 8), (100, 32), (1, 3)])
def test_n_buckets_counts_the_bins_that_exist(n: int, bins: int) -> None:
    x = torch.randn(2, n, 4, generator=torch.Generator().manual_seed(n))
    ids = Quantization(bins).assign(x)
    existing = sum(len(torch.unique(ids[0, :, d])) for d in range(4))
    assert Quantization(bins).n_buckets(4, n_tokens=n) == existing
    assert Quantization(bins).n_buckets(4, n_tokens=0) == 0


def test_hand_computed_one_dimension() -> None:
    # queries ranked among queries: values .3 .1 .4 .2 → ranks 2 0 3 1 → bins (size 2) 1 0 1 0
    # keys ranked among keys:       values 5  7  6  8  → ranks 0 2 1 3 → bins 0 1 0 1
    q = torch.tensor([[[0.3], [0.1], [0.4], [0.2]]])
    k = torch.tensor([[[5.0], [7.0], [6.0], [8.0]]])
    quant = Quantization(2)
    assert quant.assign(q)[0, :, 0].tolist() == [1, 0, 1, 0]
    assert quant.assign(k)[0, :, 0].tolist() == [0, 1, 0, 1]
    expected = torch.tensor(
        [
            [
                [False, True, False, True],
                [True, False, True, False],
                [False, True, False, True],
                [True, False, True, False],
            ]
        ]
    )
    assert torch.equal(quant.predict(q, k), expected)


def test_hand_computed_two_heads_three_tokens_any_dimension() -> None:
    # β=2 over 3 tokens → ceil(3/2)=2 per bin: the two smallest go to bin 0, the largest to 1.
    q = torch.tensor(
        [
            [[0.0, 9.0], [1.0, 8.0], [2.0, 7.0]],  # dim0 bins 0 0 1; dim1 bins 1 0 0
            [[5.0, 5.0], [4.0, 4.0], [3.0, 3.0]],  # both dims: bins 1 0 0
        ]
    )
    k = torch.tensor(
        [
            [[2.0, 0.0], [1.0, 0.0], [0.0, 0.0]],  # dim0 bins 1 0 0; dim1 (ties) 0 0 1
            [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]],  # both dims: bins 0 0 1
        ]
    )
    expected = torch.tensor(
        [
            # q0 (0,1) q1 (0,0) q2 (1,0) vs k0 (1,0) k1 (0,0) k2 (0,1)
            [[False, True, True], [True, True, True], [True, True, False]],
            # q0 (1,1) q1 (0,0) q2 (0,0) vs k0 (0,0) k1 (0,0) k2 (1,1)
            [[False, False, True], [True, True, False], [True, True, False]],
        ]
    )
    assert torch.equal(Quantization(2).predict(q, k), expected)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60), bins=st.integers(1, 70), seed=st.integers(0, 2**16))
def test_every_bin_holds_ceil_n_over_beta_except_the_last(n, bins, seed) -> None:
    x = torch.randn(2, n, 3, generator=torch.Generator().manual_seed(seed))
    ids = Quantization(bins).assign(x)
    size = math.ceil(n / bins)
    for head in range(2):
        for d in range(3):
            counts = torch.bincount(ids[head, :, d]).tolist()
            assert len(counts) <= bins
            assert all(c == size for c in counts[:-1])
            assert 1 <= counts[-1] <= size
            assert sum(counts) == n


@settings(max_examples=40, deadline=None)
@given(
    heads=st.integers(1, 3),
    n=st.integers(1, 20),
    m=st.integers(1, 20),
    r=st.integers(1, 5),
    bins=st.integers(1, 8),
    seed=st.integers(0, 2**16),
)
def test_matches_reference(heads, n, m, r, bins, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(heads, n, r, generator=gen), torch.randn(heads, m, r, generator=gen)
    assert torch.equal(Quantization(bins).predict(q, k), reference_mask(q, k, bins))


def test_matches_reference_with_more_than_256_bins() -> None:
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 300, 2, generator=gen), torch.randn(2, 300, 2, generator=gen)
    mask = Quantization(300).predict(q, k)
    assert torch.equal(mask, reference_mask(q, k, 300))


def test_ties_are_broken_by_position_deterministically() -> None:
    x = torch.zeros(1, 4, 1)
    assert Quantization(2).assign(x)[0, :, 0].tolist() == [0, 0, 1, 1]


def test_one_bin_connects_everything() -> None:
    q, k = torch.randn(2, 5, 4), torch.randn(2, 6, 4)
    assert Quantization(1).predict(q, k).all()


def test_causal_has_no_future_edges() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 9, 4, generator=gen), torch.randn(2, 9, 4, generator=gen)
    full = Quantization(3).predict(q, k)
    causal = Quantization(3).predict(q, k, causal=True)
    assert not causal.triu(diagonal=1).any()
    assert torch.equal(causal, full.tril())


@pytest.mark.parametrize("bins", [0, -2, True, 2.5])
def test_rejects_bad_bins(bins) -> None:
    with pytest.raises(ValueError, match="bins must be an integer >= 1"):
        Quantization(bins)


def _brute_force(q: torch.Tensor, k: torch.Tensor, bins: int) -> torch.Tensor:
    model = Quantization(bins)
    bq, bk = model.assign(q), model.assign(k)
    return (bq[:, :, None, :] == bk[:, None, :, :]).any(-1)


@pytest.mark.parametrize(("n", "m", "bins"), [(257, 5, 257), (5, 257, 257), (256, 3, 256),
                                              (300, 7, 300), (7, 300, 300)])
def test_bin_ids_of_256_and_more_on_either_side(n, m, bins):
    """Ids ≥ 256 do not fit the uint8 path: whichever side holds them, no wrap-around."""
    gen = torch.Generator().manual_seed(n + m)
    q, k = torch.randn(2, n, 3, generator=gen), torch.randn(2, m, 3, generator=gen)
    assert torch.equal(Quantization(bins).predict(q, k), _brute_force(q, k, bins))


def test_empty_sides_and_assign_message():
    model = Quantization(4)
    assert model.predict(torch.zeros(2, 0, 3), torch.randn(2, 5, 3)).shape == (2, 0, 5)
    assert model.predict(torch.randn(2, 5, 3), torch.zeros(2, 0, 3)).shape == (2, 5, 0)
    with pytest.raises(ValueError, match=r"^expected x of shape \(heads, N, r\), got \(5, 3\)$"):
        model.assign(torch.zeros(5, 3))


def test_ties_are_ranked_by_position():
    x = torch.zeros(1, 6, 1)
    assert Quantization(3).assign(x)[0, :, 0].tolist() == [0, 0, 1, 1, 2, 2]
