"""sparsefinder.explore.texts: custom texts in links (compressed or by content hash)."""

from __future__ import annotations

import pytest

from sparsefinder.explore import texts


def test_short_text_round_trips_through_the_link():
    text = "Héllo — a pasted text with émoji 🍕\nand two lines."
    payload = texts.encode_text(text)
    assert payload is not None and "=" not in payload and "/" not in payload
    store = texts.TextStore()
    assert texts.resolve_text(texts.text_id(text), payload, store) == text
    assert store.get(texts.text_id(text)) == text  # remembered for a reload without payload


def test_long_text_travels_by_hash_and_is_refused_where_unknown():
    import random

    rng = random.Random(0)
    text = " ".join("".join(rng.choice("abcdefghij") for _ in range(7)) for _ in range(3000))
    assert texts.encode_text(text) is None  # too long for a link
    key = texts.text_id(text)
    with pytest.raises(texts.TextLinkError, match="not available here"):
        texts.resolve_text(key, None, texts.TextStore())
    store = texts.TextStore()
    store.put(text)
    assert texts.resolve_text(key, None, store) == text


def test_damaged_or_mismatched_payloads_are_named():
    payload = texts.encode_text("one text")
    with pytest.raises(texts.TextLinkError, match="damaged"):
        texts.decode_text(payload[:-3])
    with pytest.raises(texts.TextLinkError, match="does not match"):
        texts.resolve_text(texts.text_id("another text"), payload, texts.TextStore())
    with pytest.raises(texts.TextLinkError, match="16 hex"):
        texts.resolve_text("../../etc/passwd", None, texts.TextStore())


def test_store_is_bounded_oldest_out():
    store = texts.TextStore(max_chars=10)
    a, b, c = store.put("aaaa"), store.put("bbbb"), store.put("cccc")
    assert store.get(a) is None and store.get(b) == "bbbb" and store.get(c) == "cccc"
    assert store.put("bbbb") == b
