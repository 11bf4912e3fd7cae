"""The Triton block-sparse kernel equals α-entmax restricted to the selected blocks (the
tensor path, in float64). Without a GPU the same kernel runs in Triton's CPU interpreter."""

from __future__ import annotations

import pytest
import torch
from tolerances import entmax_attention_tol, eps, score_bound, support_size, tau_err
from triton_runtime import device, require_triton

from sparsefinder.attention.block_sparse import (
    block_sparse_entmax,
    block_sparse_rows,
    expand_blocks,
)
from sparsefinder.attention.entmax_ops import entmax_normalize
from sparsefinder.attention.masks import layer_allowed

require_triton()
pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


@pytest.fixture
def kernel():
    """The kernel module, on the GPU where there is one, else in Triton's interpreter."""
    from sparsefinder.attention import triton_block_sparse

    return triton_block_sparse


def _inputs(n: int, heads: int = 2, d: int = 32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(heads, n, d, generator=g) * s for s in (2.0, 2.0, 1.0))
    on = device()
    return q.to(on), k.to(on), v.to(on)


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


def _single_keys(graph: torch.Tensor, block: int, n: int, width: int, seed: int):
    """Random single keys per (head, query block), with a repeat and a key inside the first
    selected block of every row (both dropped by the tensor path)."""
    heads, nb, _ = graph.shape
    keys = torch.randint(0, n, (heads, nb, width), generator=torch.Generator().manual_seed(seed))
    keys[..., 1] = keys[..., 0]
    keys[..., 2] = (graph.to(torch.int8).argmax(-1) * block + 3).clamp(max=n - 1)
    return keys


def _restricted(q64, k64, graph, block, causal, window, extra=None):
    """float64 probabilities of 1.5-entmax on the selected blocks and single keys."""
    n = q64.shape[1]
    allowed = expand_blocks(graph, block, n, n, extra)
    layer = layer_allowed(n, n, causal=causal, sliding_window=window)
    return entmax_normalize((q64 @ k64.transpose(-1, -2)) * q64.shape[-1] ** -0.5, 1.5,
                            allowed if layer is None else allowed & layer)


@pytest.mark.parametrize(("n", "block", "causal", "window", "tile"), [
    (100, 16, False, None, None), (100, 16, True, None, None), (96, 32, False, 20, None),
    (96, 32, True, 40, 32), (128, 32, True, None, None)])
