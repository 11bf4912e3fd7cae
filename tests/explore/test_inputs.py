"""sparsefinder.explore: example texts, uploads and notes (no Streamlit)."""

from __future__ import annotations

import pytest

from sparsefinder.data.records import TextInputError
from sparsefinder.explore import inputs


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


def test_default_model_keeps_truncating_long_texts_as_before(default_model):
    from sparsefinder.explore.inputs import extract_one

    record, notes = extract_one(default_model, "word " * 1500)
    assert record.n_tokens == 512 and record.truncated
    assert notes and "more than 512 tokens" in notes[0]


def test_long_context_model_uses_bounded_extraction_and_truncates_at_its_limit(tmp_path):
    from sparsefinder.data.long_context import long_texts
    from sparsefinder.explore.inputs import LONG_EXTRACTION, extract_one
    from sparsefinder.models.decoders import save_tiny_decoder
    from sparsefinder.models.loading import load_model

    limit = LONG_EXTRACTION + 76
    loaded = load_model(str(save_tiny_decoder("llama", tmp_path / "llama", max_positions=limit)),
                        device="cpu")
    (text,) = long_texts(loaded.tokenizer, limit + 300, 1, "train")
    record, notes = extract_one(loaded, text)
    assert limit - 3 <= record.n_tokens <= limit
    assert record.text == text[:len(record.text)] and len(record.text) < len(text)
    assert any(f"maximum of {limit}" in note and "truncated" in note for note in notes)
    (fits,) = long_texts(loaded.tokenizer, limit - 20, 1, "train")
    record, notes = extract_one(loaded, fits)
    assert record.n_tokens == len(loaded.tokenizer(fits)["input_ids"]) and not notes
