"""Recall (paper Eq. 4), sparsity (Eq. 5) and their macro-averaging."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsefinder.masks import causal_mask
from sparsefinder.metrics import (
    GraphScores,
    count_true,
    gold_sparsity,
    macro_average,
    n_allowed_pairs,
    recall,
    score_layers,
    sparsity,
)

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
    from sparsefinder.graphs import AttentionRecord, LayerGraph

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
    from sparsefinder.metrics import Scorer

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


def test_scorer_names_the_layer_of_a_bad_prediction() -> None:
    from sparsefinder.metrics import Scorer

    scorer = Scorer(_scored_record(5, False))
    with pytest.raises(ValueError, match="layer 1: pred"):
        scorer.layer(1, torch.zeros(3, 4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="2 gold layers"):
        scorer.score([torch.zeros(3, 5, 5, dtype=torch.bool)])
    with pytest.raises(ValueError, match="bool"):
        scorer.layer(0, torch.zeros(3, 5, 5))
