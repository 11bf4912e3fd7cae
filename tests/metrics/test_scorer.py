"""Recall (paper Eq. 4), sparsity (Eq. 5) and their macro-averaging."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerances import ratio_tol

from sparsefinder.attention.masks import causal_mask, n_allowed_pairs
from sparsefinder.metrics.measures import (
    GraphScores,
    count_true,
    gold_sparsity,
    recall,
    score_layers,
    sparsity,
)
from sparsefinder.metrics.scorer import Scorer, macro_average

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

T, F = True, False


def close(actual: torch.Tensor, expected: list) -> bool:
    return torch.allclose(actual, torch.tensor(expected, dtype=actual.dtype))


# two heads, three tokens
GOLD = torch.tensor(
    [
        [[T, F, F], [T, T, F], [F, F, T]],  # 4 edges
        [[F, F, F], [F, F, F], [F, F, F]],  # no edge at all
    ]
)


def test_recall_hand_computed() -> None:
    pred = torch.tensor(
        [
            [[T, T, F], [F, T, F], [F, F, F]],  # hits (0,0) and (1,1): 2 of 4
            [[T, T, T], [F, F, F], [F, F, F]],
        ]
    )
    result = recall(pred, GOLD)
    assert result.dtype == torch.float64
    assert result.tolist() == [0.5, 1.0]  # head 1 has no gold edge → 1.0 by convention


def test_recall_is_one_when_prediction_contains_gold_and_zero_when_disjoint() -> None:
    assert recall(GOLD | torch.eye(3, dtype=torch.bool), GOLD).tolist() == [1.0, 1.0]
    assert recall(~GOLD, GOLD).tolist() == [0.0, 1.0]


@settings(max_examples=40, deadline=None)
@given(heads=st.integers(1, 4), n=st.integers(1, 12), m=st.integers(1, 12), seed=st.integers())
def test_recall_never_drops_when_prediction_grows(heads, n, m, seed) -> None:
    gen = torch.Generator().manual_seed(seed % 2**32)
    gold = torch.rand(heads, n, m, generator=gen) < 0.3
    small = torch.rand(heads, n, m, generator=gen) < 0.3
    large = small | (torch.rand(heads, n, m, generator=gen) < 0.3)
    assert (recall(large, gold) >= recall(small, gold)).all()
    hits, total = (small & gold).sum((1, 2)), gold.sum((1, 2))
    expected = torch.where(total > 0, hits / total.clamp(min=1), 1.0).double()
    assert torch.allclose(recall(small, gold), expected)


def test_sparsity_hand_computed() -> None:
    pred = torch.tensor(
        [
            [[T, T, F], [F, T, F], [F, F, F]],  # 3 of 9
            [[T, T, T], [T, T, T], [T, T, T]],  # 9 of 9
        ]
    )
    assert sparsity(pred).tolist() == pytest.approx([1 - 3 / 9, 0.0])
    assert sparsity(torch.zeros(1, 3, 4, dtype=torch.bool)).tolist() == [1.0]


def test_causal_sparsity_uses_n_times_n_plus_one_over_two() -> None:
    n = 5
    assert n_allowed_pairs(n, n, causal=True) == n * (n + 1) // 2 == 15
    full = torch.ones(2, n, n, dtype=torch.bool)
    assert sparsity(full, causal=True).tolist() == [0.0, 0.0]
    future_only = full.triu(diagonal=1)
    assert sparsity(future_only, causal=True).tolist() == [1.0, 1.0]  # future never counts
    diagonal = torch.eye(n, dtype=torch.bool)[None]
    assert sparsity(diagonal, causal=True).item() == pytest.approx(1 - 5 / 15)
    assert sparsity(diagonal).item() == pytest.approx(1 - 5 / 25)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 15), m=st.integers(0, 15))
def test_allowed_pairs_match_the_causal_mask(n, m) -> None:
    assert n_allowed_pairs(n, m, causal=True) == int(causal_mask(n, m).sum())
    assert n_allowed_pairs(n, m) == n * m


def test_gold_sparsity_is_the_sparsity_of_gold() -> None:
    assert gold_sparsity(GOLD).tolist() == pytest.approx([1 - 4 / 9, 1.0])
    assert gold_sparsity(GOLD, causal=True).tolist() == pytest.approx([1 - 4 / 6, 1.0])


@settings(max_examples=60, deadline=None)
@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    n=st.integers(0, 70),
    m=st.integers(0, 70),
    p=st.floats(0.0, 1.0),
    transpose=st.booleans(),
)
def test_count_true_matches_sum(lead, n, m, p, transpose) -> None:
    x = torch.rand(*lead, n, m) < p
    if transpose:
        x = x.transpose(-1, -2)
    assert torch.equal(count_true(x), x.sum((-2, -1)))


def test_count_true_exact_on_large_full_masks() -> None:
    x = torch.ones(2, 600, 700, dtype=torch.bool)  # byte groups would overflow without care
    assert count_true(x).tolist() == [420000, 420000]


def test_inputs_must_be_bool_masks_of_the_same_shape() -> None:
    with pytest.raises(ValueError, match=r"bool tensor .* pass `gold > 0`"):
        recall(GOLD, GOLD.float())
    with pytest.raises(ValueError, match="must match"):
        recall(GOLD, GOLD[:, :2])
    with pytest.raises(ValueError, match="bool"):
        sparsity(GOLD.int())


def test_score_layers_stacks_layers_and_heads() -> None:
    preds = [GOLD, torch.ones_like(GOLD)]
    golds = [GOLD, GOLD]
    scores = score_layers(preds, golds, causal=False)
    assert scores.recall.shape == scores.sparsity.shape == (2, 2)
    assert scores.recall.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert close(scores.sparsity, [[1 - 4 / 9, 1.0], [0.0, 0.0]])
    assert close(scores.gold_sparsity, [[1 - 4 / 9, 1.0]] * 2)
    causal = score_layers(preds, golds, causal=True)
    assert causal.sparsity[1].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="2 predicted layers but 1 gold"):
        score_layers(preds, golds[:1])


def test_macro_average_texts_then_heads_then_layers() -> None:
    # Text A is short, text B long: each text weighs the same (not pooled by edge counts).
    text_a = GraphScores(
        recall=torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64),
        sparsity=torch.tensor([[0.9, 0.8], [0.7, 0.6]], dtype=torch.float64),
    )
    text_b = GraphScores(
        recall=torch.tensor([[0.0, 0.0], [0.5, 1.0]], dtype=torch.float64),
        sparsity=torch.tensor([[0.5, 0.6], [0.7, 0.2]], dtype=torch.float64),
    )
    out = macro_average([text_a, text_b])
    assert out["n_texts"] == 2
    assert out["recall_per_head"].tolist() == [[0.5, 0.0], [0.5, 0.75]]
    assert out["recall_per_layer"].tolist() == [0.25, 0.625]
    assert out["recall"] == pytest.approx(0.4375)
    assert close(out["sparsity_per_head"], [[0.7, 0.7], [0.7, 0.4]])
    assert out["sparsity_per_layer"].tolist() == pytest.approx([0.7, 0.55])
    assert out["sparsity"] == pytest.approx(0.625)
    assert "gold_sparsity" not in out  # not given for these texts


def test_macro_average_weighs_texts_equally_not_by_length() -> None:
    short_gold = torch.ones(1, 2, 2, dtype=torch.bool)  # 4 gold edges, all found
    long_gold = torch.ones(1, 10, 10, dtype=torch.bool)  # 100 gold edges, none found
    scores = [
        score_layers([short_gold], [short_gold]),
        score_layers([torch.zeros_like(long_gold)], [long_gold]),
    ]
    out = macro_average(scores)
    assert out["recall"] == pytest.approx(0.5)  # pooled counts would give 4/104
    assert out["gold_sparsity"] == pytest.approx(0.0)


def test_macro_average_rejects_empty_and_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="at least one text"):
        macro_average([])
    one = GraphScores(recall=torch.ones(2, 3), sparsity=torch.ones(2, 3))
    other = GraphScores(recall=torch.ones(2, 4), sparsity=torch.ones(2, 4))
    with pytest.raises(ValueError, match="same"):
        macro_average([one, other])


# ---------------------------------------------------------------- Scorer


def _scored_record(n: int, causal: bool, seed: int = 0):
    from sparsefinder.data.records import AttentionRecord, LayerGraph

    gen = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(2):
        gold = torch.rand(3, n, n, generator=gen) < 0.4
        if causal:
            gold &= causal_mask(n, n)
        q = torch.randn(3, n, 4, generator=gen)
        layers.append(LayerGraph(q, q.clone(), gold, torch.ones(int(gold.sum())), 0.5))
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=causal, layers=layers)


@pytest.mark.parametrize("causal", [False, True])
def test_scorer_equals_the_plain_metrics_and_takes_causal_from_the_record(causal) -> None:
    from sparsefinder.metrics.scorer import Scorer

    record = _scored_record(9, causal)
    gen = torch.Generator().manual_seed(5)
    preds = [torch.rand(3, 9, 9, generator=gen) < 0.5 for _ in range(2)]
    scores = Scorer(record).score(preds)
    golds = record.gold_masks()
    expected = score_layers(preds, golds, causal=causal)
    assert torch.equal(scores.recall, expected.recall)
    assert torch.equal(scores.sparsity, expected.sparsity)
    assert torch.equal(scores.gold_sparsity, expected.gold_sparsity)
    if causal:  # the decoder denominator: 9·10/2 = 45 pairs, future predictions not counted
        full = [torch.ones(3, 9, 9, dtype=torch.bool)] * 2
        zero = torch.zeros(2, 3, dtype=torch.float64)
        assert torch.equal(Scorer(record).score(full).sparsity, zero)
        kept = count_true(preds[0] & causal_mask(9, 9))
        assert torch.allclose(scores.sparsity[0], 1 - kept.double() / 45)


def test_scorer_keeps_no_dense_gold_mask_and_reads_each_layer_when_asked() -> None:
    """Records store gold bit-packed; a scorer unpacks one layer at a time (never a list of
    every layer's (heads, n, m) bools: 2 GiB on a 1 B decoder at 2048 tokens)."""
    record = _scored_record(8, False)
    scorer = Scorer(record)
    gen = torch.Generator().manual_seed(2)
    scorer.score([torch.rand(3, 8, 8, generator=gen) < 0.5 for _ in range(2)])
    held = [v for v in vars(scorer).values()
            if isinstance(v, torch.Tensor) and v.dtype == torch.bool and v.shape == (3, 8, 8)]
    held += [v for v in vars(scorer).values() if isinstance(v, list)
             and any(isinstance(x, torch.Tensor) and x.shape == (3, 8, 8) for x in v)]
    assert not held
    assert len(scorer.golds) == 2
    for layer, graph in enumerate(record.layers):
        assert torch.equal(scorer.golds[layer], graph.gold)
    assert [g.shape for g in scorer.golds[0:2]] == [(3, 8, 8)] * 2
    with pytest.raises(IndexError):
        scorer.golds[2]


def test_scorer_names_the_layer_of_a_bad_prediction() -> None:
    from sparsefinder.metrics.scorer import Scorer

    scorer = Scorer(_scored_record(5, False))
    with pytest.raises(ValueError, match="layer 1: pred"):
        scorer.layer(1, torch.zeros(3, 4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="2 gold layers"):
        scorer.score([torch.zeros(3, 5, 5, dtype=torch.bool)])
    with pytest.raises(ValueError, match="bool"):
        scorer.layer(0, torch.zeros(3, 5, 5))


# ---------------------------------------------------------------- boundaries and messages


def _record_of(golds: list[torch.Tensor], causal: bool = False):
    from sparsefinder.data.records import AttentionRecord, LayerGraph

    n = golds[0].shape[-1]
    layers = [LayerGraph(torch.zeros(g.shape[0], n, 2), torch.zeros(g.shape[0], n, 2), g,
                         torch.ones(int(g.sum())), 1.0) for g in golds]
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=causal, layers=layers)


def test_bad_masks_are_named_with_their_type_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"^pred must be a bool tensor \(heads, n, m\), got "
                                         r"torch.float32; for probabilities pass `pred > 0`$"):
        recall(GOLD.float(), GOLD)
    with pytest.raises(ValueError, match=r"^pred must be a bool tensor .*, got list;"):
        sparsity([[True]])
    with pytest.raises(ValueError, match=r"^pred must have shape \(heads, n, m\), got \(3,\)$"):
        recall(torch.ones(3, dtype=torch.bool), torch.ones(3, dtype=torch.bool))
    # One (n, m) mask is accepted: a single head without its axis.
    assert recall(GOLD[0], GOLD[0]).item() == 1.0
    assert sparsity(GOLD[0]).item() == pytest.approx(1 - 4 / 9)
    with pytest.raises(ValueError, match="^score_layers needs at least one layer$"):
        score_layers([], [])
    with pytest.raises(ValueError, match="^macro_average needs the scores of at least one text$"):
        macro_average([])


