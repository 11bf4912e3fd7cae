"""Block-sparse entmax attention: equal to dense entmax restricted to the block graph.

The block path multiplies gathered blocks where the dense reference multiplies whole heads:
their scores round differently by at most the product's bound, which bounds how far their
probabilities and outputs may be apart (:func:`_out_tol`, from tests/tolerances.py). Both run
in float64, where that bound is tight enough that any key lost or added shows."""

from __future__ import annotations

import pytest
import torch
from tolerances import entmax_attention_tol, tol_for

from sparsefinder.attention.block_sparse import (
    block_sparse_entmax,
    expand_blocks,
    repair_block_graph,
)
from sparsefinder.attention.entmax_ops import entmax_normalize
from sparsefinder.attention.masks import RestrictionWarning
from sparsefinder.metrics.measures import block_graph

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


def _qkv(heads=3, n=300, d=16, seed=0, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(heads, n, d, generator=g, dtype=torch.float64) * s
                 for s in (scale, scale, 1.0))


def _out_tol(q, k, v, probs=None) -> float:
    """How far two correct evaluations of 1.5-entmax attention on (q, k, v) may be apart."""
    return entmax_attention_tol(q, k, v, probs)


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
    probs, ref = _dense(q, k, v, expand_blocks(graph, block, n, n), causal)
    torch.testing.assert_close(out, ref, atol=_out_tol(q, k, v, probs), rtol=0)


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
    torch.testing.assert_close(out, ref, atol=_out_tol(q, k, v, probs), rtol=0)


def test_an_empty_query_block_keeps_its_diagonal_with_a_warning():
    q, k, v = _qkv(n=128)
    graph = torch.eye(4, dtype=torch.bool).repeat(3, 1, 1)
    graph[1, 2] = False
    with pytest.warns(RestrictionWarning, match=r"1 query blocks \(heads \[1\]\)"):
        out = block_sparse_entmax(q, k, v, graph, 32)
    ref = block_sparse_entmax(q, k, v, torch.eye(4, dtype=torch.bool).repeat(3, 1, 1), 32)
    torch.testing.assert_close(out, ref, atol=_out_tol(q, k, v), rtol=0)
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
    probs, ref = _dense(q, k, v, expand_blocks(graph, block, n, n, extra), causal)
    torch.testing.assert_close(out, ref, atol=_out_tol(q, k, v, probs), rtol=0)
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
    torch.testing.assert_close(gpu.cpu(), cpu, atol=_out_tol(q, k, v), rtol=0)


