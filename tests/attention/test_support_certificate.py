"""Exact block-sparse entmax: the per-row threshold, the exact check of the unselected keys
against it, the pooled score bound, and the output exact on every row (certified rows on their
own support, the others recomputed)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from tolerances import entmax_attention_tol, eps, score_bound, support_size, tau_err

from sparsefinder.attention.block_sparse import block_sparse_rows, expand_blocks
from sparsefinder.attention.entmax_ops import entmax_normalize
from sparsefinder.attention.masks import layer_allowed
from sparsefinder.attention.support_certificate import (
    BYTES_PER_SCORE,
    block_score_bounds,
    exact_block_sparse_entmax,
    on_their_support,
    unselected_max,
)
from sparsefinder.metrics.measures import block_graph

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


def _qkv(n: int, scale: float = 1.5, heads: int = 3, d: int = 16):
    g = torch.Generator().manual_seed(n)
    return tuple(torch.randn(heads, n, d, generator=g, dtype=torch.float64) * s
                 for s in (scale, scale, 1.0))


def _full_attention(q, k, v, allowed):
    """Dense α-entmax (1.5) over the allowed pairs: probabilities and output."""
    probs = entmax_normalize((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5, 1.5, allowed)
    return probs, probs @ v


@pytest.mark.parametrize(("n", "block"), [(70, 16), (64, 16)])
def test_the_block_bound_is_above_every_score_of_the_block(n, block):
    q, k, _ = _qkv(n=n)
    scaling = q.shape[-1] ** -0.5
    bounds = block_score_bounds(q, k, block, scaling)
    scores = (q @ k.transpose(-1, -2)) * scaling
    nb = bounds.shape[-1]
    pad = torch.nn.functional.pad(scores, (0, nb * block - n), value=-torch.inf)
    block_max = pad.view(*scores.shape[:2], nb, block).amax(-1)
    assert bool((bounds >= block_max).all())
    assert bool((bounds < block_max + 10 * scores.abs().max()).all())  # a bound, not ∞


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_each_rows_threshold_separates_its_support_from_the_rest(alpha):
    """With every block selected the rows are the full rows: a key has probability > 0 iff its
    score is above the row's threshold x* = τ/(α−1)."""
    q, k, v = _qkv(n=96, scale=3.0)
    nb = 96 // 16
    everything = torch.ones(3, nb, nb, dtype=torch.bool)
    _, _, thresholds = block_sparse_rows(q, k, v, everything, 16, alpha=alpha)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    probs = entmax_normalize(scores, alpha)
    gap = 1e-9 * scores.abs().max()
    above = scores > thresholds.unsqueeze(-1) + gap
    below = scores < thresholds.unsqueeze(-1) - gap
    assert bool((above <= (probs > 0)).all()) and bool((below <= (probs == 0)).all())


@pytest.mark.parametrize(("causal", "window", "piece"), [
    (False, None, None), (True, None, None), (True, 40, None), (False, 40, None),
    (True, None, 4), (False, 40, 8)])
def test_every_row_is_exact_whatever_the_selector_missed(causal, window, piece):
    """A poor block graph: the rows whose support it misses fall back, so the output equals
    full α-entmax everywhere; a certified row never misses a key of its true support."""
    q, k, v = _qkv(n=160, scale=3.0)
    n, block = 160, 16
    nb = n // block
    graph = torch.rand(3, nb, nb, generator=torch.Generator().manual_seed(3)) < 0.25
    graph |= torch.eye(nb, dtype=torch.bool)
    out, cert = exact_block_sparse_entmax(q, k, v, graph, block, causal=causal,
                                          sliding_window=window, bound=piece is not None,
                                          piece=piece)
    allowed = layer_allowed(n, n, causal=causal, sliding_window=window)
    full = torch.ones(n, n, dtype=torch.bool) if allowed is None else allowed
    probs, ref = _full_attention(q, k, v, full)
    torch.testing.assert_close(out, ref, atol=entmax_attention_tol(q, k, v, probs), rtol=0)
    covered = expand_blocks(graph, block, n, n)
    missed = ((probs > 0) & ~covered).any(-1)  # rows the selection alone gets wrong
    assert bool(missed.any()), "the test graph should miss some rows' keys"
    assert not bool((cert.certified & missed).any())  # never vouches for a wrong row
    assert cert.fallback_rows >= int(missed.sum())
    assert bool((cert.by_bound <= cert.certified).all())


