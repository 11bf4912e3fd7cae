"""Single keys per query block by q·k on pooled query sub-blocks, ∪ the diagonal band."""

from __future__ import annotations

import pytest
import torch
from tolerances import (
    attention_output_tol,
    entmax_prob_tol,
    score_bound,
    support_bound,
    support_size,
    tol_for,
)

from sparsefinder.attention.block_sparse import block_sparse_entmax, expand_blocks
from sparsefinder.attention.entmax_ops import entmax_normalize
from sparsefinder.attention.masks import layer_allowed
from sparsefinder.predictors.block_keys import BlockKeySparsefinder, sub_block_scores

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


def _brute_scores(q, k, block, sub):
    """Per query block: max over its sub-blocks (means of their real rows) of q̄ · k."""
    heads, n, _ = q.shape
    nb = -(-n // block)
    out = torch.full((heads, nb, k.shape[1]), -torch.inf)
    for i in range(nb):
        for s in range(i * block, min((i + 1) * block, n), sub):
            mean = q[:, s : min(s + sub, n)].mean(1)  # (heads, d)
            out[:, i] = torch.maximum(out[:, i], torch.einsum("hd,hmd->hm", mean, k))
    return out


def _scores_tol(q: torch.Tensor, k: torch.Tensor, sub: int) -> dict[str, float]:
    """Two evaluations of max over sub-blocks of (mean of ≤ sub queries)·k: the mean (sub
    terms) and the dot product (d terms) at the magnitude of max|q|·Σ|k_i|; the max is exact."""
    scale = float(q.abs().max()) * float(k.abs().sum(-1).max())
    return tol_for(q, terms=sub + q.shape[-1] + 1, scale=scale)


@pytest.mark.parametrize(("n", "block", "sub"), [(64, 16, 4), (50, 8, 4), (45, 16, 8)])
def test_sub_block_scores_are_the_max_over_pooled_sub_blocks(n, block, sub):
    g = torch.Generator().manual_seed(n)
    q, k = torch.randn(3, n, 5, generator=g), torch.randn(3, n, 5, generator=g)
    torch.testing.assert_close(sub_block_scores(q, k, block, sub), _brute_scores(q, k, block, sub),
                               **_scores_tol(q, k, sub))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_give_float32_scores_within_the_half_bound(dtype):
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, 48, 8, generator=g).to(dtype) for _ in range(2))
    got = sub_block_scores(q, k, 16, 4)
    assert got.dtype == torch.float32
    # the float32 means rounded once to half, then a half product: within the half bound
    torch.testing.assert_close(got, _brute_scores(q.double(), k.double(), 16, 4).float(),
                               **_scores_tol(q, k, 4))


def test_selection_is_the_band_and_the_top_keys_outside_it():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 64, 4, generator=g), torch.randn(2, 64, 4, generator=g)
    predictor = BlockKeySparsefinder(16, 6, sub_block=4, window_blocks=1)
    graph, extra = predictor.select(q, k)
    assert torch.equal(graph, torch.eye(4, dtype=torch.bool).expand(2, 4, 4))
    assert extra.shape == (2, 4, 6) and extra.dtype == torch.int64
    scores = _brute_scores(q, k, 16, 4)
    band = torch.eye(4, dtype=torch.bool).repeat_interleave(16, -1)
    want = scores.masked_fill(band, -torch.inf).topk(6, -1).indices
    assert torch.equal(extra.sort(-1).values, want.sort(-1).values)
    assert not band.expand(2, 4, 64).gather(-1, extra).any()  # never a key of the band
    mask = predictor.predict(q, k)  # every row of a block holds the band and its keys
    assert mask.shape == (2, 64, 64)
    assert torch.equal(mask, expand_blocks(graph, 16, 64, 64, extra))
    assert mask.sum(-1).eq(16 + 6).all()