def test_sparsity_boundaries_one_pair_and_no_pairs() -> None:
    one = torch.ones(2, 1, 1, dtype=torch.bool)
    assert sparsity(one).tolist() == [0.0, 0.0]  # D = 1: the single pair is kept
    assert sparsity(~one, causal=True).tolist() == [1.0, 1.0]
    empty = torch.zeros(3, 0, 4, dtype=torch.bool)
    out = sparsity(empty)
    assert out.dtype == torch.float64 and out.tolist() == [1.0, 1.0, 1.0]


def test_masks_on_another_device_stay_there() -> None:
    """The meta device stands in for a GPU: every tensor built inside follows the input."""
    pred = torch.ones(2, 4, 4, dtype=torch.bool, device="meta")
    counts = count_true(pred)
    assert counts.device.type == "meta" and counts.shape == (2,) and counts.dtype == torch.int64
    assert sparsity(pred, causal=True).device.type == "meta"
    assert sparsity(torch.ones(2, 0, 3, dtype=torch.bool, device="meta")).device.type == "meta"


def test_scorer_recall_at_zero_one_and_two_gold_edges() -> None:
    from sparsefinder.metrics.scorer import Scorer

    gold = torch.zeros(4, 3, 3, dtype=torch.bool)
    gold[1, 0, 0] = gold[2, 0, 0] = True  # heads 1, 2: one gold edge; head 3: two
    gold[3, 1, 0] = gold[3, 1, 1] = True
    scorer = Scorer(_record_of([gold]))  # a one-layer record
    pred = torch.zeros(4, 3, 3, dtype=torch.bool)
    pred[1, 0, 0] = pred[3, 1, 0] = True  # head 2 misses its only edge
    rec, spars = scorer.layer(0, pred)
    assert rec.tolist() == [1.0, 1.0, 0.0, 0.5]  # head 0: no gold edge, nothing to miss
    assert spars.tolist() == pytest.approx([1.0, 1 - 1 / 9, 1.0, 1 - 1 / 9])
    assert rec.tolist() == recall(pred, gold).tolist()
    with pytest.raises(ValueError, match=r"^pred must be a bool tensor"):
        scorer.layer(0, pred.float())
    with pytest.raises(ValueError, match="^the record has no layers; extract it with graphs"):
        Scorer(_record_of([gold]).__class__(text="x", tokens=[], offsets=[], special=[],
                                            causal=False, layers=[]))