def test_single_keys_are_read_as_the_tensor_path_reads_them(kernel, n, block, causal, window,
                                                            tile):
    """Blocks plus single keys (repeats and keys of a selected block count once), causal and
    local layers, one or two query tiles per block: the kernel equals the tensor path."""
    q, k, v = _inputs(n, seed=n + block)
    nb = -(-n // block)
    graph = torch.rand(2, nb, nb, generator=torch.Generator().manual_seed(block)) < 0.3
    graph |= torch.eye(nb, dtype=torch.bool)
    extra = _single_keys(graph, block, n, 9, seed=n)
    out = kernel.triton_block_sparse_entmax(q, k, v, graph.to(q.device), block, causal=causal,
                                            sliding_window=window, query_tile=tile,
                                            extra_keys=extra.to(q.device), warn_empty=False)
    q64, k64, v64 = (t.double().cpu() for t in (q, k, v))
    ref, repaired, _ = block_sparse_rows(q64, k64, v64, graph, block, causal=causal,
                                         sliding_window=window, extra_keys=extra,
                                         warn_empty=False)
    in_block = repaired.gather(-1, extra // block)
    assert bool(in_block.any()) and bool((extra[..., 1] == extra[..., 0]).all())
    probs = _restricted(q64, k64, repaired, block, causal, window, extra)
    beyond = probs * ~expand_blocks(repaired, block, n, n)
    assert float(beyond.sum()) > 0  # single keys carry probability: the test can fail
    tol = entmax_attention_tol(q.cpu(), k.cpu(), v.cpu(), probs.float())
    torch.testing.assert_close(out.double().cpu(), ref, atol=tol, rtol=0)
    without = kernel.triton_block_sparse_entmax(q, k, v, graph.to(q.device), block,
                                                causal=causal, sliding_window=window,
                                                warn_empty=False)
    assert float((without.double().cpu() - ref).abs().max()) > 10 * tol


def test_single_keys_all_inside_selected_blocks_change_nothing(kernel):
    q, k, v = _inputs(64, seed=7)
    graph = torch.eye(4, dtype=torch.bool).expand(2, 4, 4).clone()
    inside = (torch.arange(4) * 16).view(1, 4, 1) + torch.tensor([0, 5, 5, 15])
    inside = inside.expand(2, 4, 4).contiguous()
    with_keys = kernel.triton_block_sparse_entmax(q, k, v, graph, 16, extra_keys=inside)
    assert torch.equal(with_keys, kernel.triton_block_sparse_entmax(q, k, v, graph, 16))


@pytest.mark.parametrize(("causal", "window"), [(False, None), (True, 40)])
def test_the_kernel_returns_each_rows_threshold(kernel, causal, window):
    """``x* = max x + 2τ``: the threshold the tensor path derives from its probabilities
    (``x_j − p_j^{α−1}/(α−1)`` at the top key), within the scores' rounding plus twice the
    solver's τ error."""
    n, block = 96, 32
    q, k, v = _inputs(n, seed=11)
    graph = torch.rand(2, 3, 3, generator=torch.Generator().manual_seed(2)) < 0.5
    graph |= torch.eye(3, dtype=torch.bool)
    extra = _single_keys(graph, block, n, 6, seed=4)
    _, _, thresholds = kernel.triton_block_sparse_rows(
        q, k, v, graph.to(q.device), block, causal=causal, sliding_window=window,
        extra_keys=extra.to(q.device), warn_empty=False)
    q64, k64, v64 = (t.double().cpu() for t in (q, k, v))
    _, repaired, ref = block_sparse_rows(q64, k64, v64, graph, block, causal=causal,
                                         sliding_window=window, extra_keys=extra,
                                         warn_empty=False)
    kept = support_size(_restricted(q64, k64, repaired, block, causal, window, extra))
    tol = (score_bound(q.cpu(), k.cpu(), 32 ** -0.5) + 2 * tau_err(kept)
           + 2 * eps() * float(ref.abs().max()))
    assert bool(torch.isfinite(thresholds).all())
    torch.testing.assert_close(thresholds.cpu(), ref, atol=tol, rtol=0)


def test_a_query_tile_the_kernel_cannot_use_is_refused(kernel):
    q, k, v = _inputs(64)
    graph = torch.ones(2, 2, 2, dtype=torch.bool)
    for tile in (8, 24, 64):
        with pytest.raises(ValueError, match="query_tile must be a power of two"):
            kernel.triton_block_sparse_entmax(q, k, v, graph, 32, query_tile=tile)


def _rows_of_widths(widths: list[int], n: int, block: int, seed: int):
    """(diagonal block graph (2, nb, nb), single keys (2, nb, 50)): query block ``b`` of each
    head lists ``widths[b]`` distinct random keys, then repeats of a key of its own (selected)
    block, which add nothing."""
    nb = len(widths)
    graph = torch.eye(nb, dtype=torch.bool).expand(2, nb, nb).clone()
    g = torch.Generator().manual_seed(seed)
    extra = torch.stack([torch.randperm(n, generator=g)[:50] for _ in range(2 * nb)])
    listed = torch.arange(50) < torch.tensor(widths).view(1, nb, 1)
    own = (torch.arange(nb) * block).view(1, nb, 1)
    return graph, torch.where(listed, extra.view(2, nb, 50), own.expand(2, nb, 50))


def test_rows_of_different_widths_run_in_their_own_launches(kernel):
    """Rows that add no single key, a few, or many (a crowded block of the block-key
    selector) go to launches of their own tile width; together they equal the tensor path."""
    n, block, nb = 128, 16, 8
    q, k, v = _inputs(n, seed=21)
    graph, extra = _rows_of_widths([0, 3, 10, 20, 40, 50, 7, 1], n, block, seed=8)
    launches = kernel.width_classes(extra, graph.view(2 * nb, nb), 2, n, block)
    tiles = {g_max: sorted(ids.tolist()) for ids, _, _, g_max in launches}
    assert sorted(tiles) == [0, 16, 32, 64] and sum(map(len, tiles.values())) == 2 * nb
    out = kernel.triton_block_sparse_entmax(q, k, v, graph.to(q.device), block,
                                            extra_keys=extra.to(q.device))
    q64, k64, v64 = (t.double().cpu() for t in (q, k, v))
    ref = block_sparse_entmax(q64, k64, v64, graph, block, extra_keys=extra)
    probs = _restricted(q64, k64, graph, block, False, None, extra)
    tol = entmax_attention_tol(q.cpu(), k.cpu(), v.cpu(), probs.float())
    torch.testing.assert_close(out.double().cpu(), ref, atol=tol, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_a_launch_the_gpu_cannot_hold_runs_on_the_tensor_path(kernel, monkeypatch, causal):
    """A width class whose key tiles exceed the GPU's shared memory is refused by Triton
    before it runs (here: every launch of 32 single keys or more, refused as a GPU would);
    those rows come from the tensor path, the others from the kernel, and together they equal
    the tensor path, thresholds included."""
    from triton.runtime.errors import OutOfResources

    n, block = 128, 16
    q, k, v = _inputs(n, seed=23)
    graph, extra = _rows_of_widths([0, 3, 10, 20, 40, 50, 7, 45], n, block, seed=9)
    real, refused = kernel._kernel(), []

    class SmallGpu:
        def __getitem__(self, grid):
            def launch(*args, **meta):
                if meta["G_MAX"] >= 32:
                    refused.append(meta["G_MAX"])
                    raise OutOfResources(320 * 1024, 227 * 1024, "shared memory")
                return real[grid](*args, **meta)
            return launch

    monkeypatch.setattr(kernel, "_kernel", SmallGpu)
    out, _, thresholds = kernel.triton_block_sparse_rows(
        q, k, v, graph.to(q.device), block, causal=causal, extra_keys=extra.to(q.device))
    assert sorted(refused) == [32, 64]  # the two widest classes: 20 keys and 40-50 keys
    q64, k64, v64 = (t.double().cpu() for t in (q, k, v))
    ref, _, ref_thresholds = block_sparse_rows(q64, k64, v64, graph, block, causal=causal,
                                               extra_keys=extra)
    probs = _restricted(q64, k64, graph, block, causal, None, extra)
    tol = entmax_attention_tol(q.cpu(), k.cpu(), v.cpu(), probs.float())
    torch.testing.assert_close(out.double().cpu(), ref, atol=tol, rtol=0)
    kept = support_size(probs)
    tol = (score_bound(q.cpu(), k.cpu(), 32 ** -0.5) + 2 * tau_err(kept)
           + 2 * eps() * float(ref_thresholds.abs().max()))
    assert bool(torch.isfinite(thresholds).all())
    torch.testing.assert_close(thresholds.cpu(), ref_thresholds, atol=tol, rtol=0)