def _dense_windowed(q, k, v, mask, causal, window):
    from sparsefinder.attention.masks import layer_allowed

    n = q.shape[1]
    allowed = mask & layer_allowed(n, n, causal=causal, sliding_window=window)
    probs = entmax_normalize((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5, 1.5, allowed)
    return probs, probs @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n", "block", "window"), [(300, 32, 40), (70, 16, 5), (128, 32, 1)])
def test_a_local_layer_never_attends_outside_its_window(causal, n, block, window):
    """Keys of a selected block (and extra keys) beyond the window get probability 0: the
    result is dense entmax over (expanded graph ∧ the layer's window)."""
    q, k, v = _qkv(n=n)
    nb = -(-n // block)
    graph = torch.rand(3, nb, nb, generator=torch.Generator().manual_seed(1)) < 0.5
    graph |= torch.eye(nb, dtype=torch.bool)  # every row sees its own key: no repair
    extra = torch.zeros(3, nb, 2, dtype=torch.int64)
    extra[..., 1] = n - 1  # the first and last tokens: outside most rows' windows
    out = block_sparse_entmax(q, k, v, graph, block, causal=causal, sliding_window=window,
                              extra_keys=extra)
    mask = expand_blocks(graph, block, n, n, extra_keys=extra)
    probs, ref = _dense_windowed(q, k, v, mask, causal, window)
    torch.testing.assert_close(out, ref, atol=_out_tol(q, k, v, probs), rtol=0)
    # the window changes the answer (it is not ignored)
    unwindowed = block_sparse_entmax(q, k, v, graph, block, causal=causal, extra_keys=extra)
    assert float((out - unwindowed).abs().max()) > _out_tol(q, k, v, probs)


@pytest.mark.parametrize("causal", [False, True])
def test_a_query_block_whose_rows_see_no_selected_block_gets_its_diagonal(causal):
    """Selected blocks all outside some rows' window: those blocks are dropped and the
    query block keeps its diagonal block (with a warning), never an empty entmax row."""
    n, block, window = 128, 32, 8
    q, k, v = _qkv(n=n)
    graph = torch.zeros(3, 4, 4, dtype=torch.bool)
    graph[:, 3, 0] = True  # query block 3 only selects key block 0: far out of its window
    graph[:, :3] |= torch.eye(4, dtype=torch.bool)[:3]
    graph[:, 2, 1] = True  # block 1 is inside the window of block 2's first rows only
    with pytest.warns(RestrictionWarning, match=r"3 query blocks \(heads \[0, 1, 2\]\)"):
        repaired = repair_block_graph(graph, causal=causal, sliding_window=window, n=n,
                                      block=block)
    assert not repaired[:, 3, 0].any() and repaired[:, 3, 3].all()  # dropped; diagonal added
    assert repaired[:, 2, 1].all()  # in reach of some row of block 2: kept
    with pytest.warns(RestrictionWarning):
        out = block_sparse_entmax(q, k, v, graph, block, causal=causal, sliding_window=window)
    probs, ref = _dense_windowed(q, k, v, expand_blocks(repaired, block, n, n), causal, window)
    torch.testing.assert_close(out, ref, atol=_out_tol(q, k, v, probs), rtol=0)
    assert torch.isfinite(out).all()


def test_a_bad_sliding_window_is_refused_by_name():
    q, k, v = _qkv(n=64)
    graph = torch.ones(3, 2, 2, dtype=torch.bool)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="sliding_window must be an integer >= 1"):
            block_sparse_entmax(q, k, v, graph, 32, sliding_window=bad)
    with pytest.raises(ValueError, match="needs n and block"):
        repair_block_graph(graph, causal=True, sliding_window=4)


@pytest.mark.parametrize("causal", [False, True])
def test_float16_inputs_are_solved_in_float32_and_match_the_dense_path(causal):
    """Half inputs (the GPU benchmarks' fp16): the −1e9 mask overflowed float16 before; now
    the scores are solved in float32, as the Triton kernel does."""
    q, k, v = (t.to(torch.float16) for t in _qkv(n=130))
    n, block = 130, 32
    nb = -(-n // block)
    graph = torch.rand(3, nb, nb, generator=torch.Generator().manual_seed(5)) < 0.4
    graph |= torch.eye(nb, dtype=torch.bool)
    out = block_sparse_entmax(q, k, v, graph, block, causal=causal)
    assert out.dtype == torch.float16
    probs, ref = _dense(*(t.double() for t in (q, k, v)), expand_blocks(graph, block, n, n),
                        causal)
    torch.testing.assert_close(out.double(), ref, rtol=0,
                               atol=_out_tol(q, k, v, probs.to(torch.float16)))


@pytest.mark.parametrize("budget", [1, 1 << 27])  # a row per chunk; one chunk (a GPU's size)
def test_chunking_never_changes_the_result(monkeypatch, budget):
    from sparsefinder.attention import block_sparse

    q, k, v = _qkv(n=150)
    nb = -(-150 // 32)
    g = torch.Generator().manual_seed(8)
    graph = (torch.rand(3, nb, nb, generator=g) < 0.3) | torch.eye(nb, dtype=torch.bool)
    extra = torch.randint(0, 150, (3, nb, 7), generator=g)
    monkeypatch.setattr(block_sparse, "_CHUNK_SCORES", budget)
    out = block_sparse_entmax(q, k, v, graph, 32, causal=True, extra_keys=extra)
    probs, ref = _dense(q, k, v, expand_blocks(graph, 32, 150, 150, extra), True)
    torch.testing.assert_close(out, ref, atol=_out_tol(q, k, v, probs), rtol=0)


def test_a_gpu_scores_in_large_chunks():
    """Every chunked path keeps its own cache-sized chunk on a CPU and takes large ones on a
    GPU, where a chunk costs kernel launches rather than cache misses."""
    from sparsefinder.attention.block_sparse import _CHUNK_SCORES, GPU_CHUNK_SCORES, chunk_scores

    assert chunk_scores(torch.device("cpu"), _CHUNK_SCORES) == _CHUNK_SCORES
    assert chunk_scores(torch.device("cuda"), _CHUNK_SCORES) == GPU_CHUNK_SCORES > _CHUNK_SCORES


@pytest.mark.parametrize("causal", [False, True])
def test_rows_of_different_widths_each_compute_on_their_own_keys(causal, monkeypatch):
    """A few rows add many single keys, the rest few or none (their columns repeat a key):
    with chunks of a few rows, each chunk as wide as its widest row, the output equals dense
    entmax on the expanded mask."""
    import sparsefinder.attention.block_sparse as block_sparse

    monkeypatch.setattr(block_sparse, "_CHUNK_SCORES", 32 * 400)  # two or more rows a chunk
    q, k, v = _qkv(n=200)
    n, block = 200, 32
    nb = -(-n // block)
    g = torch.Generator().manual_seed(5)
    graph = torch.eye(nb, dtype=torch.bool).expand(3, nb, nb).clone()
    graph[:, 3, 2:] = True  # a row wider in blocks than the rows wide in single keys
    extra = torch.randint(0, n, (3, nb, 40), generator=g)
    extra[:, 1:, 3:] = extra[:, 1:, :1]  # only query block 0 keeps its 40
    extra[1, 2:, :] = 2 * block + 1  # head 1: most blocks add one key
    out = block_sparse_entmax(q, k, v, graph, block, causal=causal, extra_keys=extra)
    probs, ref = _dense(q, k, v, expand_blocks(graph, block, n, n, extra), causal)
    torch.testing.assert_close(out, ref, atol=_out_tol(q, k, v, probs), rtol=0)


def test_compact_single_keys_moves_each_rows_new_keys_to_its_front():
    from sparsefinder.attention.block_sparse import compact_single_keys

    selected = torch.tensor([[True, False, False], [False, True, False]])
    extra = torch.tensor([[3, 3, 20, 40, 41], [5, 5, 5, 5, 5]]).sort(-1).values
    single, counts = compact_single_keys(extra, selected, 16)
    assert counts.tolist() == [3, 1]  # row 0: 3 is in its block 0 and 3 repeats; row 1: 5
    assert single.tolist() == [[20, 40, 41, 0, 0], [5, 0, 0, 0, 0]]


def test_only_computes_just_the_query_blocks_asked_for():
    """``only``: those query blocks as the whole call computes them (up to the rounding of
    other chunkings), the others' thresholds NaN."""
    from sparsefinder.attention.block_sparse import block_sparse_rows

    q, k, v = _qkv(heads=2, n=100)
    block, nb = 16, 7
    graph = torch.rand(2, nb, nb, generator=torch.Generator().manual_seed(1)) < 0.4
    extra = torch.randint(0, 100, (2, nb, 5), generator=torch.Generator().manual_seed(2))
    whole, _, thresholds = block_sparse_rows(q, k, v, graph, block, extra_keys=extra,
                                             warn_empty=False)
    ids = torch.tensor([0, 6, 9, 13])  # head 0: blocks 0 and 6 (the partial last); head 1: 2, 6
    part, _, part_thresholds = block_sparse_rows(q, k, v, graph, block, extra_keys=extra,
                                                 warn_empty=False, only=ids)
    asked = torch.zeros(2 * nb, dtype=torch.bool)
    asked[ids] = True
    asked = asked.view(2, nb).repeat_interleave(block, 1)[:, :100]
    torch.testing.assert_close(part[asked], whole[asked], atol=_out_tol(q, k, v), rtol=0)
    # a threshold is a score (d products) minus a power of a probability
    torch.testing.assert_close(part_thresholds[asked], thresholds[asked],
                               **tol_for(thresholds[asked], terms=q.shape[-1] + 2))
    assert bool(part_thresholds[~asked].isnan().all())
