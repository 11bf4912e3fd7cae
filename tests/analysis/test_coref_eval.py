"""Any method on a coreference head: the choice reads the choose probes only."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from sparsefinder.analysis.coref import CorefPair, Probe, evaluate_head
from sparsefinder.analysis.coref_eval import (
    choose_setting,
    evaluate_settings,
    mark_choice,
    predict_layer_masks,
)
from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.learned_parts import LearnedParts
from sparsefinder.methods.spec import PredictorSpec
from sparsefinder.predictors.window import Window

LAYER, HEAD = 1, 2


def _probe(pid: str, text: str, pronoun: int, antecedent: int, split: str) -> Probe:
    """One pair between words ``pronoun`` and ``antecedent`` of a space-separated text."""
    words = text.split()
    starts = [sum(len(w) + 1 for w in words[:i]) for i in range(len(words))]
    span = lambda i: (starts[i], starts[i] + len(words[i]))  # noqa: E731
    return Probe(pid, text, (CorefPair(span(pronoun), span(antecedent)),), split)


def _record(probe: Probe, layers: int = 2, heads: int = 3) -> AttentionRecord:
    """Dense gold (every edge) on one-word tokens: every pronoun→antecedent edge is gold."""
    words = probe.text.split()
    n, offsets, start = len(words), [], 0
    for word in words:
        start = probe.text.index(word, start)
        offsets.append((start, start + len(word)))
        start += len(word)
    probs = torch.full((heads, n, n), 1.0 / n)
    graphs = [LayerGraph(queries=torch.randn(heads, n, 4), keys=torch.randn(heads, n, 4),
                         gold=probs > 0, prob_values=probs.flatten(), scaling=1.0)
              for _ in range(layers)]
    return AttentionRecord(text=probe.text, tokens=words, offsets=offsets,
                           special=[False] * n, causal=False, layers=graphs)


def _split(*probes: Probe) -> tuple[list[AttentionRecord], list[Probe]]:
    return [_record(p) for p in probes], list(probes)


# choose: the antecedent 1 token before its pronoun; held out: 3 tokens before
CHOOSE = _split(_probe("c1", "Tom he ran home fast and far away", 1, 0, "choose"),
                _probe("c2", "the cat saw Maria she smiled at it", 4, 3, "choose"))
HELDOUT = _split(_probe("h1", "Anna was very sure she knew it well", 4, 0, "heldout"))
WINDOWS = [PredictorSpec.of("window", {"window": w}) for w in (1, 3, 7, 41)]


def test_a_method_keeping_everything_has_recall_one_and_sparsity_zero():
    table = evaluate_settings(WINDOWS, LearnedParts(), CHOOSE, HELDOUT, LAYER, HEAD)
    everything = table.iloc[-1]
    for split in ("choose", "heldout"):
        assert everything[f"{split}_pronoun_recall"] == 1.0
        assert everything[f"{split}_sparsity"] == 0.0 and everything[f"{split}_head_recall"] == 1
    diagonal = table.iloc[0]  # window 1: the diagonal only, never a pronoun→antecedent edge
    assert diagonal["choose_pronoun_recall"] == 0.0 and diagonal["heldout_pronoun_recall"] == 0
    assert diagonal["choose_sparsity"] == pytest.approx(1 - 1 / 8)
    assert table["choose_pronoun_gold_edges"].tolist() == [2] * 4
    assert table["method"].eq("window").all() and table["setting"][1] == "window window=3"


def test_masks_are_the_predictors_own_on_the_head():
    masks = predict_layer_masks(WINDOWS[1], LearnedParts(), CHOOSE[0], LAYER)
    record = CHOOSE[0][0]
    graph = record.layers[LAYER]
    assert torch.equal(masks[0], Window(3).predict(graph.queries, graph.keys, causal=False))
    scores = evaluate_head(CHOOSE[0], CHOOSE[1], masks, LAYER, HEAD)
    assert scores["pronoun_recall"] == 1.0  # |i - j| = 1 ≤ 3 // 2


def test_choice_is_the_sparsest_reaching_recall_on_choose_then_measured_on_held_out():
    table = mark_choice(evaluate_settings(WINDOWS, LearnedParts(), CHOOSE, HELDOUT, LAYER, HEAD))
    chosen = table[table["chosen"]]
    assert len(chosen) == 1 and chosen["setting"].item() == "window window=3"
    assert chosen["reached"].item() and chosen["choose_pronoun_recall"].item() == 1.0
    # the held-out pronoun is 4 tokens from its antecedent: the chosen window misses it
    assert chosen["heldout_pronoun_recall"].item() == 0.0


def test_held_out_probes_never_change_the_choice():
    other = _split(_probe("h2", "Tom he said", 1, 0, "heldout"),
                   _probe("h3", "a b c d e f g h i j k Ben x y z w v u t s q his",
                          21, 11, "heldout"))
    first = mark_choice(evaluate_settings(WINDOWS, LearnedParts(), CHOOSE, HELDOUT, LAYER, HEAD))
    second = mark_choice(evaluate_settings(WINDOWS, LearnedParts(), CHOOSE, other, LAYER, HEAD))
    none = mark_choice(evaluate_settings(WINDOWS, LearnedParts(), CHOOSE, ([], []), LAYER, HEAD))
    assert not first["heldout_pronoun_recall"].equals(second["heldout_pronoun_recall"])
    choose_cols = [c for c in first.columns if c.startswith("choose_")] + ["chosen"]
    pd.testing.assert_frame_equal(first[choose_cols], second[choose_cols])
    pd.testing.assert_frame_equal(first[choose_cols], none[choose_cols])
    assert none["heldout_pronoun_recall"].isna().all()


def test_a_held_out_set_is_scored_alone_from_the_same_predictions():
    """``heldout_sets``: some held-out probes also scored on their own; nothing else moves."""
    far = _probe("h4", "a b c d e f g h i j k Ben x y z w v u t s q his", 21, 11, "heldout")
    held = _split(HELDOUT[1][0], far)
    plain = evaluate_settings(WINDOWS, LearnedParts(), CHOOSE, held, LAYER, HEAD)
    table = evaluate_settings(WINDOWS, LearnedParts(), CHOOSE, held, LAYER, HEAD,
                              heldout_sets={"fresh": [1]})
    pd.testing.assert_frame_equal(table[plain.columns], plain)
    alone = evaluate_settings(WINDOWS, LearnedParts(), CHOOSE, _split(far), LAYER, HEAD)
    for score in ("pronoun_recall", "pronoun_gold_edges", "sparsity"):
        assert table[f"fresh_{score}"].tolist() == alone[f"heldout_{score}"].tolist()
    assert table["fresh_pronoun_recall"].tolist() == [0, 0, 0, 1]  # 10 tokens apart: window 41
    assert not table["fresh_sparsity"].equals(table["heldout_sparsity"])
    for bad in ({"choose": [0]}, {"fresh": []}):
        with pytest.raises(ValueError, match="held-out set"):
            evaluate_settings(WINDOWS, LearnedParts(), CHOOSE, held, LAYER, HEAD, heldout_sets=bad)


def _table(recall, sparsity, heldout=None) -> pd.DataFrame:
    n = len(recall)
    return pd.DataFrame({"method": ["m"] * n, "choose_pronoun_recall": recall,
                         "choose_sparsity": sparsity,
                         "heldout_pronoun_recall": heldout or [0.5] * n})


def test_choose_setting_rules_read_the_choose_columns_only():
    table = _table([0.95, 0.85, 0.79, 0.5], [0.5, 0.7, 0.9, 0.95])
    assert choose_setting(table) == 1  # sparsest with recall ≥ 0.8
    assert choose_setting(table, 0.99) == 0  # none reaches: the best recall
    assert choose_setting(table, min_sparsity=0.75) == 2  # best recall with sparsity ≥ 0.75
    assert choose_setting(table, min_sparsity=0.99) == 3  # none reaches: the sparsest
    flipped = _table([0.95, 0.85, 0.79, 0.5], [0.5, 0.7, 0.9, 0.95], [1.0, 0.0, 0.0, 1.0])
    assert choose_setting(flipped) == 1 and choose_setting(flipped, min_sparsity=0.75) == 2
    ties = _table([0.9, 0.9, math.nan], [0.8, 0.8, 0.99])
    assert choose_setting(ties) == 0  # equal: the first; NaN recall never reaches
    with pytest.raises(ValueError, match="no setting"):
        choose_setting(table.iloc[:0])


def test_each_method_gets_its_own_choice():
    table = pd.concat([_table([0.9, 0.8], [0.5, 0.6]),
                       _table([0.9, 0.1], [0.7, 0.9]).assign(method="n")], ignore_index=True)
    marked = mark_choice(table)
    assert marked["chosen"].tolist() == [False, True, True, False]
    assert marked["reached"].tolist() == [True, True, True, False]
