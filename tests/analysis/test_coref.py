"""Coreference probes: loading, span → token mapping, head ranking, pronoun-edge recall."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sparsefinder.analysis.coref import (
    DEFAULT_PROBES,
    CorefPair,
    Probe,
    ProbeFileError,
    evaluate_head,
    load_probes,
    pair_masses,
    pair_tokens,
    pronoun_edge_recall,
    rank_heads,
    span_tokens,
    split_probes,
)
from sparsefinder.data.records import AttentionRecord, LayerGraph

TEXT = "Priya thanked the movers because they carried her piano."


def test_bundled_probes_load():
    probes = load_probes()
    assert len(probes) == 108 and all(p.pairs for p in probes)
    choose, heldout = split_probes(probes)
    assert len(choose) == 62 and len(heldout) == 46 and choose[0].split == "choose"
    assert all(p.split == "heldout" for p in heldout) and heldout[0].id == "p43"
    assert all(p.set is None for p in choose)
    fresh = [p for p in heldout if p.set == "fresh"]
    assert len(fresh) == 32 and fresh[0].id == "p77" and {p.set for p in heldout} == {None, "fresh"}
    assert sum(len(p.pairs) for p in choose) == 186 and sum(len(p.pairs) for p in fresh) == 138
    assert [p.split for p in load_probes(include_cataphora=False)].count("heldout") == 46
    with_cataphora = sum(len(p.pairs) for p in probes)
    without = sum(len(p.pairs) for p in load_probes(include_cataphora=False))
    assert without < with_cataphora
    assert any(pair.cataphora for p in probes for pair in p.pairs)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not readable JSON"),
        (json.dumps({"probes": []}), "non-empty list 'probes'"),
        (json.dumps({"probes": [{"id": "p1", "text": "He ran.", "pairs": []}]}), "pairs"),
        (
            json.dumps(
                {
                    "probes": [
                        {
                            "id": "p1",
                            "text": "He ran.",
                            "pairs": [{"pronoun": [0, 2], "antecedent": [5, 99]}],
                        }
                    ]
                }  # fmt: skip
            ),
            "antecedent",
        ),
        (json.dumps({"probes": [{"id": "p1", "split": "heldout", "set": "Fresh!",
                                 "text": "Ann ran; she won.",
                                 "pairs": [{"pronoun": [9, 12], "antecedent": [0, 3]}]}]}),
         "'set' must be a lower-case name"),
        (json.dumps({"probes": [{"id": "p1", "split": "heldout", "set": "heldout",
                                 "text": "Ann ran; she won.",
                                 "pairs": [{"pronoun": [9, 12], "antecedent": [0, 3]}]}]}),
         "not a split"),
        (json.dumps({"probes": [{"id": "p1", "set": "fresh", "text": "Ann ran; she won.",
                                 "pairs": [{"pronoun": [9, 12], "antecedent": [0, 3]}]}]}),
         "only for held-out probes"),
    ],
)
def test_corrupt_probe_file_names_the_file(tmp_path, content, message):
    path = tmp_path / "probes.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ProbeFileError, match=message) as info:
        load_probes(path)
    assert str(path) in str(info.value)


def test_missing_probe_file(tmp_path):
    with pytest.raises(ProbeFileError, match="not found"):
        load_probes(tmp_path / "nope.json")
    assert DEFAULT_PROBES.is_file()


def test_span_to_tokens_on_real_tokenizer_with_multi_piece_words(default_tokenizer):
    enc = default_tokenizer(TEXT, return_offsets_mapping=True, return_special_tokens_mask=True)
    tokens = default_tokenizer.convert_ids_to_tokens(enc["input_ids"])
    offsets, special = enc["offset_mapping"], enc["special_tokens_mask"]
    name = span_tokens(offsets, (0, 5), special)
    assert [tokens[i] for i in name] == ["pri", "##ya"]  # one word, two pieces
    movers = TEXT.index("movers")
    assert [tokens[i] for i in span_tokens(offsets, (movers, movers + 6), special)] == [
        "move",
        "##rs",
    ]
    they = TEXT.index("they")
    assert [tokens[i] for i in span_tokens(offsets, (they, they + 4), special)] == ["they"]
    # a span cutting into a word still covers the whole piece it touches
    assert [tokens[i] for i in span_tokens(offsets, (1, 2), special)] == ["pri"]
    # special tokens ([CLS] at (0, 0)) never match
    assert 0 not in span_tokens(offsets, (0, len(TEXT)), special)


def _record(text: str, probs: torch.Tensor) -> AttentionRecord:
    """A record of ``len(text.split())`` one-word tokens with given (layers, heads, n, n)."""
    words, offsets, start = text.split(), [], 0
    for word in words:
        start = text.index(word, start)
        offsets.append((start, start + len(word)))
        start += len(word)
    layers = [
        LayerGraph(
            queries=torch.zeros(probs.shape[1], len(words), 2),
            keys=torch.zeros(probs.shape[1], len(words), 2),
            gold=p > 0,
            prob_values=p[p > 0],
            scaling=1.0,
        )
        for p in probs
    ]
    return AttentionRecord(
        text=text, tokens=words, offsets=offsets, special=[False] * len(words), causal=False,
        layers=layers,
    )  # fmt: skip


def _planted(n: int, pronoun: int, antecedent: int, layers=2, heads=3, planted=(1, 2)):
    """Uniform attention everywhere, except the planted head: 0.9 pronoun → antecedent."""
    probs = torch.full((layers, heads, n, n), 1.0 / n)
    row = torch.full((n,), 0.1 / (n - 1))
    row[antecedent] = 0.9
    probs[planted[0], planted[1], pronoun] = row
    return probs


def test_planted_head_is_ranked_first():
    texts = ["Anna said she was tired", "The dog lost its ball again"]
    probes = [
        Probe("a", texts[0], (CorefPair((10, 13), (0, 4)),)),
        Probe("b", texts[1], (CorefPair((13, 16), (4, 7)),)),
    ]
    records = [_record(texts[0], _planted(5, 2, 0)), _record(texts[1], _planted(6, 3, 1))]
    ranking = rank_heads(records, probes)
    best = ranking.iloc[0]
    assert (best["layer"], best["head"], best["rank"]) == (1, 2, 1)
    assert best["mass"] == pytest.approx(0.9) and best["hit_rate"] == 1.0
    assert ranking.iloc[1]["mass"] == pytest.approx(np.mean([1 / 5, 1 / 6]))
    assert len(ranking) == 6 and ranking["n_pairs"].eq(2).all()


def test_pair_mass_averages_over_pronoun_pieces():
    probs = torch.zeros(1, 3, 3)
    probs[0, 0] = torch.tensor([0.2, 0.3, 0.5])
    probs[0, 1] = torch.tensor([0.0, 0.0, 1.0])
    pairs = pair_tokens(
        _record("xx yy zz", probs[None]),
        Probe("p", "xx yy zz", (CorefPair((0, 5), (6, 8)),)),
    )
    assert pair_masses(probs, pairs).item() == pytest.approx((0.5 + 1.0) / 2)


def test_pronoun_recall_is_one_when_prediction_covers_gold():
    text = "Anna said she was tired"
    probs = _planted(5, 2, 0)
    record = _record(text, probs)
    probe = Probe("a", text, (CorefPair((10, 13), (0, 4)),))
    pairs = pair_tokens(record, probe)
    gold = record.layers[1].gold
    superset = gold | (torch.rand(gold.shape, generator=torch.Generator().manual_seed(0)) > 0.5)
    assert pronoun_edge_recall(superset, record, pairs, layer=1).tolist() == [1.0, 1.0, 1.0]
    missing = superset.clone()
    missing[:, 2, 0] = False  # drop exactly the pronoun → antecedent edge
    assert pronoun_edge_recall(missing, record, pairs, layer=1).tolist() == [0.0, 0.0, 0.0]
    full = evaluate_head([record], [probe], [gold.clone()], layer=1, head=2)
    assert full["pronoun_recall"] == 1.0 and full["pronoun_gold_edges"] == 1
    assert full["head_recall"] == 1.0 and full["sparsity"] == pytest.approx(0.0)


def test_record_must_match_probe():
    record = _record("Anna said she was tired", _planted(5, 2, 0))
    with pytest.raises(ValueError, match="does not match probe"):
        pair_tokens(record, Probe("x", "other text", (CorefPair((0, 1), (2, 3)),)))
