"""Pronoun → antecedent candidates for ANY text, so the coreference demo runs on your own.

The bundled probes (:mod:`sparsefinder.analysis.coref`) are annotated by hand. For a pasted text we
propose pairs from spaCy's tags alone (the project's trimmed pipeline has no parser or
coreference model): each third-person pronoun is paired with the nearest preceding nouns
(NOUN/PROPN) that agree in number (they/them/their → plural tags NNS/NNPS; he/she/it… →
singular). These are *candidates*, not a resolution — the page lets the user pick which
pairs count, or name a pair by hand — and heads are then ranked on the chosen pairs exactly
as on the probes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sparsefinder.analysis.coref import CorefPair, Probe
from sparsefinder.analysis.pos import load_nlp

SINGULAR = frozenset({"he", "him", "his", "himself", "she", "her", "hers", "herself",
                      "it", "its", "itself"})
PLURAL = frozenset({"they", "them", "their", "theirs", "themselves"})
_NOUNS = ("NOUN", "PROPN")


@dataclass(frozen=True)
class Word:
    """One spaCy token of the text: its character span, text and tags."""

    start: int
    end: int
    text: str
    pos: str
    tag: str


def words(text: str) -> list[Word]:
    """spaCy's tokens of ``text`` (the pipeline of :func:`sparsefinder.analysis.pos.load_nlp`)."""
    doc = load_nlp()(text)
    return [Word(t.idx, t.idx + len(t.text), t.text, t.pos_, t.tag_) for t in doc
            if not t.is_space]


def _agrees(pronoun: str, noun: Word) -> bool:
    plural = noun.tag in ("NNS", "NNPS")
    return plural if pronoun in PLURAL else not plural


def propose_pairs(text: str, per_pronoun: int = 2, tokens: Sequence[Word] | None = None
                  ) -> list[CorefPair]:
    """Candidate (pronoun, antecedent) pairs: each third-person pronoun with its
    ``per_pronoun`` nearest preceding number-agreeing nouns, nearest first."""
    if per_pronoun < 1:
        raise ValueError(f"per_pronoun must be >= 1, got {per_pronoun}")
    tokens = list(tokens) if tokens is not None else words(text)
    pairs = []
    for index, word in enumerate(tokens):
        lower = word.text.lower()
        if lower not in SINGULAR | PLURAL:
            continue
        found = 0
        for noun in reversed(tokens[:index]):
            if noun.pos in _NOUNS and _agrees(lower, noun):
                pairs.append(CorefPair((word.start, word.end), (noun.start, noun.end)))
                found += 1
                if found == per_pronoun:
                    break
    return pairs


def pair_label(text: str, pair: CorefPair) -> str:
    """``"she@34 → engineer@4"``: the words and where they start."""
    (ps, pe), (as_, ae) = pair.pronoun, pair.antecedent
    return f"{text[ps:pe]}@{ps} → {text[as_:ae]}@{as_}"


def text_probe(text: str, pairs: Sequence[CorefPair], name: str = "your text") -> Probe:
    """A probe made of the user's text and chosen pairs (ranked like a bundled probe)."""
    if not pairs:
        raise ValueError("choose at least one pronoun → antecedent pair (or name one by hand)")
    return Probe(id=name, text=text, pairs=tuple(pairs))
