"""The Triton block-sparse kernel equals α-entmax restricted to the selected blocks (the
tensor path, in float64). Without a GPU the same kernel runs in Triton's CPU interpreter."""

from __future__ import annotations

import os

import pytest
import torch
from tolerances import entmax_attention_tol

from sparsefinder.attention.block_sparse import block_sparse_entmax, expand_blocks
from sparsefinder.attention.entmax_ops import entmax_normalize
from sparsefinder.attention.masks import layer_allowed

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and not in Triton's interpreter (tests/conftest.py sets it)",
                allow_module_level=True)
pytest.importorskip("triton", reason="triton is not installed (requirements-dev.txt)")
pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


@pytest.fixture
def kernel():
    """The kernel module, on the GPU where there is one, else in Triton's interpreter."""
    from sparsefinder.attention import triton_block_sparse

    return triton_block_sparse


def _inputs(n: int, heads: int = 2, d: int = 32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(heads, n, d, generator=g) * s for s in (2.0, 2.0, 1.0))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return q.to(device), k.to(device), v.to(device)


@pytest.mark.parametrize(("n", "causal", "window"), [(100, False, None), (100, True, None),
                                                     (96, False, 20), (64, True, 24)])
def test_the_kernel_equals_entmax_restricted_to_the_selected_blocks(kernel, n, causal, window):
    q, k, v = _inputs(n)
    nb = -(-n // 16)
    graph = torch.rand(2, nb, nb, generator=torch.Generator().manual_seed(n)) < 0.4
    graph |= torch.eye(nb, dtype=torch.bool)
    out = kernel.triton_block_sparse_entmax(q, k, v, graph.to(q.device), 16, causal=causal,
                                            sliding_window=window)
    q64, k64, v64 = (t.double().cpu() for t in (q, k, v))
    ref = block_sparse_entmax(q64, k64, v64, graph, 16, causal=causal, sliding_window=window)
    allowed = expand_blocks(graph, 16, n, n)
    layer = layer_allowed(n, n, causal=causal, sliding_window=window)
    probs = entmax_normalize((q64 @ k64.transpose(-1, -2)) * 32 ** -0.5, 1.5,
                             allowed if layer is None else allowed & layer)
    tol = entmax_attention_tol(q.cpu(), k.cpu(), v.cpu(), probs.float())
    torch.testing.assert_close(out.double().cpu(), ref, atol=tol, rtol=0)


def test_full_selection_is_full_entmax_attention(kernel):
    q, k, v = _inputs(64, seed=3)
    out = kernel.triton_block_sparse_entmax(q, k, v, torch.ones(2, 4, 4, dtype=torch.bool,
                                                                device=q.device), 16)
    q64, k64, v64 = (t.double().cpu() for t in (q, k, v))
    probs = entmax_normalize((q64 @ k64.transpose(-1, -2)) * 32 ** -0.5, 1.5)
    tol = entmax_attention_tol(q.cpu(), k.cpu(), v.cpu(), probs.float())
    torch.testing.assert_close(out.double().cpu(), probs @ v64, atol=tol, rtol=0)


def test_a_block_the_kernel_cannot_tile_is_refused(kernel):
    q, k, v = _inputs(40)
    with pytest.raises(ValueError, match="power of two >= 16"):
        kernel.triton_block_sparse_entmax(q, k, v, torch.ones(2, 5, 5, dtype=torch.bool), 8)


def test_near_uniform_rows_converge_too(kernel):
    """Scores that barely differ: every key in the support, τ far from its start at −1 (the
    slowest case for the Newton solve), and the output still the exact one."""
    q, k, v = _inputs(128, seed=5)
    q = q * 0.05
    out = kernel.triton_block_sparse_entmax(q, k, v, torch.ones(2, 8, 8, dtype=torch.bool,
                                                                device=q.device), 16)
    q64, k64, v64 = (t.double().cpu() for t in (q, k, v))
    probs = entmax_normalize((q64 @ k64.transpose(-1, -2)) * 32 ** -0.5, 1.5)
    assert float((probs > 0).sum(-1).double().mean()) > 64  # most keys kept
    tol = entmax_attention_tol(q.cpu(), k.cpu(), v.cpu(), probs.float())
    torch.testing.assert_close(out.double().cpu(), probs @ v64, atol=tol, rtol=0)