def test_a_key_that_few_queries_of_a_block_attend_to_is_kept():
    # Block of 8 queries: one points at key 20, the other seven away from it. Pooled over the
    # whole block key 20 loses to key 30; its sub-block of 2 queries keeps it.
    q = torch.tensor([[-2.0, 1.0]] * 7 + [[8.0, 0.0]] + [[0.0, 1.0]] * 24).view(1, 32, 2)
    k = torch.zeros(1, 32, 2)
    k[0, 20] = torch.tensor([1.0, 0.0])
    k[0, 30] = torch.tensor([0.0, 0.2])
    pooled = BlockKeySparsefinder(8, 1, sub_block=8).select(q, k)[1]
    sub = BlockKeySparsefinder(8, 1, sub_block=2).select(q, k)[1]
    assert pooled[0, 0].tolist() == [30] and sub[0, 0].tolist() == [20]


@pytest.mark.parametrize("causal", [False, True])
def test_the_attention_on_the_selection_is_exact_on_covered_rows(causal):
    g = torch.Generator().manual_seed(3)  # float64: rounding far below any wrong key
    q, k, v = (torch.randn(2, 48, 8, generator=g, dtype=torch.float64) for _ in range(3))
    predictor = BlockKeySparsefinder(16, 12, sub_block=4)
    graph, extra = predictor.select(q, k, causal=causal)
    mask = predictor.predict(q, k, causal=causal)
    if causal:
        assert not (mask & ~torch.ones(48, 48, dtype=torch.bool).tril()).any()
        assert mask.diagonal(dim1=-2, dim2=-1).all()
    out = block_sparse_entmax(q, k, v, graph, 16, causal=causal, extra_keys=extra)
    scores = (q @ k.transpose(1, 2) * 8**-0.5).masked_fill(~mask, -torch.inf)
    probs = entmax_normalize(scores, 1.5)
    score_err = score_bound(q, k, 8**-0.5)  # blocks against whole heads: the product rounds
    kept = support_size(probs)
    prob_err = entmax_prob_tol(score_err, 1.5, kept, torch.float64)
    slack = support_bound(score_err, 1.5, kept, torch.float64)
    torch.testing.assert_close(out, probs @ v, rtol=0,
                               atol=attention_output_tol(prob_err, probs, v, slack))


def test_causal_keys_come_from_the_past_when_the_past_is_large_enough():
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(1, 64, 4, generator=g), torch.randn(1, 64, 4, generator=g)
    graph, extra = BlockKeySparsefinder(16, 8, sub_block=8).select(q, k, causal=True)
    assert (extra[0, 1:] < torch.tensor([16, 32, 48])[:, None]).all()  # before its band
    assert not (graph & ~torch.ones(4, 4, dtype=torch.bool).tril()).any()


def test_bad_parameters_are_errors_naming_the_fix():
    with pytest.raises(ValueError, match=r"sub_block \(6\) must divide block \(32\)"):
        BlockKeySparsefinder(32, 10, sub_block=6)
    with pytest.raises(ValueError, match="n_keys must be an integer >= 0"):
        BlockKeySparsefinder(32, -1)
    with pytest.raises(ValueError, match="window_blocks must be an integer >= 1"):
        BlockKeySparsefinder(32, 4, window_blocks=0)
    graph, extra = BlockKeySparsefinder(8, 0).select(torch.zeros(1, 16, 2), torch.zeros(1, 16, 2))
    assert extra is None and graph[0].tolist() == [[True, False], [False, True]]


@pytest.mark.parametrize("budget", [1, 12 * 45, 1 << 20])  # a query block, one head, all heads
def test_chunked_scoring_equals_the_brute_scores(monkeypatch, budget):
    import sparsefinder.predictors.block_keys as block_keys

    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(3, 45, 3, generator=g), torch.randn(3, 45, 3, generator=g)
    monkeypatch.setattr(block_keys, "_CHUNK_SCORES", budget)
    torch.testing.assert_close(sub_block_scores(q, k, 16, 4), _brute_scores(q, k, 16, 4),
                               **_scores_tol(q, k, 4))


