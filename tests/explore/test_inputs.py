"""sparsefinder.explore: example texts, uploads and notes (no Streamlit)."""

from __future__ import annotations

import pytest

from sparsefinder.explore import inputs
from sparsefinder.graphs import TextInputError


def test_examples_and_uploads():
    names = inputs.list_examples()
    assert names[0] == inputs.DEFAULT_EXAMPLE and "long_report_512" in names
    assert inputs.read_example(names[0]).strip()
    with pytest.raises(TextInputError, match="unknown example"):
        inputs.read_example("../../etc/passwd")
    assert inputs.decode_upload("\ufeffhé".encode()) == "hé"
    with pytest.raises(TextInputError, match="not UTF-8"):
        inputs.decode_upload(b"\xff\xfe\x00bad", "x.txt")


def test_long_emoji_and_empty_text_notes(default_model):
    long_record, notes = inputs.extract_one(default_model, "word " * 700)
    assert long_record.n_tokens == default_model.max_length
    assert any(f"truncated to its first {default_model.max_length} tokens" in n for n in notes)
    emoji_record, notes = inputs.extract_one(default_model, "I love 🍕 and 🎉 so much")
    assert any("unknown to the model's vocabulary" in n and "🍕" in n for n in notes)
    assert emoji_record.n_tokens > 2
    with pytest.raises(TextInputError, match="empty"):
        inputs.extract_one(default_model, "   ")


def test_token_labels_are_unique(prepared):
    labels = inputs.token_labels(prepared.record)
    assert len(set(labels)) == len(labels)
    assert labels[2].endswith(prepared.record.tokens[2])
