"""Bit-packed gold supports: the same pairs as the CSR edges, block by block, in 1/64 of
their bytes at long n, with the edge cap applied to the bits."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.attention.gold_edges import ExtractionMemoryError, entmax_edges
from sparsefinder.attention.support_bits import SupportBits

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


def _qk(heads: int, n: int, m: int | None = None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    return (torch.randn(heads, n, 16, generator=g) * 1.5,
            torch.randn(heads, m, 16, generator=g) * 1.5,
            torch.randn(heads, m, 8, generator=g))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n", "m", "budget_mib"), [(300, 300, 0.05), (300, 300, 64),
                                                    (123, 251, 0.02), (64, 61, 1)])
def test_bits_hold_exactly_the_pairs_of_the_edges(causal, n, m, budget_mib):
    """Both forms come from the same blocks (head groups, or query blocks of one head when
    the budget is small; m not a multiple of 8; keys before the queries when m > n)."""
    q, k, v = _qk(3, n, m)
    scaling = 16 ** -0.5
    edges, out_edges = entmax_edges(q, k, scaling, causal=causal, value=v,
                                    budget_mib=budget_mib)
    bits, out_bits = entmax_edges(q, k, scaling, causal=causal, value=v, budget_mib=budget_mib,
                                  form="bits")
    assert isinstance(bits, SupportBits) and bits.bits.dtype == torch.uint8
    assert bits.bits.shape == (3, n, -(-m // 8))
    dense = edges.to_dense()
    assert torch.equal(bits.to_dense(), dense)
    assert torch.equal(bits.to_dense(head=1), dense[1])
    assert bits.nnz == edges.nnz > 0 and torch.equal(bits.row_counts(), edges.row_counts())
    assert bits.density == pytest.approx(edges.density)
    assert torch.equal(out_bits, out_edges)
    assert torch.equal(SupportBits.from_mask(dense).bits, bits.bits)


def test_padding_keys_never_enter_the_support():
    q, k, _ = _qk(2, 40)
    allowed = torch.ones(1, 40, 40, dtype=torch.bool)
    allowed[..., 33:] = False  # padding keys
    bits, _ = entmax_edges(q, k, 0.25, allowed=allowed, form="bits", budget_mib=0.01)
    edges, _ = entmax_edges(q, k, 0.25, allowed=allowed, budget_mib=0.01)
    assert torch.equal(bits.to_dense(), edges.to_dense())
    assert not bool(bits.to_dense()[..., 33:].any())


def test_bits_over_the_cap_name_the_token_limit_and_a_bad_form_is_named():
    q, k, _ = _qk(4, 512)
    with pytest.raises(ExtractionMemoryError, match=r"bit-packed support .* n=512.*about n=\d+"):
        entmax_edges(q, k, 0.25, form="bits", max_edge_mib=0.05)
    with pytest.raises(ValueError, match="form must be 'edges'"):
        entmax_edges(q, k, 0.25, form="dense")


def test_the_bits_are_64_times_smaller_than_edges_at_one_edge_in_eight():
    """Why the form exists: 8 bytes an edge against one bit a pair."""
    q, k, _ = _qk(2, 256)
    bits, _ = entmax_edges(q, k, 0.25, form="bits")
    assert bits.nbytes == 2 * 256 * 256 // 8
    edges, _ = entmax_edges(q, k, 0.25)
    assert edges.nbytes > bits.nbytes  # this random graph keeps more than one pair in 64


@pytest.mark.cuda
def test_bits_on_cuda_stay_on_the_device_and_equal_its_edges():
    """On the GPU as on a CPU both forms come from the same blocks (the CUDA edges against the
    CPU's: tests/attention/test_gold_edges.py)."""
    q, k, _ = (t.cuda() for t in _qk(4, 1024))
    bits, _ = entmax_edges(q, k, 0.25, causal=True, form="bits", budget_mib=8)
    edges, _ = entmax_edges(q, k, 0.25, causal=True, budget_mib=8)
    assert bits.bits.is_cuda
    assert torch.equal(bits.to_dense(), edges.to_dense())
