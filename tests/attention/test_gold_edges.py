"""Bounded-memory gold extraction: same edges as the dense path, bounded memory, clear limits."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from sparsefinder.attention.entmax_ops import entmax_normalize
from sparsefinder.attention.gold_edges import (
    ExtractionMemoryError,
    GoldEdges,
    entmax_edges,
    plan_blocks,
)

REPO = Path(__file__).resolve().parents[2]


def _qk(heads: int, n: int, d: int = 32, scale: float = 1.5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(heads, n, d, generator=g) * scale,
            torch.randn(heads, n, d, generator=g) * scale,
            torch.randn(heads, n, d, generator=g))


def _dense(q, k, causal, allowed=None):
    n, m = q.shape[1], k.shape[1]
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        tri = torch.ones(n, m, dtype=torch.bool).tril(m - n)
        allowed = tri if allowed is None else allowed & tri
    return entmax_normalize(scores, 1.5, allowed)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("budget_mib", [1, 80, 512])  # query blocks of one head / head groups
def test_same_edges_as_the_dense_path_at_n_1024(causal, budget_mib):
    q, k, v = _qk(12, 1024)
    probs = _dense(q, k, causal)
    dense = GoldEdges.from_probs(probs)
    edges, out = entmax_edges(q, k, q.shape[-1] ** -0.5, causal=causal, value=v,
                              budget_mib=budget_mib)
    assert edges.nnz == dense.nnz > 0
    assert torch.equal(edges.indptr, dense.indptr)
    assert torch.equal(edges.indices, dense.indices)
    torch.testing.assert_close(edges.values, dense.values, atol=1e-6, rtol=0)
    torch.testing.assert_close(out, probs @ v, atol=1e-5, rtol=1e-5)
    assert torch.equal(edges.to_dense(), probs > 0)


@pytest.mark.parametrize("slab", [7, 1000, 4096])  # slabs smaller than, near, over a block's
def test_edges_spread_over_several_slabs_equal_the_dense_path(monkeypatch, slab):
    """Long inputs fill several slabs (~8 M edges each); here tiny slabs force a layer's edges
    across many of them, including blocks larger than a slab and slabs left part-full."""
    from sparsefinder.attention import gold_edges

    monkeypatch.setattr(gold_edges._EdgeStore, "SLAB", slab)
    q, k, v = _qk(4, 256, seed=3)
    for causal in (False, True):
        probs = _dense(q, k, causal)
        dense = GoldEdges.from_probs(probs)
        edges, out = entmax_edges(q, k, q.shape[-1] ** -0.5, causal=causal, value=v,
                                  budget_mib=1)
        assert dense.nnz > 3 * slab or slab == 4096
        assert torch.equal(edges.indptr, dense.indptr)
        assert torch.equal(edges.indices, dense.indices)
        torch.testing.assert_close(edges.values, dense.values, atol=1e-6, rtol=0)
        torch.testing.assert_close(out, probs @ v, atol=1e-5, rtol=1e-5)


def test_the_edge_store_joins_its_slabs_in_order():
    from sparsefinder.attention.gold_edges import _EdgeStore

    store = _EdgeStore(torch.device("cpu"))
    store.SLAB = 5
    chunks = [torch.arange(a, b, dtype=torch.int32) for a, b in ((0, 3), (3, 4), (4, 16),
                                                                  (16, 16), (16, 23))]
    for chunk in chunks:
        store.append(chunk, chunk.float() / 2)
    assert len(store.slabs) > 2
    indices, values = store.finish()
    assert torch.equal(indices, torch.arange(23, dtype=torch.int32))
    assert torch.equal(values, torch.arange(23).float() / 2)


def test_padding_mask_and_prefix_keys():
    q, k, _ = _qk(4, 300)
    q = q[:, 100:]  # 200 queries over 300 keys: the keys include a 100-token prefix
    allowed = torch.ones(1, 200, 300, dtype=torch.bool)
    allowed[..., 250:] = False  # padding keys
    for causal in (False, True):
        probs = _dense(q, k, causal, allowed[0])
        edges, _ = entmax_edges(q, k, q.shape[-1] ** -0.5, causal=causal, allowed=allowed,
                                budget_mib=0.05)
        assert torch.equal(edges.to_dense(), probs > 0)
        assert not edges.to_dense()[..., 250:].any()


def test_gold_edges_accessors_round_trip():
    probs = _dense(*_qk(3, 64)[:2], causal=False)
    edges = GoldEdges.from_probs(probs)
    torch.testing.assert_close(edges.probs(), probs)
    keys, values = edges.row(2, 5)
    assert torch.equal(keys, (probs[2, 5] > 0).nonzero().squeeze(1))
    torch.testing.assert_close(values, probs[2, 5][keys])
    assert torch.equal(edges.row_counts(), (probs > 0).sum(-1))
    assert edges.density == pytest.approx(float((probs > 0).float().mean()))
    assert edges.nbytes == 8 * edges.nnz + 8 * (3 * 64 + 1)


def test_plan_blocks_fits_the_budget():
    assert plan_blocks(12, 512, 512, 256) == (12, 512)  # 12 × 8 MiB  # the whole layer fits
    heads, rows = plan_blocks(12, 8192, 8192, 256)
    assert heads == 1 and rows * 8192 * 32 <= 256 * 2**20
    heads, rows = plan_blocks(12, 1024, 1024, 80)
    assert 1 < heads < 12 and rows == 1024


def test_a_budget_too_small_for_one_row_names_the_limit():
    q, k, _ = _qk(2, 4096, d=8)
    with pytest.raises(ExtractionMemoryError, match=r"m <= 2048 keys.*raise budget_mib"):
        entmax_edges(q, k, 1.0, budget_mib=4096 * 32 / 2**20 / 2)


def test_an_edge_store_over_its_cap_names_the_token_limit():
    q, k, _ = _qk(12, 512, scale=0.1)  # flat scores: dense gold graphs
    with pytest.raises(ExtractionMemoryError, match=r"limit is about n=\d+ tokens"):
        entmax_edges(q, k, 1.0, max_edge_mib=1, budget_mib=1)


def test_bad_shapes_and_alpha_are_errors():
    q, k, _ = _qk(2, 8)
    with pytest.raises(ValueError, match="same heads and d"):
        entmax_edges(q, k[:1], 1.0)
    with pytest.raises(ValueError, match="alpha must be > 1"):
        entmax_edges(q, k, 1.0, alpha=1.0)
    with pytest.raises(ValueError, match="must be > 0"):
        entmax_edges(q, k, 1.0, budget_mib=0)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_peak_memory_is_bounded_by_the_budget_not_n_squared():
    """n=4096, 12 heads: dense scores alone are 768 MiB; the blocked pass stays near its budget.

    Peak RSS (VmHWM, reset just before the call) in a fresh process, so torch's allocations
    are counted, not only Python's.
    """
    script = textwrap.dedent("""
        import torch
        from sparsefinder.attention.entmax_ops import entmax15_fast
        from sparsefinder.attention.gold_edges import entmax_edges
        def rss(field):
            for line in open('/proc/self/status'):
                if line.startswith(field):
                    return int(line.split()[1]) / 1024
        g = torch.Generator().manual_seed(0)
        q = torch.randn(12, 4096, 32, generator=g) * 1.5
        k = torch.randn(12, 4096, 32, generator=g) * 1.5
        # Compile the CPU row solver first: numba's one-off JIT memory is not the pass's.
        entmax15_fast(torch.randn(64, 600, generator=g))
        open('/proc/self/clear_refs', 'w').write('5')
        base = rss('VmRSS')
        edges, _ = entmax_edges(q, k, 32 ** -0.5, causal=True, budget_mib=64)
        print(rss('VmHWM') - base, edges.nbytes / 2**20)
    """)
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, check=True, timeout=300).stdout.split()
    extra, edge_mib = float(out[0]), float(out[1])
    assert extra < 64 * 1.25 + edge_mib + 16, (extra, edge_mib)


@pytest.mark.slow
def test_capture_edges_on_a_model_matches_dense_extraction(default_model):
    from sparsefinder.attention.interface import capture_edges, restrict_keys
    from sparsefinder.data.records import extract, extract_edges

    text = "The committee met on Tuesday. It approved the budget, which the mayor had vetoed. " * 6
    dense = extract(default_model, text)[0]
    long = extract_edges(default_model, text, budget_mib=1)
    assert long.n_tokens == dense.n_tokens and len(long.layers) == len(dense.layers)
    # Layer 0 sees identical inputs: identical edges. Later layers see the blocked output of
    # the layers before, equal up to float rounding, so their edges agree up to a few ties.
    assert torch.equal(long.layers[0].edges.to_dense(), dense.layers[0].gold)
    for ours, ref in zip(long.layers, dense.layers, strict=True):
        gold = ours.edges.to_dense()
        agree = (gold == ref.gold).float().mean()
        assert agree > 0.9999
        torch.testing.assert_close(ours.queries, ref.queries, atol=1e-4, rtol=1e-4)
    ids = default_model.tokenizer("hello there", return_tensors="pt")["input_ids"]
    with pytest.raises(ValueError, match="cannot be combined"), torch.inference_mode(), \
            capture_edges(lambda call: None), \
            restrict_keys(lambda module, q, k, allowed, causal, scaling: allowed):
        default_model.model(input_ids=ids)


@pytest.mark.slow
def test_extract_edges_rejects_a_text_longer_than_the_model(default_model):
    from sparsefinder.data.records import TextInputError, extract_edges

    with pytest.raises(TextInputError, match="more than the model's maximum of 512"):
        extract_edges(default_model, "word " * 600)


@pytest.mark.cuda
def test_extraction_on_cuda_matches_the_cpu():
    q, k, v = _qk(12, 1024)
    cpu, out_cpu = entmax_edges(q, k, q.shape[-1] ** -0.5, causal=True, value=v, budget_mib=8)
    gpu, out_gpu = entmax_edges(q.cuda(), k.cuda(), q.shape[-1] ** -0.5, causal=True,
                                value=v.cuda(), budget_mib=8)
    assert gpu.indices.is_cuda and out_gpu.is_cuda
    assert torch.equal(gpu.to("cpu").to_dense(), cpu.to_dense())
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, atol=1e-4, rtol=1e-4)