def test_scorer_on_one_and_zero_token_records() -> None:
    from sparsefinder.metrics.scorer import Scorer

    one = torch.ones(2, 1, 1, dtype=torch.bool)
    scores = Scorer(_record_of([one, one])).score([one, ~one])
    assert scores.sparsity.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    assert scores.gold_sparsity.tolist() == [[0.0, 0.0], [0.0, 0.0]]
    empty = torch.zeros(2, 0, 0, dtype=torch.bool)
    scorer = Scorer(_record_of([empty], causal=True))
    assert scorer.denominator == 0
    out = scorer.score([empty])
    assert out.sparsity.dtype == torch.float64 and out.sparsity.tolist() == [[1.0, 1.0]]
    assert out.recall.tolist() == [[1.0, 1.0]]


def test_macro_average_is_float64_whatever_the_input() -> None:
    third = torch.tensor([[1 / 3, 2 / 3]], dtype=torch.float32)
    out = macro_average([GraphScores(recall=third, sparsity=third)] * 3)
    assert out["recall_per_head"].dtype == torch.float64
    assert out["recall_per_layer"].tolist() == [third.double().mean().item()]


def test_scorer_keeps_a_decoder_record_on_its_device() -> None:
    """The meta device stands in for a GPU: the causal cut is built where the masks live."""
    from sparsefinder.data.records import AttentionRecord, LayerGraph
    from sparsefinder.metrics.scorer import Scorer

    gold = torch.ones(2, 3, 3, dtype=torch.bool, device="meta")
    layer = LayerGraph(torch.zeros(2, 3, 2), torch.zeros(2, 3, 2), gold, torch.ones(6), 1.0)
    # (the extra metrics list the gold edges, which the meta device cannot: they have their
    # own device-independent tests in test_metrics_extra.py)
    scorer = Scorer(AttentionRecord(text="x", tokens=["t"] * 3, offsets=[(0, 0)] * 3,
                                    special=[False] * 3, causal=True, layers=[layer]),
                    extra=False)
    assert scorer.gold_counts.device.type == "meta"
    out = scorer.score([gold])
    assert out.sparsity.device.type == "meta" and out.recall.device.type == "meta"