def test_selecting_every_gold_tile_certifies_rows_and_the_full_graph_certifies_all():
    q, k, v = _qkv(n=256, scale=4.0)  # peaked scores: sparse gold graphs
    n = q.shape[1]
    probs, ref = _full_attention(q, k, v, torch.ones(n, n, dtype=torch.bool))
    tiles = block_graph(probs > 0, 16)
    out, cert = exact_block_sparse_entmax(q, k, v, tiles, 16)
    torch.testing.assert_close(out, ref, atol=entmax_attention_tol(q, k, v, probs), rtol=0)
    assert cert.certified_fraction > 0.0
    everything = torch.ones_like(tiles)
    _, cert_all = exact_block_sparse_entmax(q, k, v, everything, 16)
    assert cert_all.fallback_rows == 0


def _selection_and_layer(n: int, block: int, causal: bool, window, heads: int = 3,
                         crowded: bool = False):
    """A poor block graph with single keys: some rows' supports fit it, others do not.
    ``crowded``: a few query blocks list 40 single keys, the others 5 (their other columns
    repeat their first key), as a selector's crowded blocks do."""
    g = torch.Generator().manual_seed(n + block)
    nb = -(-n // block)
    graph = (torch.rand(heads, nb, nb, generator=g) < 0.3) | torch.eye(nb, dtype=torch.bool)
    extra = torch.randint(0, n, (heads, nb, 40 if crowded else 5), generator=g)
    if crowded:
        few = torch.rand(heads, nb, 1, generator=g) < 0.7
        extra[..., 5:] = torch.where(few, extra[..., :1], extra[..., 5:])
    return graph, extra, {"causal": causal, "sliding_window": window}


@pytest.mark.parametrize(("causal", "window", "crowded"), [
    (False, None, False), (True, None, False), (True, 40, False), (False, 40, False),
    (False, None, True), (True, 40, True)])
def test_unselected_max_is_the_best_score_outside_the_selection(causal, window, crowded):
    """Each row's highest visible score among the keys neither its blocks nor its single keys
    cover, in chunks of a few rows as in one go, and for the rows asked only; with a few
    query blocks listing many more single keys than the others too."""
    q, k, _ = _qkv(n=150, scale=2.0)
    n, block = 150, 16
    graph, extra, layer = _selection_and_layer(n, block, causal, window, crowded=crowded)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    outside = ~expand_blocks(graph, block, n, n, extra)
    visible = layer_allowed(n, n, **layer)
    if visible is not None:
        outside &= visible
    expected = scores.masked_fill(~outside, -torch.inf).amax(-1)
    got = unselected_max(q, k, graph, block, extra_keys=extra, **layer)
    few_rows = 4 * n * BYTES_PER_SCORE / 2**20
    chunked = unselected_max(q, k, graph, block, extra_keys=extra, budget_mib=few_rows, **layer)
    asked = torch.rand(3, n, generator=torch.Generator().manual_seed(1)) < 0.5
    some = unselected_max(q, k, graph, block, extra_keys=extra, rows=asked, **layer)
    assert bool(torch.isnan(some[~asked]).all())
    torch.testing.assert_close(some[asked], got[asked], rtol=0,
                               atol=score_bound(q, k, q.shape[-1] ** -0.5))
    none_outside = ~outside.any(-1)
    assert not bool(none_outside.all())
    for result in (got, chunked):
        assert torch.equal(torch.isinf(result), none_outside)
        torch.testing.assert_close(result[~none_outside].double(), expected[~none_outside],
                                   rtol=0, atol=score_bound(q, k, q.shape[-1] ** -0.5))


@pytest.mark.parametrize(("causal", "window"), [(False, None), (True, None), (True, 40),
                                                (False, 40)])
def test_the_check_passes_exactly_the_rows_whose_selection_holds_their_support(causal, window):
    """Sparse-consistency both ways: a row passes iff no key of its full support lies outside
    its selection. Rows with an unselected score within rounding of the threshold may go
    either way (their key's probability is at rounding level); there should be none here."""
    q, k, v = _qkv(n=160, scale=3.0)
    n, block = 160, 16
    graph, extra, layer = _selection_and_layer(n, block, causal, window)
    visible = layer_allowed(n, n, **layer)
    probs, ref = _full_attention(q, k, v, torch.ones(n, n, dtype=torch.bool)
                                 if visible is None else visible)
    out, cert = exact_block_sparse_entmax(q, k, v, graph, block, extra_keys=extra, **layer)
    _, repaired, thresholds = block_sparse_rows(q, k, v, graph, block, extra_keys=extra,
                                                **layer)
    missed = ((probs > 0) & ~expand_blocks(repaired, block, n, n, extra)).any(-1)
    worst = unselected_max(q, k, repaired, block, extra_keys=extra, **layer).double()
    kept = support_size(probs)
    near = (worst - thresholds).abs() <= 2 * score_bound(q, k, q.shape[-1] ** -0.5) + 2 * (
        tau_err(kept, torch.float64))
    assert not bool(near.any())
    assert bool(missed.any()) and not bool(missed.all())
    assert torch.equal(cert.certified, ~missed)
    assert cert.by_bound is not None and not bool(cert.by_bound.any())  # no bound asked
    torch.testing.assert_close(out, ref, atol=entmax_attention_tol(q, k, v, probs), rtol=0)


def test_the_bound_spares_the_check_where_keys_cluster():
    """Keys in tight clusters, one cluster per block: the pooled bound vouches for rows by
    itself, only the rest are checked, and the verdicts and the output are those without it."""
    g = torch.Generator().manual_seed(5)
    n, block, d = 128, 16, 16
    centres = torch.randn(1, n // block, 1, d, generator=g, dtype=torch.float64) * 3
    k = (centres + 0.01 * torch.randn(1, n // block, block, d, generator=g,
                                      dtype=torch.float64)).view(1, n, d)
    q = torch.randn(1, n, d, generator=g, dtype=torch.float64) * 3
    v = torch.randn(1, n, d, generator=g, dtype=torch.float64)
    probs, _ = _full_attention(q, k, v, torch.ones(n, n, dtype=torch.bool))
    tiles = block_graph(probs > 0, block)
    with_bound, cert = exact_block_sparse_entmax(q, k, v, tiles, block, bound=True)
    without, plain = exact_block_sparse_entmax(q, k, v, tiles, block)
    assert cert.bound_fraction > 0.5 and plain.bound_fraction == 0.0
    assert bool((cert.by_bound <= cert.certified).all())
    assert torch.equal(cert.certified, plain.certified)
    torch.testing.assert_close(with_bound, without, rtol=0,
                               atol=entmax_attention_tol(q, k, v, probs))


def test_softmax_has_no_threshold_to_certify():
    q, k, v = _qkv(n=32)
    with pytest.raises(ValueError, match="α > 1"):
        exact_block_sparse_entmax(q, k, v, torch.ones(3, 2, 2, dtype=torch.bool), 16,
                                  alpha=1.0)


def test_a_planted_miss_is_caught_and_the_row_made_exact():
    """Every gold tile selected but one, which holds a gold key of some rows: those rows'
    τ on the selection is wrong; the certificate flags them and the output is exact."""
    q, k, v = _qkv(n=128, scale=4.0)
    n, block = 128, 16
    probs, ref = _full_attention(q, k, v, torch.ones(n, n, dtype=torch.bool))
    tiles = block_graph(probs > 0, block)
    off = [(h, i, j) for h in range(3) for i in range(n // block) for j in range(n // block)
           if i != j and bool(tiles[h, i, j])]
    h, i, j = off[0]
    tiles[h, i, j] = False  # the planted miss
    missed = (probs[h, i * block:(i + 1) * block, j * block:(j + 1) * block] > 0).any(-1)
    assert bool(missed.any())
    out, cert = exact_block_sparse_entmax(q, k, v, tiles, block)
    flagged = ~cert.certified[h, i * block:(i + 1) * block]
    assert bool((flagged | ~missed).all())  # every row that lost a gold key is flagged
    torch.testing.assert_close(out, ref, atol=entmax_attention_tol(q, k, v, probs), rtol=0)


needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None
    or (not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="triton, on a GPU or in its interpreter (tests/conftest.py sets TRITON_INTERPRET)")


def _planted_miss(q, n: int, block: int, probs):
    """Every gold tile selected but one off-diagonal tile holding gold keys of some rows."""
    tiles = block_graph(probs > 0, block)
    h, i, j = next((h, i, j) for h in range(q.shape[0]) for i in range(n // block)
                   for j in range(n // block) if i != j and bool(tiles[h, i, j]))
    tiles[h, i, j] = False
    missed = (probs[h, i * block:(i + 1) * block, j * block:(j + 1) * block] > 0).any(-1)
    assert bool(missed.any())
    return tiles, (h, i, missed)


def _assert_kernel_certifies_as_float64(cert, q, k, v, graph, block, **layer):
    """The kernel's certified rows lie between those the float64 check certifies with the
    thresholds moved down and up by the kernel's tolerance (the scores' rounding, twice the
    solver's τ error, the sum's rounding): a wrong threshold, a wrong unselected maximum or a
    mis-wired one shows up as a row outside the sandwich."""
    q64, k64, v64 = (t.double() for t in (q, k, v))
    _, repaired, thresholds = block_sparse_rows(q64, k64, v64, graph, block, **layer)
    kept = support_size(_block_sparse_probs(q64, k64, repaired, block, layer))
    tol = (2 * score_bound(q, k, q.shape[-1] ** -0.5) + 2 * tau_err(kept)
           + 2 * eps() * float(thresholds.abs().max()))
    worst = unselected_max(q64, k64, repaired, block, **layer)
    low = on_their_support(worst, thresholds - tol)
    high = on_their_support(worst, thresholds + tol)
    certified = cert.certified.cpu()
    assert bool((low <= certified).all()) and bool((certified <= high).all())
    assert bool(low.any()) and not bool(high.all())  # the sandwich has two sides


def _block_sparse_probs(q64, k64, graph, block, layer):
    """float64 1.5-entmax on the selected blocks and single keys of ``graph``."""
    n = q64.shape[1]
    allowed = expand_blocks(graph, block, n, n, layer.get("extra_keys"))
    mask = layer_allowed(n, n, causal=layer.get("causal", False),
                         sliding_window=layer.get("sliding_window"))
    return entmax_normalize((q64 @ k64.transpose(-1, -2)) * q64.shape[-1] ** -0.5, 1.5,
                            allowed if mask is None else allowed & mask)


@needs_triton
def test_the_triton_engine_catches_a_planted_miss_and_is_exact():
    """The kernel's thresholds certify its rows: the rows that lost a gold key are flagged
    and recomputed, and the output equals dense 1.5-entmax (the kernel works in fp32)."""
    q, k, v = (t.float() for t in _qkv(n=128, scale=3.0))
    n, block = 128, 16
    q64, k64, v64 = (t.double() for t in (q, k, v))
    probs, ref = _full_attention(q64, k64, v64, torch.ones(n, n, dtype=torch.bool))
    tiles, (h, i, missed) = _planted_miss(q, n, block, probs)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out, cert = exact_block_sparse_entmax(*(t.to(device) for t in (q, k, v, tiles)), block,
                                          engine="triton")
    flagged = ~cert.certified[h, i * block:(i + 1) * block].cpu()
    assert bool((flagged | ~missed).all())
    assert 0 < cert.fallback_rows < cert.rows  # some rows certified, not all recomputed
    tol = entmax_attention_tol(q, k, v, probs.float())
    torch.testing.assert_close(out.double().cpu(), ref, atol=tol, rtol=0)
    _assert_kernel_certifies_as_float64(cert, q, k, v, tiles, block)


@needs_triton
def test_the_triton_engine_certifies_as_the_torch_engine_with_single_keys():
    q, k, v = (t.float() for t in _qkv(n=128, scale=3.0))
    graph = torch.eye(4, dtype=torch.bool).expand(3, 4, 4).clone()
    extra = torch.randint(0, 128, (3, 4, 12), generator=torch.Generator().manual_seed(1))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out, cert = exact_block_sparse_entmax(*(t.to(device) for t in (q, k, v, graph)), 32,
                                          causal=True, extra_keys=extra.to(device),
                                          engine="triton")
    q64, k64, v64 = (t.double() for t in (q, k, v))
    probs, ref = _full_attention(q64, k64, v64, layer_allowed(128, 128, causal=True))
    torch.testing.assert_close(out.double().cpu(), ref, rtol=0,
                               atol=entmax_attention_tol(q, k, v, probs.float()))
    _assert_kernel_certifies_as_float64(cert, q, k, v, graph, 32, causal=True,
                                        extra_keys=extra)


def test_engines_and_alphas_the_kernel_lacks_are_refused():
    q, k, v = _qkv(n=32)
    graph = torch.ones(3, 1, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match="engine must be"):
        exact_block_sparse_entmax(q, k, v, graph, 32, engine="cuda")
    with pytest.raises(ValueError, match="1.5-entmax only"):
        exact_block_sparse_entmax(q, k, v, graph, 32, alpha=2.0, engine="triton")
    with pytest.raises(ValueError, match="pass bound=True"):
        exact_block_sparse_entmax(q, k, v, graph, 32, piece=8)
    with pytest.raises(ValueError, match="positive scaling"):
        exact_block_sparse_entmax(q, k, v, graph, 32, scaling=-1.0)


@pytest.mark.parametrize(("causal", "window"), [(False, None), (True, None), (True, 40),
                                                (False, 40)])
def test_the_fallback_in_chunks_of_rows_equals_it_in_one_go(causal, window):
    """A budget of a few rows per chunk gives the same output as one chunk per head (the
    rows' masks come from their key ranges, not an (n, m) mask)."""
    q, k, v = _qkv(n=160, scale=3.0)
    graph = torch.eye(10, dtype=torch.bool).expand(3, 10, 10).clone()
    whole, cert = exact_block_sparse_entmax(q, k, v, graph, 16, causal=causal,
                                            sliding_window=window)
    rows_mib = 3 * 160 * BYTES_PER_SCORE / 2**20  # three rows per chunk
    chunked, _ = exact_block_sparse_entmax(q, k, v, graph, 16, causal=causal,
                                           sliding_window=window, fallback_mib=rows_mib)
    assert cert.fallback_rows > 3
    probs, _ = _full_attention(q, k, v, layer_allowed(160, 160, causal=causal,
                                                      sliding_window=window))
    torch.testing.assert_close(chunked, whole, rtol=0,
                               atol=entmax_attention_tol(q, k, v, probs))
    with pytest.raises(ValueError, match="raise it"):
        exact_block_sparse_entmax(q, k, v, graph, 16, fallback_mib=1e-4)
