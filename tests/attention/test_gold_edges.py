"""Bounded-memory gold extraction: same edges as the dense path, bounded memory, clear limits.

The blocked pass multiplies blocks of q by k where the dense path multiplies whole heads, so
their scores may round differently (by at most the product's bound, tests/tolerances.py).
Edges are compared edge for edge except keys that close to the threshold (probability at
rounding level on both sides, :func:`tolerances.support_bound`), probabilities and outputs
within what that score difference allows. The comparisons run on float64 q and k, where those
bounds are tight; the edge store keeps float32 probabilities (one more rounding).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tolerances import (
    assert_same_support,
    attention_output_tol,
    entmax_prob_tol,
    eps,
    score_bound,
    support_bound,
    support_size,
    tol_for,
    transformer_terms,
)

from sparsefinder.attention.entmax_ops import entmax_normalize
from sparsefinder.attention.gold_edges import (
    ExtractionMemoryError,
    GoldEdges,
    entmax_edges,
    plan_blocks,
)

REPO = Path(__file__).resolve().parents[2]


def _qk(heads: int, n: int, d: int = 32, scale: float = 1.5, seed: int = 0,
        dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(heads, n, d, generator=g, dtype=dtype) * scale,
            torch.randn(heads, n, d, generator=g, dtype=dtype) * scale,
            torch.randn(heads, n, d, generator=g, dtype=dtype))


def _dense(q, k, causal, allowed=None):
    n, m = q.shape[1], k.shape[1]
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        tri = torch.ones(n, m, dtype=torch.bool).tril(m - n)
        allowed = tri if allowed is None else allowed & tri
    return entmax_normalize(scores, 1.5, allowed)


def _check_same_edges(edges: GoldEdges, probs: torch.Tensor, q, k, scaling: float,
                      out=None, v=None) -> None:
    """``edges`` are the gold graph of dense ``probs`` up to rounding of the scores: a canonical
    row-major CSR, the same support except keys on the threshold, close probabilities and
    outputs (tolerances from the product's bound, see the module docstring)."""
    dtype = q.dtype
    score_err = score_bound(q, k, scaling)
    ours = edges.probs().to(dtype)
    m = support_size(ours, probs)
    rebuilt = GoldEdges.from_probs(ours)  # the CSR is the canonical one of its dense graph
    assert torch.equal(edges.indptr, rebuilt.indptr)
    assert torch.equal(edges.indices, rebuilt.indices)
    slack = support_bound(score_err, 1.5, m, dtype)
    assert_same_support(ours, probs, slack=slack)
    prob_err = entmax_prob_tol(score_err, 1.5, m, dtype)
    stored = eps(edges.values.dtype)  # the edge store's rounding of p ≤ 1
    torch.testing.assert_close(ours, probs, atol=prob_err + stored, rtol=0)
    if out is not None:
        torch.testing.assert_close(out, probs @ v,
                                   atol=attention_output_tol(prob_err, probs, v, slack), rtol=0)


@pytest.mark.numerical
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("budget_mib", [1, 80, 512])  # query blocks of one head / head groups
def test_same_edges_as_the_dense_path_at_n_1024(causal, budget_mib):
    q, k, v = _qk(12, 1024, dtype=torch.float64)
    probs = _dense(q, k, causal)
    dense = GoldEdges.from_probs(probs)
    edges, out = entmax_edges(q, k, q.shape[-1] ** -0.5, causal=causal, value=v,
                              budget_mib=budget_mib)
    assert dense.nnz > 0 and edges.nnz > 0
    _check_same_edges(edges, probs, q, k, q.shape[-1] ** -0.5, out, v)


@pytest.mark.numerical
@pytest.mark.parametrize("slab", [7, 1000, 4096])  # slabs smaller than, near, over a block's
def test_edges_spread_over_several_slabs_equal_the_dense_path(monkeypatch, slab):
    """Long inputs fill several slabs (~8 M edges each); here tiny slabs force a layer's edges
    across many of them, including blocks larger than a slab and slabs left part-full."""
    from sparsefinder.attention import gold_edges

    monkeypatch.setattr(gold_edges._EdgeStore, "SLAB", slab)
    q, k, v = _qk(4, 256, seed=3, dtype=torch.float64)
    for causal in (False, True):
        probs = _dense(q, k, causal)
        dense = GoldEdges.from_probs(probs)
        edges, out = entmax_edges(q, k, q.shape[-1] ** -0.5, causal=causal, value=v,
                                  budget_mib=1)
        assert dense.nnz > 3 * slab or slab == 4096
        _check_same_edges(edges, probs, q, k, q.shape[-1] ** -0.5, out, v)


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


@pytest.mark.numerical
def test_padding_mask_and_prefix_keys():
    q, k, _ = _qk(4, 300, dtype=torch.float64)
    q = q[:, 100:]  # 200 queries over 300 keys: the keys include a 100-token prefix
    allowed = torch.ones(1, 200, 300, dtype=torch.bool)
    allowed[..., 250:] = False  # padding keys
    for causal in (False, True):
        probs = _dense(q, k, causal, allowed[0])
        edges, _ = entmax_edges(q, k, q.shape[-1] ** -0.5, causal=causal, allowed=allowed,
                                budget_mib=0.05)
        _check_same_edges(edges, probs, q, k, q.shape[-1] ** -0.5)
        assert not edges.to_dense()[..., 250:].any()


def test_gold_edges_accessors_round_trip():
    probs = _dense(*_qk(3, 64)[:2], causal=False)
    edges = GoldEdges.from_probs(probs)
    assert torch.equal(edges.probs(), probs)  # the same float32 values, moved: exact
    keys, values = edges.row(2, 5)
    assert torch.equal(keys, (probs[2, 5] > 0).nonzero().squeeze(1))
    assert torch.equal(values, probs[2, 5][keys])
    assert torch.equal(edges.row_counts(), (probs > 0).sum(-1))
    assert edges.density == pytest.approx(float((probs > 0).double().mean()))  # float64
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

    Measured in a fresh process (torch's allocations counted, not only Python's) as the growth
    of peak RSS (VmHWM, reset just before the call) over the RSS before it. Its margin is the
    allocator's own noise, removed or measured rather than guessed:

    - glibc's malloc is pinned (``MALLOC_MMAP_THRESHOLD_`` etc. below): blocks over 128 KiB
      are mapped and unmapped at once, so RSS follows the live tensors, not glibc's dynamic
      thresholds, which let the heap keep up to twice the largest freed block (identical runs
      measured 55-68 MiB unpinned, 37.5 MiB every time pinned);
    - library pages faulted in during the call (the growth of RssFile: code that torch and
      numba touch first here, more of it when other processes squeezed the page cache) are
      not the pass's memory and are subtracted;
    - the fixed cost of running the pass at all (thread pools, first-use buffers, what glibc
      keeps of small allocations) is measured in the same process on a short input whose
      blocks need 1 MiB, and allowed once.

    The bound is then the budget, 25% over it for blocks rounded to whole query rows, plus the
    edges kept (they are the output) plus that measured fixed cost.
    """
    script = textwrap.dedent("""
        import torch
        from sparsefinder.attention.entmax_ops import entmax15_fast
        from sparsefinder.attention.gold_edges import entmax_edges
        FIELDS = ('VmRSS', 'VmHWM', 'RssFile')
        def status():
            out = {}
            for line in open('/proc/self/status'):
                key, _, value = line.partition(':')
                if key in FIELDS:
                    out[key] = int(value.split()[0]) / 1024
            return out
        def measure(run):
            open('/proc/self/clear_refs', 'w').write('5')  # VmHWM := VmRSS
            before = status()
            result = run()
            after = status()
            paged_in = max(0.0, after['RssFile'] - before['RssFile'])
            return after['VmHWM'] - before['VmRSS'] - paged_in, result
        g = torch.Generator().manual_seed(0)
        q = torch.randn(12, 4096, 32, generator=g) * 1.5
        k = torch.randn(12, 4096, 32, generator=g) * 1.5
        small = torch.randn(2, 128, 32, generator=g) * 1.5
        # Compile the CPU row solver first: numba's one-off JIT memory is not the pass's.
        entmax15_fast(torch.randn(64, 600, generator=g))
        fixed, _ = measure(lambda: entmax_edges(small, small, 32 ** -0.5, causal=True,
                                                budget_mib=64))
        extra, (edges, _) = measure(lambda: entmax_edges(q, k, 32 ** -0.5, causal=True,
                                                         budget_mib=64))
        print(extra, edges.nbytes / 2**20, fixed)
    """)
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
           "MALLOC_MMAP_THRESHOLD_": str(128 << 10), "MALLOC_TRIM_THRESHOLD_": str(128 << 10),
           "MALLOC_TOP_PAD_": "0", "MALLOC_ARENA_MAX": "1"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, check=True, timeout=300).stdout.split()
    extra, edge_mib, fixed = (float(x) for x in out)
    assert 0 <= fixed < 64, fixed  # a pass on 1 MiB of blocks: no budget-sized cost in it
    assert extra < 64 * 1.25 + edge_mib + fixed, (extra, edge_mib, fixed)


@pytest.mark.slow
@pytest.mark.numerical
def test_capture_edges_on_a_model_matches_dense_extraction(default_model, default_model64):
    """The model in float64 (a copy): the blocked and the dense passes differ by float64
    rounding only, carried through the layers before (tests/tolerances.py), so their edges
    agree except keys within that of the threshold and their queries to that bound (plus the
    records' one rounding to float32)."""
    from sparsefinder.attention.interface import capture_edges, restrict_keys
    from sparsefinder.data.records import extract, extract_edges

    model64 = default_model64
    config = model64.model.config
    text = "The committee met on Tuesday. It approved the budget, which the mayor had vetoed. " * 6
    dense = extract(model64, text)[0]
    long = extract_edges(model64, text, budget_mib=1)
    assert long.n_tokens == dense.n_tokens and len(long.layers) == len(dense.layers)
    n = dense.n_tokens
    for layer, (ours, ref) in enumerate(zip(long.layers, dense.layers, strict=True)):
        # the layers before (none for layer 0) and this layer's query/key projection
        terms = transformer_terms(layers=layer, hidden=config.hidden_size,
                                  intermediate=config.intermediate_size, n=n) + config.hidden_size
        q_err = tol_for(ref.queries, terms=terms, dtype=torch.float64)["atol"]
        k_err = tol_for(ref.keys, terms=terms, dtype=torch.float64)["atol"]
        score_err = score_bound(ref.queries, ref.keys, ref.scaling, q_err=q_err, k_err=k_err,
                                dtype=torch.float64)
        s = support_size(ours.edges.probs(), ref.probs())
        assert_same_support(ours.edges.probs(), ref.probs(),
                            slack=support_bound(score_err, 1.5, s, torch.float64))
        stored = tol_for(ref.queries, dtype=torch.float32)["atol"]  # each rounded to float32
        torch.testing.assert_close(ours.queries, ref.queries, atol=q_err + stored, rtol=0)
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
@pytest.mark.numerical
def test_extraction_on_cuda_matches_the_cpu():
    q, k, v = _qk(12, 1024)
    cpu, out_cpu = entmax_edges(q, k, q.shape[-1] ** -0.5, causal=True, value=v, budget_mib=8)
    gpu, out_gpu = entmax_edges(q.cuda(), k.cuda(), q.shape[-1] ** -0.5, causal=True,
                                value=v.cuda(), budget_mib=8)
    assert gpu.indices.is_cuda and out_gpu.is_cuda
    # the GPU's products round differently (float32, no TF32: torch's default for matmul)
    score_err = score_bound(q, k, q.shape[-1] ** -0.5)
    ours, ref = gpu.to("cpu").probs(), cpu.probs()
    s = support_size(ours, ref)
    slack = support_bound(score_err, 1.5, s)
    assert_same_support(ours, ref, slack=slack)
    prob_err = entmax_prob_tol(score_err, 1.5, s)
    torch.testing.assert_close(out_gpu.cpu(), out_cpu,
                               atol=attention_output_tol(prob_err, ref, v, slack), rtol=0)