def test_score_layers_is_not_causal_by_default() -> None:
    future = torch.ones(1, 3, 3, dtype=torch.bool).triu(1)  # only future pairs
    scores = score_layers([future], [future])
    assert scores.sparsity.tolist() == [[pytest.approx(1 - 3 / 9)]]
    assert score_layers([future], [future], causal=True).sparsity.tolist() == [[1.0]]


def test_macro_average_leaves_softmax_layers_out_and_counts_them(sparse_modernbert_records):
    """Per-layer values keep every layer; the overall value is the entmax layers' mean."""
    from sparsefinder.metrics.scorer import Scorer

    scores = []
    for record in sparse_modernbert_records:
        scorer = Scorer(record)
        assert scorer.counted.tolist() == [True, False, False, True]
        scores.append(scorer.score([torch.zeros_like(g) for g in scorer.golds]))
    out = macro_average(scores)
    assert out["n_softmax_layers"] == 2
    per_layer = out["gold_sparsity_per_layer"]
    assert per_layer.shape == (4,)
    assert out["gold_sparsity"] == pytest.approx(float(per_layer[[0, 3]].mean()))
    # a softmax local layer's gold is its whole ±4 window: its sparsity is exactly 0
    assert per_layer[1] == pytest.approx(0.0) and per_layer[2] == pytest.approx(0.0)
    assert out["gold_sparsity"] > 0


