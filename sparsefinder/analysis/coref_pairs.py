"""Pronoun → antecedent candidates for ANY text, so the coreference demo runs on your own.

The bundled probes (:mod:`sparsefinder.analysis.coref`) are annotated by hand. For a pasted text we
propose pairs from spaCy's tags, morphology and named entities (the project's trimmed pipeline has
no parser or coreference model), plus the small word lists of :mod:`.coref_lexicon`. Each
third-person pronoun is paired with the ``per_pronoun`` nearest preceding *mentions* that agree
with it (:func:`agrees`):

* **he/him/his/himself** — a singular person that may be male (a PERSON name, a given name of
  the lexicon, a person noun such as *brother* or *doctor*) or an animal; **she/her/hers/
  herself** likewise for female. Gender comes from spaCy's ``Gender`` feature of the pronoun and
  the lexicon's gender of the noun (``""`` = either).
* **it/its/itself** — a singular noun that is *not* a person (animals and groups are fine).
* **they/them/their/theirs/themselves** — a plural noun (``NNS``/``NNPS``) or a group noun
  (*committee*, *family*); no animacy constraint.

A mention is a noun (NOUN/PROPN) that heads its compound (*coffee* in "coffee machine" is
skipped), or a whole PERSON name ("Marta Jones"); nouns inside DATE/TIME/number entities
("last week", "two days") and quantifiers ("none", "someone") are never antecedents. The pairs
are *automatic guesses* (``source="auto"``), not a resolution — the page lets the user pick
which pairs count, or name a pair by hand — and heads are then ranked on the chosen pairs
exactly as on the probes.
:func:`candidate_quality` measures them against the probes' hand annotation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sparsefinder.analysis import coref_lexicon as lex
from sparsefinder.analysis.coref import CorefPair, Probe
from sparsefinder.analysis.pos import load_nlp

MASCULINE = frozenset({"he", "him", "his", "himself"})
FEMININE = frozenset({"she", "her", "hers", "herself"})
NEUTER = frozenset({"it", "its", "itself"})
SINGULAR = MASCULINE | FEMININE | NEUTER
PLURAL = frozenset({"they", "them", "their", "theirs", "themselves"})
_NOUNS = ("NOUN", "PROPN")
#: Entity types whose nouns are never antecedents (times, dates, amounts).
_NON_REFERRING = frozenset({"DATE", "TIME", "CARDINAL", "ORDINAL", "QUANTITY", "PERCENT",
                            "MONEY"})
#: Quantifier words spaCy sometimes tags NOUN ("none of them"): never antecedents.
_QUANTIFIERS = frozenset({"none", "nothing", "nobody", "someone", "somebody", "something",
                          "anyone", "anybody", "anything", "everyone", "everybody",
                          "everything"})


@dataclass(frozen=True)
class Word:
    """One spaCy token of the text: its character span, text, tags, morphology and entity
    (``ent``: spaCy's type such as ``"PERSON"``; ``ent_iob``: ``"B"``, ``"I"``, ``"O"``)."""

    start: int
    end: int
    text: str
    pos: str
    tag: str
    morph: str = ""
    ent: str = ""
    ent_iob: str = ""


@dataclass(frozen=True)
class Mention:
    """A candidate antecedent: its span, whether it is plural, a person, an animal, a group,
    and its gender (``"m"``, ``"f"``, ``""`` for unknown/either)."""

    start: int
    end: int
    plural: bool
    person: bool
    animal: bool = False
    group: bool = False
    gender: str = ""


def words(text: str) -> list[Word]:
    """spaCy's tokens of ``text`` (:func:`sparsefinder.analysis.pos.load_nlp` with NER)."""
    doc = load_nlp(ner=True)(text)
    return [Word(t.idx, t.idx + len(t.text), t.text, t.pos_, t.tag_, str(t.morph),
                 t.ent_type_, t.ent_iob_) for t in doc if not t.is_space]


def _feature(word: Word, name: str) -> str:
    for item in word.morph.split("|"):
        key, _, value = item.partition("=")
        if key == name:
            return value
    return ""


def pronoun_features(word: Word) -> tuple[str, bool] | None:
    """``(gender, plural)`` of a third-person pronoun (``"m"``, ``"f"``, ``"n"``, or ``""`` for
    they), or None for any other word. spaCy's ``Gender``/``Number`` win over the word lists."""
    lower = word.text.lower()
    if lower not in SINGULAR | PLURAL:
        return None
    gender = {"Masc": "m", "Fem": "f", "Neut": "n"}.get(_feature(word, "Gender"), "")
    if not gender and lower in SINGULAR:
        gender = "m" if lower in MASCULINE else "f" if lower in FEMININE else "n"
    number = _feature(word, "Number")
    plural = number == "Plur" if number else lower in PLURAL
    return gender, plural


def _plural(word: Word) -> bool:
    number = _feature(word, "Number")
    return number == "Plur" if number else word.tag in ("NNS", "NNPS")


def _title_gender(tokens: Sequence[Word], index: int) -> str | None:
    if index == 0:
        return None
    return lex.TITLES.get(tokens[index - 1].text.lower().rstrip("."))


def mentions(tokens: Sequence[Word]) -> list[tuple[int, Mention]]:
    """Candidate antecedents in text order, each with the index of its last token."""
    out: list[tuple[int, Mention]] = []
    i = 0
    while i < len(tokens):
        word = tokens[i]
        if (word.pos not in _NOUNS or word.ent in _NON_REFERRING
                or word.text.lower() in _QUANTIFIERS):
            i += 1
            continue
        name = word.pos == "PROPN" and word.text in lex.FIRST_NAMES
        title = _title_gender(tokens, i) if word.pos == "PROPN" else None
        if word.ent == "PERSON" or name or title is not None:
            last = i
            while (last + 1 < len(tokens) and tokens[last + 1].pos == "PROPN"
                   and tokens[last + 1].ent not in _NON_REFERRING
                   and (tokens[last + 1].ent_iob == "I" or tokens[last + 1].text.istitle())):
                last += 1
            gender = title if title is not None else lex.FIRST_NAMES.get(
                word.text, lex.PERSON_NOUNS.get(word.text.lower(), ""))  # "Grandpa"
            out.append((last, Mention(word.start, tokens[last].end, _plural(tokens[last]),
                                      person=True, gender=gender)))
            i = last + 1
            continue
        following = tokens[i + 1] if i + 1 < len(tokens) else None
        if following is not None and following.pos in _NOUNS and following.ent != "PERSON":
            i += 1  # a compound modifier ("coffee" in "coffee machine"): its head comes next
            continue
        lower = word.text.lower()
        person = lex.person_noun_gender(lower) if word.pos == "NOUN" else None
        animal = lex.ANIMALS.get(lower)
        out.append((i, Mention(
            word.start, word.end, _plural(word), person=person is not None,
            animal=animal is not None, group=lower in lex.COLLECTIVE_NOUNS,
            gender=person if person is not None else animal or "")))
        i += 1
    return out


def agrees(gender: str, plural: bool, mention: Mention) -> bool:
    """Whether a pronoun of ``gender``/``plural`` (:func:`pronoun_features`) may refer to
    ``mention`` (the rules of the module docstring)."""
    if plural:
        return mention.plural or mention.group
    if mention.plural:
        return False
    if gender == "n":
        return not mention.person
    if gender in ("m", "f"):
        return (mention.person or mention.animal) and mention.gender in ("", gender)
    return True


def propose_pairs(text: str, per_pronoun: int = 2, tokens: Sequence[Word] | None = None
                  ) -> list[CorefPair]:
    """Candidate (pronoun, antecedent) pairs, ``source="auto"``: each third-person pronoun with
    its ``per_pronoun`` nearest preceding agreeing mentions, nearest first."""
    if per_pronoun < 1:
        raise ValueError(f"per_pronoun must be >= 1, got {per_pronoun}")
    tokens = list(tokens) if tokens is not None else words(text)
    found = mentions(tokens)
    pairs = []
    for index, word in enumerate(tokens):
        features = pronoun_features(word)
        if features is None:
            continue
        before = [m for last, m in found if last < index and agrees(*features, m)]
        pairs += [CorefPair((word.start, word.end), (m.start, m.end), source="auto")
                  for m in reversed(before[-per_pronoun:])]
    return pairs


def candidate_quality(probes: Sequence[Probe], per_pronoun: int = 1,
                      propose: Callable[..., list[CorefPair]] = propose_pairs
                      ) -> dict[str, float]:
    """Precision and recall of the candidates against the probes' annotated pairs (pooled).

    A proposed pair is right when an annotated pair has the same pronoun span and an
    antecedent span overlapping it. ``precision`` = right / proposed; ``recall`` = annotated
    pairs found / annotated pairs (cataphora included, which the candidates never propose);
    ``recall_anaphora`` leaves cataphora out. Measured on the very annotation the word lists
    were checked against: a heuristic on its own reference, not a held-out score."""
    proposed = right = found = gold = gold_anaphora = found_anaphora = 0
    for probe in probes:
        pairs = propose(probe.text, per_pronoun=per_pronoun)
        proposed += len(pairs)

        def hit(p: CorefPair, g: CorefPair) -> bool:
            return (p.pronoun == g.pronoun and p.antecedent[0] < g.antecedent[1]
                    and g.antecedent[0] < p.antecedent[1])

        right += sum(any(hit(p, g) for g in probe.pairs) for p in pairs)
        for g in probe.pairs:
            ok = any(hit(p, g) for p in pairs)
            found += ok
            gold += 1
            if not g.cataphora:
                found_anaphora += ok
                gold_anaphora += 1
    return {"precision": right / proposed if proposed else float("nan"),
            "recall": found / gold if gold else float("nan"),
            "recall_anaphora": found_anaphora / gold_anaphora if gold_anaphora else float("nan"),
            "proposed": proposed, "annotated": gold}


def pair_label(text: str, pair: CorefPair) -> str:
    """``"she@34 → engineer@4"``: the words and where they start (exact, for tests and logs;
    people read :func:`pair_names`)."""
    (ps, pe), (as_, ae) = pair.pronoun, pair.antecedent
    return f"{text[ps:pe]}@{ps} → {text[as_:ae]}@{as_}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def span_name(text: str, words: Sequence[Word], span: tuple[int, int]) -> str:
    """The words of ``span`` as a reader names them: ``"report"``, or ``"he (2nd)"`` when the
    text has them more than once (counted whole-word, in any case: "He … he" are the 1st and
    2nd "he")."""
    start, end = span
    shown = text[start:end]
    wanted = shown.lower()
    ends = {w.end for w in words}
    places = [w.start for w in words if text[w.start:w.start + len(shown)].lower() == wanted
              and w.start + len(shown) in ends]
    if len(places) < 2 or start not in places:
        return shown
    return f"{shown} ({_ordinal(places.index(start) + 1)})"


def pair_names(text: str, words: Sequence[Word], pair: CorefPair) -> str:
    """``"its → report"``, ``"he (2nd) → Priya"``: a pair named by its words (a place among
    equal words only where the text repeats them), as the page's chips show it."""
    return f"{span_name(text, words, pair.pronoun)} → {span_name(text, words, pair.antecedent)}"


#: English function words are 40–60 % of the words of English prose (the bundled examples:
#: 0.42–0.61), under 10 % of German, French, Spanish, Italian or Dutch prose; a text whose
#: share is below this is not English. Fewer than ``_FEW_WORDS`` words: not judged.
ENGLISH_SHARE = 0.25
_FEW_WORDS = 5


def looks_english(words: Sequence[Word]) -> bool | None:
    """Whether the text of ``words`` reads as English (the automatic guesses read English
    only: spaCy's English pipeline and English word lists): True, False, or None for a text
    too short to tell."""
    from spacy.lang.en.stop_words import STOP_WORDS

    plain = [w.text.lower() for w in words if w.text.isalpha()]
    if len(plain) < _FEW_WORDS:
        return None
    return sum(w in STOP_WORDS for w in plain) / len(plain) >= ENGLISH_SHARE


def text_probe(text: str, pairs: Sequence[CorefPair], name: str = "your text") -> Probe:
    """A probe made of the user's text and chosen pairs (ranked like a bundled probe)."""
    if not pairs:
        raise ValueError("choose at least one pronoun → antecedent pair (or name one by hand)")
    return Probe(id=name, text=text, pairs=tuple(pairs))
