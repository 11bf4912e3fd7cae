"""Pronoun → antecedent candidates for a user's own text (spaCy tags, number agreement)."""

from __future__ import annotations

import pytest

from sparsefinder.analysis import coref
from sparsefinder.analysis.coref_pairs import (
    Word,
    pair_label,
    propose_pairs,
    text_probe,
    words,
)


def test_proposals_pair_pronouns_with_preceding_agreeing_nouns():
    text = "The engineers met the manager. They told her that the servers crashed."
    pairs = propose_pairs(text, per_pronoun=1)
    labels = [pair_label(text, p) for p in pairs]
    assert labels == ["They@31 → engineers@4", "her@41 → manager@22"]
    assert all(p.antecedent[1] <= p.pronoun[0] for p in pairs)  # never cataphora


def test_hand_made_tags_control_agreement_and_order():
    tokens = [Word(0, 3, "Ann", "PROPN", "NNP"), Word(4, 8, "dogs", "NOUN", "NNS"),
              Word(9, 12, "cat", "NOUN", "NN"), Word(13, 15, "it", "PRON", "PRP"),
              Word(16, 20, "them", "PRON", "PRP")]
    pairs = propose_pairs("x" * 20, per_pronoun=2, tokens=tokens)
    assert [(p.pronoun, p.antecedent) for p in pairs] == [
        ((13, 15), (9, 12)), ((13, 15), (0, 3)), ((16, 20), (4, 8))]
    with pytest.raises(ValueError, match="per_pronoun"):
        propose_pairs("x", per_pronoun=0)


def test_a_text_probe_ranks_heads_like_a_bundled_probe(default_model):
    from sparsefinder.explore import inputs

    text = "The doctor called the nurse because she needed help with the patient."
    probe = text_probe(text, propose_pairs(text, per_pronoun=1))
    record, _ = inputs.extract_one(default_model, text)
    ranking = coref.rank_heads([record], [probe])
    assert len(ranking) == record.num_layers * record.num_heads
    assert ranking["mass"].is_monotonic_decreasing and (ranking["n_pairs"] == 1).all()
    best = ranking.iloc[0]
    pair = coref.pair_tokens(record, probe)[0]
    probs = record.layers[int(best["layer"])].probs()[int(best["head"])]
    mass = probs[pair.pronoun][:, pair.antecedent].sum(-1).mean()
    assert float(mass) == pytest.approx(float(best["mass"]))
    with pytest.raises(ValueError, match="at least one"):
        text_probe(text, [])
    assert [w.text for w in words("She left.")] == ["She", "left", "."]