def test_macro_average_of_all_softmax_layers_keeps_them_all() -> None:
    ones = torch.ones(2, 3, dtype=torch.float64)
    scores = GraphScores(recall=ones, sparsity=ones * 0.5,
                         counted=torch.tensor([False, False]))
    out = macro_average([scores])
    assert out["n_softmax_layers"] == 2 and out["sparsity"] == 0.5


# ---------------------------------------------------------------- the shared-head fast path


def _graph_record(golds: list[torch.Tensor], causal: bool, windows: list, alphas: list,
                  seed: int = 0, share: float = 1.0):
    """A record whose layers have sliding windows / α as given; gold cut to what each layer
    allows (as extraction does), probabilities on the gold edges (rows scaled by ``share``)."""
    from sparsefinder.attention.masks import layer_allowed
    from sparsefinder.data.records import AttentionRecord, LayerGraph

    gen = torch.Generator().manual_seed(seed)
    heads, n, m = golds[0].shape
    layers = []
    for gold, window, alpha in zip(golds, windows, alphas, strict=True):
        allowed = layer_allowed(n, m, causal=causal, sliding_window=window)
        if allowed is not None:
            gold = gold & allowed
        weights = torch.rand(heads, n, m, generator=gen) * gold
        probs = share * weights / weights.sum(-1, keepdim=True).clamp(min=1e-12)
        layers.append(LayerGraph(torch.zeros(heads, n, 2), torch.zeros(heads, m, 2), gold,
                                 probs[gold].float(), 1.5, sliding_window=window, alpha=alpha))
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=causal, layers=layers)


def _metric_tol(name: str, n: int) -> float:
    """Two evaluations of a metric on n-key rows: mass recall sums float32 probabilities (2n
    terms), the others are float64 ratios of counts averaged over the rows (n² terms)."""
    return ratio_tol(2 * n, torch.float32) if name == "mass_recall" else ratio_tol(n * n)