@pytest.mark.cuda
def test_the_selection_on_cuda_matches_the_cpu():
    g = torch.Generator().manual_seed(6)
    q, k = torch.randn(3, 300, 8, generator=g), torch.randn(3, 300, 8, generator=g)
    predictor = BlockKeySparsefinder(32, 20, sub_block=8)
    cpu = predictor.predict(q, k, causal=True)
    gpu = predictor.predict(q.cuda(), k.cuda(), causal=True)
    assert gpu.is_cuda and torch.equal(gpu.cpu(), cpu)


@pytest.mark.parametrize("causal", [False, True])
def test_the_block_keys_method_predicts_like_the_selector_on_each_layer(causal):
    """``block`` with ``select="keys"`` (the sweeps' ``block-keys`` curve, the registry) builds
    this selector on the model's own q/k."""
    from sparsefinder.data.records import AttentionRecord, LayerGraph
    from sparsefinder.evaluation.curves import CURVES, GROUPS
    from sparsefinder.methods.spec import PredictorSpec, RecordInputs, predict_record

    gen = torch.Generator().manual_seed(9)
    n, heads = 70, 2
    layers = []
    for _ in range(2):
        q, k = torch.randn(heads, n, 4, generator=gen), torch.randn(heads, n, 4, generator=gen)
        gold = torch.rand(heads, n, n, generator=gen) < 0.2
        layers.append(LayerGraph(q, k, gold, torch.ones(int(gold.sum())), 0.5))
    record = AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                             special=[False] * n, causal=causal, layers=layers)
    spec = PredictorSpec.of("block", {"block": 16, "n_keys": 5, "sub_block": 4,
                                      "select": "keys"})
    masks = predict_record(spec, spec.build_layers(None, 2), RecordInputs(record))
    selector = BlockKeySparsefinder(16, 5, sub_block=4)
    for layer, mask in zip(layers, masks, strict=True):
        assert torch.equal(mask, selector.predict(layer.queries, layer.keys, causal=causal))
    assert "block-keys" in CURVES and "block-keys" in GROUPS["long-context"]
    assert [dict(s.params)["n_keys"] for s in CURVES["block-keys"].specs][:2] == [0, 2]


def test_the_error_for_a_sub_block_that_does_not_divide_suggests_one_that_does():
    with pytest.raises(ValueError, match=r"e\.g\. sub_block=8$"):
        BlockKeySparsefinder(32, 4, sub_block=5)
    with pytest.raises(ValueError, match=r"e\.g\. sub_block=1$"):
        BlockKeySparsefinder(3, 4, sub_block=2)
    for bad in (True, 2.0, "4"):
        with pytest.raises(ValueError, match="n_keys must be an integer >= 0"):
            BlockKeySparsefinder(32, bad)


@pytest.mark.parametrize("causal", [False, True])
def test_a_local_layer_spends_the_single_keys_inside_each_blocks_reach(causal):
    """With a sliding window, a query block's single keys are keys some query of the block may
    attend to (the budget is not spent on impossible keys while possible ones remain), and
    the token mask stays in the window."""
    from sparsefinder.attention.masks import layer_allowed
    from sparsefinder.predictors.block import block_reach

    g = torch.Generator().manual_seed(12)
    q, k = torch.randn(2, 96, 8, generator=g), torch.randn(2, 96, 8, generator=g)
    predictor = BlockKeySparsefinder(16, 6, sub_block=4)
    graph, extra = predictor.select(q, k, causal=causal, sliding_window=24)
    reach = block_reach(96, 96, 16, causal=causal, sliding_window=24)
    band = graph[0].repeat_interleave(16, -1)[:, :96]  # (blocks, keys) the band covers
    open_keys = (reach & ~band).sum(-1)  # reachable keys outside the band, per query block
    full = open_keys >= 6
    assert bool(full.any()) and (not causal or not bool(full.all()))  # causal: both cases
    for head in range(2):
        in_reach = reach.gather(1, extra[head]).sum(-1)
        # every pick in reach while enough remain; else every reachable key is picked
        assert torch.equal(in_reach, torch.clamp(open_keys, max=6))
    mask = predictor.predict(q, k, causal=causal, sliding_window=24)
    allowed = layer_allowed(96, 96, causal=causal, sliding_window=24)
    assert not (mask & ~allowed).any()
    wide = predictor.select(q, k, causal=causal)[1]
    assert not torch.equal(wide, extra)  # without the window the keys go elsewhere


