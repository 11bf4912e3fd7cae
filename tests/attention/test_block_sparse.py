"""Block-sparse entmax attention: equal to dense entmax restricted to the block graph."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.attention.block_sparse import (
    block_sparse_entmax,
    expand_blocks,
    repair_block_graph,
)
from sparsefinder.attention.entmax_ops import entmax_normalize
from sparsefinder.attention.masks import RestrictionWarning
from sparsefinder.metrics.measures import block_graph


def _qkv(heads=3, n=300, d=16, seed=0, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(heads, n, d, generator=g) * s for s in (scale, scale, 1.0))


def _dense(q, k, v, mask, causal):
    n = q.shape[1]
    if causal:
        mask = mask & torch.ones(n, n, dtype=torch.bool).tril()
    probs = entmax_normalize((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5, 1.5, mask)
    return probs, probs @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n", "block"), [(300, 32), (256, 64), (70, 16)])
def test_equals_dense_entmax_restricted_to_the_expanded_graph(causal, n, block):
    q, k, v = _qkv(n=n)
    nb = -(-n // block)
    graph = torch.rand(3, nb, nb, generator=torch.Generator().manual_seed(1)) < 0.3
    graph |= torch.eye(nb, dtype=torch.bool)  # no repair needed here
    out = block_sparse_entmax(q, k, v, graph, block, causal=causal)
    _, ref = _dense(q, k, v, expand_blocks(graph, block, n, n), causal)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_exact_full_attention_when_the_graph_covers_the_gold_tiles(causal):
    """Sparse-consistency: block recall 1 ⇒ the output of full α-entmax attention."""
    q, k, v = _qkv(n=256, scale=4.0)  # peaked scores: sparse gold graphs
    n = q.shape[1]
    full = torch.ones(n, n, dtype=torch.bool)
    probs, ref = _dense(q, k, v, full, causal)
    tiles = block_graph(probs > 0, 16)
    assert not bool(tiles.all())  # a real restriction
    out = block_sparse_entmax(q, k, v, tiles, 16, causal=causal)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


def test_an_empty_query_block_keeps_its_diagonal_with_a_warning():
    q, k, v = _qkv(n=128)
    graph = torch.eye(4, dtype=torch.bool).repeat(3, 1, 1)
    graph[1, 2] = False
    with pytest.warns(RestrictionWarning, match=r"1 query blocks \(heads \[1\]\)"):
        out = block_sparse_entmax(q, k, v, graph, 32)
    ref = block_sparse_entmax(q, k, v, torch.eye(4, dtype=torch.bool).repeat(3, 1, 1), 32)
    torch.testing.assert_close(out, ref)
    # Causal: a query block that selects only future blocks is empty too.
    future = torch.zeros(3, 4, 4, dtype=torch.bool)
    future[:, 0, 3] = True
    future[:, 1:, 0] = True
    repaired = repair_block_graph(future, causal=True, warn=False)
    assert repaired[:, 0].tolist() == [[True, False, False, False]] * 3


def test_bad_shapes_are_errors():
    q, k, v = _qkv(n=64)
    with pytest.raises(ValueError, match=r"block_graph must be bool \(heads=3, 2, 2\)"):
        block_sparse_entmax(q, k, v, torch.ones(3, 4, 4, dtype=torch.bool), 32)
    with pytest.raises(ValueError, match="same heads and n"):
        block_sparse_entmax(q, k[:, :10], v, torch.ones(3, 2, 2, dtype=torch.bool), 32)


@pytest.mark.parametrize("causal", [False, True])
def test_extra_single_keys_count_once_and_match_the_dense_path(causal):
    q, k, v = _qkv(n=200)
    n, block = 200, 32
    nb = -(-n // block)
    g = torch.Generator().manual_seed(3)
    graph = torch.rand(3, nb, nb, generator=g) < 0.25
    graph |= torch.eye(nb, dtype=torch.bool)
    extra = torch.randint(0, n, (3, nb, 12), generator=g)
    extra[..., 1] = extra[..., 0]  # a repeat
    extra[..., 2] = 5  # in block 0, often selected too
    out = block_sparse_entmax(q, k, v, graph, block, causal=causal, extra_keys=extra)
    _, ref = _dense(q, k, v, expand_blocks(graph, block, n, n, extra), causal)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match=r"extra_keys must be key positions in \[0, 200\)"):
        block_sparse_entmax(q, k, v, graph, block, extra_keys=extra + n)
    with pytest.raises(ValueError, match=r"extra_keys must be int64 \(heads=3"):
        block_sparse_entmax(q, k, v, graph, block, extra_keys=extra[0])


@pytest.mark.cuda
def test_block_sparse_attention_on_cuda_matches_the_cpu():
    q, k, v = _qkv(n=300)
    nb = -(-300 // 32)
    graph = torch.rand(3, nb, nb, generator=torch.Generator().manual_seed(1)) < 0.3
    extra = torch.randint(0, 300, (3, nb, 8), generator=torch.Generator().manual_seed(2))
    cpu = block_sparse_entmax(q, k, v, graph, 32, causal=True, extra_keys=extra,
                              warn_empty=False)
    gpu = block_sparse_entmax(q.cuda(), k.cuda(), v.cuda(), graph.cuda(), 32, causal=True,
                              extra_keys=extra.cuda(), warn_empty=False)
    assert gpu.is_cuda
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-4, rtol=1e-4)
