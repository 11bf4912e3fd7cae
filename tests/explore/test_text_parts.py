"""sparsefinder.explore.text_parts: a long text as overlapping model-sized parts."""

from __future__ import annotations

from sparsefinder.data.chunking import chunk_spans
from sparsefinder.explore.text_parts import OVERLAP, part_overlap, parts_sentence, text_parts

LONG = " ".join(f"Sentence {i} tells the story of a fox near the river." for i in range(150))


def test_parts_cover_the_text_fit_the_model_and_overlap(default_model):
    tokenizer, limit = default_model.tokenizer, default_model.max_length
    total = len(tokenizer(LONG, add_special_tokens=False)["input_ids"])
    parts = text_parts(tokenizer, LONG, limit)
    assert total > limit and len(parts) >= 3
    assert parts[0].first_token == 0 and parts[-1].last_token == total - 1
    for part in parts:  # each part, with [CLS]/[SEP], fits what the model reads
        assert len(tokenizer(part.text)["input_ids"]) <= limit
        assert part.text in LONG
    for before, after in zip(parts, parts[1:], strict=False):
        shared = before.last_token - after.first_token + 1
        assert 0 < shared <= OVERLAP + 1  # consecutive parts overlap, by at most the stride
        assert after.first_token > before.first_token
    sentence = parts_sentence(parts, 1, total, limit)
    assert sentence.startswith(f"This text has {total} tokens and the model reads {limit}")
    assert f"part 2 of {len(parts)}: tokens {parts[1].first_token}–" in sentence


def test_a_text_that_fits_is_one_part_and_needs_no_sentence(default_model):
    text = "A short text fits at once."
    parts = text_parts(default_model.tokenizer, text, default_model.max_length)
    assert [p.text for p in parts] == [text]
    assert parts_sentence(parts, 0, 7, default_model.max_length) is None
    assert chunk_spans(text, default_model.tokenizer, default_model.max_length) == [
        (0, len(text))]


def test_the_parts_tokenize_the_text_once_and_cut_where_chunk_spans_cuts(default_model):
    calls = []
    real = default_model.tokenizer

    class Counting:
        def __call__(self, *args, **kwargs):
            calls.append(args[0][:20])
            return real(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(real, name)

    parts = text_parts(Counting(), LONG, default_model.max_length)
    assert len(calls) == 1
    spans = chunk_spans(LONG, real, default_model.max_length, OVERLAP)
    assert [p.text for p in parts] == [LONG[b:e].strip() for b, e in spans]


def test_parts_for_a_model_reading_64_tokens_overlap_by_a_quarter(default_model):
    """64 tokens less [CLS]/[SEP] leave 62: parts overlap by 15 (a quarter), not by the
    default 64, which would leave no room for text."""
    tokenizer = default_model.tokenizer
    assert part_overlap(tokenizer, 64) == 15
    assert part_overlap(tokenizer, default_model.max_length) == OVERLAP
    parts = text_parts(tokenizer, LONG, 64)
    assert len(parts) > 3 and {p.overlap for p in parts} == {15}
    for part in parts:
        assert len(tokenizer(part.text)["input_ids"]) <= 64
    for before, after in zip(parts, parts[1:], strict=False):
        assert 0 < before.last_token - after.first_token + 1 <= 15 + 1
    assert "overlap by about 15 tokens" in parts_sentence(parts, 0, 999, 64)