def _brute_gaps(q, k, block, causal, window, among=None):
    """float64 (heads, nb, m): per query block and key, the key's best gap to a row maximum
    ``max_i (q_i·k_j − M_i)`` over the block's rows that may see it (−inf where none may),
    ``M_i`` the row's maximum over the keys ``among`` (bool (heads, nb, m); default all), by
    dense scores and the layer's mask."""
    heads, n, _ = q.shape
    nb = -(-n // block)
    scores = q.double() @ k.double().transpose(1, 2)
    allowed = layer_allowed(n, n, causal=causal, sliding_window=window)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -torch.inf)
    out = torch.full((heads, nb, n), -torch.inf, dtype=torch.float64)
    for b in range(nb):
        rows = scores[:, b * block:(b + 1) * block]
        counted = rows if among is None else rows.masked_fill(~among[:, b, None], -torch.inf)
        out[:, b] = (rows - counted.amax(-1, keepdim=True)).amax(1)
    return out


@pytest.mark.parametrize(("n", "causal", "window", "candidates"),
                         [(64, False, None, 64), (64, False, None, 24), (45, True, None, 45),
                          (64, True, None, 20), (64, False, 20, 64), (45, True, 20, 30)])
def test_the_second_stage_keeps_the_candidates_nearest_a_rows_maximum(n, causal, window,
                                                                      candidates):
    """Of the pooled stage's ``candidates`` keys (all keys where ``candidates`` ≥ n), the
    kept ones have the best gaps to a row maximum: none kept is worse than one left out."""
    g = torch.Generator().manual_seed(n + candidates)
    q, k = (torch.randn(2, n, 6, generator=g, dtype=torch.float64) * 2 for _ in range(2))
    block, keep = 16, 8
    graph, extra = BlockKeySparsefinder(block, keep, sub_block=4,
                                        candidates=candidates).select(
        q, k, causal=causal, sliding_window=window)
    band = graph.repeat_interleave(block, -1)[..., :n]
    reach = _brute_gaps(q, k, block, causal, window) > -torch.inf  # keys some row may see
    pooled = _brute_scores(q, k, block, 4).masked_fill(band | ~reach, -torch.inf)
    pool = pooled.topk(min(candidates, n), -1).indices
    in_pool = torch.zeros_like(band).scatter_(-1, pool, True) & reach & ~band
    diagonal = torch.eye(graph.shape[1], dtype=torch.bool).repeat_interleave(block, -1)[:, :n]
    gaps = _brute_gaps(q, k, block, causal, window, among=in_pool | diagonal)
    kept = torch.zeros_like(band).scatter_(-1, extra, True)
    tol = 1e-9 * float(q.abs().max() * k.abs().sum(-1).max())
    for h in range(2):
        for b in range(graph.shape[1]):
            chosen, rest = kept[h, b] & in_pool[h, b], in_pool[h, b] & ~kept[h, b]
            assert int(chosen.sum()) == min(keep, int(in_pool[h, b].sum()))
            if rest.any():
                assert float(gaps[h, b][chosen].min()) >= float(gaps[h, b][rest].max()) - tol