def _by_definition(record, layer: int, pred: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every metric from the plain functions, the layer's allowed pairs applied by hand."""
    from sparsefinder.attention.masks import layer_allowed
    from sparsefinder.metrics.measures import (
        block_recall,
        exact_fraction,
        mass_recall,
        precision,
    )

    graph = record.layers[layer]
    gold = graph.gold
    n, m = gold.shape[-2:]
    allowed = layer_allowed(n, m, causal=record.causal, sliding_window=graph.sliding_window)
    if allowed is None:
        allowed = torch.ones(n, m, dtype=torch.bool)
    kept = pred & allowed
    pairs = int(allowed.sum())
    return {
        "recall": recall(kept, gold),
        "sparsity": 1.0 - count_true(kept).double() / pairs,
        "precision": precision(kept, gold),
        "exact_fraction": exact_fraction(kept, gold),
        "mass_recall": mass_recall(kept, graph.probs().double()),
        "block_recall16": block_recall(kept, gold, 16),
        "block_recall64": block_recall(kept, gold, 64),
    }


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n", "m"), [(9, 9), (7, 12), (64, 20), (20, 64), (1, 5)])
def test_a_shared_mask_scores_like_the_same_mask_given_per_head(causal, n, m) -> None:
    """``mask.expand(heads, n, m)`` (the app's slider fast path) reads the mask once; its
    scores are those of the same mask materialised per head, and those of the functions."""
    from sparsefinder.metrics.measures import EXTRA_METRICS
    from sparsefinder.metrics.scorer import Scorer, shared_head

    gen = torch.Generator().manual_seed(n * 100 + m)
    golds = [torch.rand(3, n, m, generator=gen) < 0.3 for _ in range(3)]
    for gold in golds:
        gold[0] = False  # a head without gold edges
    # an entmax layer, a sliding-window one and a softmax one
    record = _graph_record(golds, causal, [None, 3, None], [1.5, 1.5, 1.0], seed=n + m)
    scorer = Scorer(record)
    for density in (0.0, 0.3, 0.7, 1.0):
        base = torch.rand(n, m, generator=gen) < density
        shared = base.expand(3, n, m)
        materialised = shared.clone()
        assert shared_head(shared) is not None and shared_head(materialised) is None
        fast = scorer.score([shared] * 3)
        slow = scorer.score([materialised] * 3)
        for name in ("recall", "sparsity", *EXTRA_METRICS):
            assert torch.equal(getattr(fast, name), getattr(slow, name)), (name, density)
        for layer in range(3):
            alone = Scorer(record).layer_scores(layer, shared)  # without a memo
            for name, value in _by_definition(record, layer, materialised).items():
                assert torch.allclose(getattr(fast, name)[layer], value, rtol=0,
                                      atol=_metric_tol(name, m)), (name, layer, density)
                assert torch.equal(alone[name], getattr(fast, name)[layer]), name
        assert torch.equal(fast.gold_sparsity, slow.gold_sparsity)
        assert fast.counted.tolist() == [True, True, False]


def test_layers_given_one_shared_mask_count_it_once_and_keep_their_own_gold(monkeypatch):
    """One score call counts a shared mask once per allowed-pair mask (the memo), yet each
    layer is scored against its own gold, and layers whose allowed pairs differ (a sliding
    window) never take another layer's cut mask."""
    import sparsefinder.metrics.scorer as scorer_module
    from sparsefinder.metrics.measures import EXTRA_METRICS

    gen = torch.Generator().manual_seed(3)
    n = 12
    golds = [torch.rand(2, n, n, generator=gen) < p for p in (0.1, 0.5, 0.5, 0.3)]
    record = _graph_record(golds, False, [None, 2, None, 4], [1.5] * 4, seed=3)
    scorer = scorer_module.Scorer(record)
    base = torch.rand(n, n, generator=gen) < 0.5
    preds = [base.expand(2, n, n)] * 4
    expected = [_by_definition(record, layer, preds[layer].clone()) for layer in range(4)]
    counts = []
    real, real_scan = scorer_module.count_true, scorer_module.scan.count_kept

    def counting(x: torch.Tensor) -> torch.Tensor:
        counts.append(tuple(x.shape))
        return real(x)

    def scanning(x: torch.Tensor, *runs: torch.Tensor) -> tuple:  # the CPU's compiled count
        counts.append(tuple(x.shape))
        return real_scan(x, *runs)

    monkeypatch.setattr(scorer_module, "count_true", counting)
    monkeypatch.setattr(scorer_module.scan, "count_kept", scanning)
    scores = scorer.score(preds)
    # layers 0 and 2 allow every pair: one count serves both; each window counts its own
    assert counts == [(1, n, n)] * 3
    for layer in range(4):
        for name in ("recall", "sparsity", *EXTRA_METRICS):
            assert torch.allclose(getattr(scores, name)[layer], expected[layer][name],
                                  rtol=0, atol=_metric_tol(name, n)), (name, layer)
    assert not torch.equal(scores.recall[0], scores.recall[1])  # not one gold for all
    assert scores.sparsity[1].tolist() != scores.sparsity[0].tolist()  # the window's own cut
    counts.clear()
    scorer.score([p.clone() for p in preds])  # per-head masks: one count per layer
    assert counts == [(2, n, n)] * 4


def test_shared_head_needs_three_axes_several_heads_and_a_zero_head_stride() -> None:
    from sparsefinder.metrics.scorer import shared_head

    base = torch.rand(4, 5) < 0.5
    for heads in (2, 3):
        found = shared_head(base.expand(heads, 4, 5))
        assert found is not None and torch.equal(found, base)
    one_row = (torch.rand(1, 5) < 0.5).expand(4, 5)
    found = shared_head(one_row.expand(3, 4, 5))
    assert found is not None and torch.equal(found, one_row)
    assert shared_head(base.expand(3, 4, 5).clone()) is None  # materialised per head
    assert shared_head(base) is None  # one (n, m) mask: no head axis
    assert shared_head(base.expand(2, 3, 4, 5)) is None  # not (heads, n, m)
    assert shared_head(torch.as_strided(base, (1, 4, 5), (0, 5, 1))) is None  # one head
    rows = (torch.rand(3, 1, 5) < 0.5).expand(3, 4, 5)  # a zero stride, but not the heads'
    assert shared_head(rows) is None
    single = torch.rand(3, 1, 5) < 0.5  # one query row: stride 5 on the head axis
    assert shared_head(single) is None
    assert shared_head(single[:1].expand(3, 1, 5)) is not None


def test_scorer_without_extras_still_gives_gold_sparsity_and_the_counted_layers() -> None:
    from sparsefinder.metrics.scorer import Scorer

    gold = torch.zeros(2, 4, 4, dtype=torch.bool)
    gold[0, 0, :2] = gold[1, 3, 3] = True  # 2 and 1 of 16 pairs
    record = _graph_record([gold, torch.ones_like(gold)], False, [None, None], [1.5, 1.0])
    scores = Scorer(record, extra=False).score([gold, gold])
    assert scores.precision is None
    assert scores.gold_sparsity.tolist() == [[1 - 2 / 16, 1 - 1 / 16], [0.0, 0.0]]
    assert scores.counted.tolist() == [True, False]  # the softmax layer is left out
    assert macro_average([scores])["recall"] == 1.0


def test_texts_that_disagree_on_softmax_layers_are_refused() -> None:
    from sparsefinder.metrics.scorer import counted_layers

    ones = torch.ones(2, 3, dtype=torch.float64)
    entmax = GraphScores(recall=ones, sparsity=ones, counted=torch.tensor([True, True]))
    mixed = GraphScores(recall=ones, sparsity=ones, counted=torch.tensor([True, False]))
    message = (r"^texts disagree on which layers are softmax; extract every record with the "
               r"same α per layer$")
    for texts in ([entmax, mixed], [mixed, entmax, entmax]):
        with pytest.raises(ValueError, match=message):
            counted_layers(texts)
        with pytest.raises(ValueError, match=message):
            macro_average(texts)
    assert counted_layers([mixed, mixed]).tolist() == [True, False]
    unknown = GraphScores(recall=ones, sparsity=ones)
    assert counted_layers([unknown, mixed]).tolist() == [True, False]
    assert counted_layers([unknown]).tolist() == [True, True]


def test_scorer_block_recalls_at_16_and_64_by_hand() -> None:
    """Two gold 16-tiles inside one 64-tile: a prediction touching only one of them has half
    the 16-tiles and the whole 64-tile (n ≠ m, so the 16-tile grid pads on one side only)."""
    from sparsefinder.metrics.scorer import Scorer

    gold = torch.zeros(1, 64, 40, dtype=torch.bool)
    gold[0, 0, 0] = gold[0, 20, 20] = True  # 16-tiles (0, 0) and (1, 1)
    pred = torch.zeros_like(gold)
    pred[0, 1, 1] = pred[0, 21, 5] = True  # tiles (0, 0) and (1, 0)
    record = _graph_record([gold], False, [None], [1.5])
    scores = Scorer(record).score([pred])
    assert scores.block_recall16.tolist() == [[0.5]]
    assert scores.block_recall64.tolist() == [[1.0]]
    assert scores.recall.tolist() == [[0.0]]
    far = torch.zeros_like(gold)
    far[0, 63, 39] = True  # the same 64-tile, a 16-tile without gold
    assert Scorer(record).score([far]).block_recall64.tolist() == [[1.0]]
    assert Scorer(record).score([far]).block_recall16.tolist() == [[0.0]]


def test_scorer_mass_recall_is_float64_and_a_share_of_a_partial_mass() -> None:
    """Rows need not sum to 1 (mass_recall's own convention): with a head's mass below 1
    the lost share is still divided by that mass, and the sums stay in float64."""
    from sparsefinder.metrics.scorer import Scorer

    gen = torch.Generator().manual_seed(11)
    n = 12
    golds = [torch.rand(3, n, n, generator=gen) < 0.5 for _ in range(2)]
    record = _graph_record(golds, False, [None, None], [1.5, 1.5], seed=11, share=0.05)
    preds = [torch.rand(3, n, n, generator=gen) < 0.5 for _ in range(2)]
    scores = Scorer(record).score(preds)
    for layer, pred in enumerate(preds):
        probs = record.layers[layer].probs().double()
        mass = probs.sum((-2, -1))
        assert (mass < 1).all() and (mass > 0).all()
        expected = (probs * pred).sum((-2, -1)) / mass
        assert torch.allclose(scores.mass_recall[layer], expected, rtol=0,
                              atol=ratio_tol(2 * n * n))  # float64 sums of n² probabilities


def test_scorer_never_counts_a_gold_pair_its_layer_does_not_allow() -> None:
    """A decoder record whose gold has future pairs: every metric sees the allowed pairs
    only, the extra path like :meth:`Scorer.layer` (whose counts cut them too)."""
    from sparsefinder.metrics.measures import exact_fraction, precision
    from sparsefinder.metrics.scorer import Scorer

    gen = torch.Generator().manual_seed(12)
    gold = torch.rand(2, 6, 6, generator=gen) < 0.5
    gold[:, 0, 5] = True  # a future pair in every head
    record = _record_of([gold], causal=True)
    pred = torch.rand(2, 6, 6, generator=gen) < 0.6
    scores = Scorer(record).score([pred])
    allowed = causal_mask(6, 6)
    cut_gold, cut_pred = gold & allowed, pred & allowed
    assert torch.equal(scores.recall, Scorer(record, extra=False).score([pred]).recall)
    assert torch.equal(scores.recall[0], recall(cut_pred, cut_gold))
    assert torch.allclose(scores.exact_fraction[0], exact_fraction(cut_pred, cut_gold))
    assert torch.allclose(scores.precision[0], precision(cut_pred, cut_gold))


def test_a_layer_graph_without_window_or_alpha_is_an_unwindowed_entmax_layer() -> None:
    """Graph objects that predate sliding windows and α (only gold and its probabilities)
    are scored with every pair allowed and counted in the averages."""
    from types import SimpleNamespace

    from sparsefinder.data.records import AttentionRecord
    from sparsefinder.metrics.scorer import Scorer

    gen = torch.Generator().manual_seed(13)
    gold = torch.rand(2, 5, 5, generator=gen) < 0.4
    bare = SimpleNamespace(gold=gold, prob_values=torch.ones(int(gold.sum())))
    record = AttentionRecord(text="x", tokens=["t"] * 5, offsets=[(0, 0)] * 5,
                             special=[False] * 5, causal=False, layers=[bare])
    pred = torch.rand(2, 5, 5, generator=gen) < 0.5
    scorer = Scorer(record)
    scores = scorer.score([pred])
    assert scorer.counted.tolist() == [True]
    assert torch.equal(scores.recall[0], recall(pred, gold))
    assert torch.equal(scores.sparsity[0], sparsity(pred))
    assert torch.equal(scorer.gold_sparsity[0], gold_sparsity(gold))


def test_segment_sums_keep_the_values_dtype_and_device() -> None:
    import warnings

    from sparsefinder.metrics.scorer import _segments

    ptr = torch.tensor([0, 1, 1, 4])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. an `out=` of the wrong size being resized
        ints = _segments(torch.tensor([1, 0, 2, 3], dtype=torch.int32), ptr)
        third = _segments(torch.full((4,), 1 / 3, dtype=torch.float64), ptr)
    assert ints.dtype == torch.int32 and ints.tolist() == [1, 0, 5]
    assert third.dtype == torch.float64
    assert third.tolist() == pytest.approx([1 / 3, 0.0, 1.0], abs=ratio_tol(0))
    meta = _segments(torch.zeros(4, device="meta"), ptr.to("meta"))
    assert meta.device.type == "meta" and meta.shape == (3,)


def test_scorer_extras_stay_on_the_masks_device() -> None:
    """The meta device stands in for a GPU (its nonzero assumed all-true: the shapes are all
    it checks); the gold index, probabilities and every metric follow the gold masks, even
    when the probabilities were left on the CPU."""
    import torch.fx.experimental._config as fx_config

    from sparsefinder.data.records import AttentionRecord, LayerGraph
    from sparsefinder.metrics.scorer import Scorer

    gold = torch.ones(2, 3, 3, dtype=torch.bool, device="meta")
    shared = torch.ones(3, 3, dtype=torch.bool, device="meta").expand(2, 3, 3)
    with fx_config.patch(meta_nonzero_assume_all_nonzero=True):  # torch's own, restored
        for causal, window in ((False, None), (True, None), (True, 2)):
            layer = LayerGraph(torch.zeros(2, 3, 2), torch.zeros(2, 3, 2), gold,
                               torch.ones(18), 1.5, sliding_window=window)
            record = AttentionRecord(text="x", tokens=["t"] * 3, offsets=[(0, 0)] * 3,
                                     special=[False] * 3, causal=causal, layers=[layer])
            scorer = Scorer(record)
            for pred in (gold, shared):
                metrics = scorer.score([pred]).metrics()
                assert len(metrics) == 7
                assert {value.device.type for value in metrics.values()} == {"meta"}


def test_scorer_rows_stay_exact_past_two_to_the_24_pairs() -> None:
    """A gold edge's row is its flat position // m: in float32 (exact only to 2**24) the
    last key of a late row would round up into the next row, past 4097² ≈ 2**24 + 8193."""
    from sparsefinder.metrics.scorer import Scorer

    n = 4097
    gold = torch.zeros(1, n, n, dtype=torch.bool)
    gold[0, -8:, -1] = True  # the last key of the last 8 rows
    pred = torch.zeros_like(gold)
    pred[0, -8::2, -1] = True  # rows n-8, n-6, n-4, n-2 keep their edge; the others miss
    scores = Scorer(_record_of([gold])).score([pred])
    assert scores.recall.tolist() == [[0.5]]
    assert scores.exact_fraction.tolist() == [[pytest.approx(1 - 4 / n, abs=ratio_tol(0))]]


def test_a_mask_and_its_transpose_in_one_call_are_not_taken_for_one_another() -> None:
    """Two views of the same memory (a square mask and its transpose share a data pointer)
    are different predictions: the memo keys on the view, so each layer is scored on its own."""
    gen = torch.Generator().manual_seed(11)
    n = 10
    golds = [torch.rand(2, n, n, generator=gen) < 0.4 for _ in range(2)]
    record = _graph_record(golds, False, [None, None], [1.5, 1.5], seed=11)
    base = torch.rand(n, n, generator=gen) < 0.3
    base[0, 1:] = True  # not symmetric: the transpose keeps other pairs
    preds = [base.expand(2, n, n), base.t().expand(2, n, n)]
    assert preds[0].data_ptr() == preds[1].data_ptr()
    scores = Scorer(record).score(preds)
    for layer in range(2):
        expected = _by_definition(record, layer, preds[layer].clone())
        for name in ("recall", "precision"):
            assert torch.allclose(getattr(scores, name)[layer], expected[name], rtol=0,
                                  atol=_metric_tol(name, n))