@pytest.mark.parametrize(("causal", "window"), [(False, None), (True, None), (True, 24)])
def test_every_gold_key_is_kept_when_the_budget_holds_the_keys_within_two(causal, window):
    """A 1.5-entmax support key has ``scaling·(x_ij − max_l x_il) > −2`` (τ ≥ −1): with every
    key a candidate and a budget as large as each block's count of such keys, the selection
    holds every gold edge."""
    g = torch.Generator().manual_seed(7)
    n, block, d = 96, 16, 8
    q, k = (torch.randn(3, n, d, generator=g, dtype=torch.float64) * 2.5 for _ in range(2))
    scaling = d**-0.5
    near = (_brute_gaps(q, k, block, causal, window) * scaling > -2 - 1e-9)
    graph, _ = BlockKeySparsefinder(block, 1).select(q, k, causal=causal, sliding_window=window)
    band = graph.repeat_interleave(block, -1)[..., :n]
    budget = int((near & ~band).sum(-1).max())
    assert budget < n - block  # the test would be empty otherwise
    predictor = BlockKeySparsefinder(block, budget, sub_block=4, candidates=n)
    mask = predictor.predict(q, k, causal=causal, sliding_window=window)
    allowed = layer_allowed(n, n, causal=causal, sliding_window=window)
    probs = entmax_normalize((q @ k.transpose(1, 2)) * scaling, 1.5, allowed)
    assert bool(mask[probs > 0].all())


def test_candidates_fewer_than_the_keys_kept_are_an_error_naming_the_fix():
    with pytest.raises(ValueError, match="use 0 \\(one stage\\) or at least 16"):
        BlockKeySparsefinder(32, 16, candidates=8)
    one = BlockKeySparsefinder(16, 6, sub_block=4)
    q, k = torch.randn(2, 64, 4), torch.randn(2, 64, 4)
    assert torch.equal(one.select(q, k)[1], BlockKeySparsefinder(16, 6, sub_block=4,
                                                                   candidates=6).select(q, k)[1])


@pytest.mark.parametrize("budget", [1, 40 * 16])  # one query block a chunk, a few
def test_the_second_stage_in_chunks_equals_it_in_one_go(monkeypatch, budget):
    import sparsefinder.predictors.block_keys as block_keys

    g = torch.Generator().manual_seed(8)
    q, k = (torch.randn(2, 90, 6, generator=g, dtype=torch.float64) for _ in range(2))
    predictor = BlockKeySparsefinder(16, 6, sub_block=4, candidates=30)
    whole = predictor.select(q, k, causal=True)[1].sort(-1).values
    monkeypatch.setattr(block_keys, "_CHUNK_SCORES", budget)
    assert torch.equal(predictor.select(q, k, causal=True)[1].sort(-1).values, whole)


@pytest.mark.cuda
def test_the_second_stage_on_cuda_keeps_what_the_cpu_keeps():
    """float64, so no near-tie can order keys differently on the two devices; compared as
    token masks, since where a block has fewer usable keys than it keeps, its fillers (band
    or unreachable keys, cut by the mask) are any of the tied ones."""
    g = torch.Generator().manual_seed(9)
    q, k = (torch.randn(3, 300, 8, generator=g, dtype=torch.float64) for _ in range(2))
    for predictor in (BlockKeySparsefinder(32, 20, sub_block=8, candidates=96),
                      BlockKeySparsefinder(32, 20, sub_block=8, candidates=96, wide_keys=48)):
        for layer in ({"causal": True}, {"sliding_window": 100}):
            cpu = predictor.predict(q, k, **layer)
            gpu = predictor.predict(q.cuda(), k.cuda(), **layer)
            assert gpu.is_cuda and torch.equal(gpu.cpu(), cpu)


def _crowded_inputs(seed: int, flat_block: int | None):
    """float64 q/k (2, 96, 8) whose query block ``flat_block`` (of 16) has small queries:
    every key lies close to its rows' maxima (a crowded block). The other queries point
    along one direction per head, so each block's rows peak on the same few keys."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(2, 96, 8, generator=g, dtype=torch.float64) * 3
    q = 4 * torch.randn(2, 1, 8, generator=g, dtype=torch.float64) + 0.3 * torch.randn(
        2, 96, 8, generator=g, dtype=torch.float64)
    if flat_block is not None:
        q[:, flat_block * 16:(flat_block + 1) * 16] *= 0.04
    return q, k


@pytest.mark.parametrize("causal", [False, True])
def test_a_crowded_block_keeps_wide_keys_and_the_others_their_n_keys(causal):
    """Crowded: more than n_keys·CROWD_SHARE candidates within CROWD_GAP of a row maximum
    (score units). Such a block keeps its ``wide_keys`` best-gap candidates and with them
    every gold key, which ``n_keys`` alone cannot hold; the other blocks keep exactly the
    keys they keep without ``wide_keys``."""
    from sparsefinder.predictors.block_keys import CROWD_GAP, CROWD_SHARE

    q, k = _crowded_inputs(3, flat_block=4)
    n, block, keep, wide, scaling = 96, 16, 9, 60, 8**-0.5
    narrow = BlockKeySparsefinder(block, keep, sub_block=4, candidates=n)
    widened = BlockKeySparsefinder(block, keep, sub_block=4, candidates=n, wide_keys=wide)
    graph, extra = widened.select(q, k, causal=causal)
    assert extra.shape[-1] == wide
    band = graph.repeat_interleave(block, -1)[..., :n]
    reach = _brute_gaps(q, k, block, causal, None) > -torch.inf
    diagonal = torch.eye(graph.shape[1], dtype=torch.bool).repeat_interleave(block, -1)[:, :n]
    gaps = _brute_gaps(q, k, block, causal, None, among=(reach & ~band) | diagonal)
    crowd = ((gaps * scaling > -CROWD_GAP) & reach & ~band).sum(-1) > keep * CROWD_SHARE
    assert bool(crowd[:, 4].all()) and int(crowd.sum()) <= 4  # the test can fail
    kept = torch.zeros_like(band).scatter_(-1, extra, True) & reach & ~band
    alone = torch.zeros_like(band).scatter_(-1, narrow.select(q, k, causal=causal)[1], True)
    alone &= reach & ~band  # (fillers where a block has fewer usable keys are cut here)
    assert torch.equal(kept[~crowd], alone[~crowd])
    usable = (reach & ~band).sum(-1)
    assert torch.equal(kept.sum(-1)[crowd], usable[crowd].clamp(max=wide))
    probs = entmax_normalize((q @ k.transpose(1, 2)) * scaling, 1.5,
                             layer_allowed(n, n, causal=causal))
    gold = (probs > 0).view(2, 6, block, n).any(2) & ~band
    assert bool((gold[:, 4] & ~alone[:, 4]).any())  # n_keys alone misses gold keys there
    assert not bool((gold[:, 4] & ~kept[:, 4]).any())


def test_without_a_crowded_block_the_selection_keeps_its_width():
    q, k = _crowded_inputs(4, flat_block=None)
    narrow = BlockKeySparsefinder(16, 30, sub_block=4, candidates=96).select(q, k)[1]
    widened = BlockKeySparsefinder(16, 30, sub_block=4, candidates=96, wide_keys=60).select(q, k)
    assert torch.equal(widened[1].sort(-1).values, narrow.sort(-1).values)


@pytest.mark.parametrize(("wide", "candidates"), [(6, 96), (100, 96), (20, 0)])
def test_wide_keys_outside_n_keys_and_candidates_are_an_error_naming_the_fix(wide, candidates):
    with pytest.raises(ValueError, match=r"use 0 \(off\) or a value in \(n_keys=6, "):
        BlockKeySparsefinder(16, 6, candidates=candidates, wide_keys=wide)
