"""Text input: bundled examples, uploads, and the notes a user should read about a text.

:func:`extract_one` is the app's way to get gold graphs of one text: a text longer than the
model's limit is truncated with a note instead of a console warning nobody sees.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from sparsefinder.bundle import examples_dir
from sparsefinder.data.long_context import extract_long
from sparsefinder.data.records import AttentionRecord, LongTextWarning, TextInputError, extract

DEFAULT_EXAMPLE = "short_dialogue"


def list_examples(folder: Path | None = None) -> list[str]:
    """Names (file stems) of the bundled example texts (or ``folder``'s), sorted, default
    first."""
    folder = folder if folder is not None else examples_dir()
    names = sorted(p.stem for p in folder.glob("*.txt"))
    if DEFAULT_EXAMPLE in names:
        names.remove(DEFAULT_EXAMPLE)
        names.insert(0, DEFAULT_EXAMPLE)
    return names


def read_example(name: str, folder: Path | None = None) -> str:
    """The text of a bundled example; a clear TextInputError for an unknown name."""
    folder = folder if folder is not None else examples_dir()
    if name not in list_examples(folder):
        raise TextInputError(f"unknown example {name!r}; choose one of {list_examples(folder)}")
    return (folder / f"{name}.txt").read_text(encoding="utf-8")


def decode_upload(data: bytes, name: str = "upload") -> str:
    """Bytes of an uploaded .txt → text; UTF-8 (with or without BOM), else a clear error."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise TextInputError(
            f"{name} is not UTF-8 text (byte {error.start} cannot be decoded); "
            "save it as UTF-8 plain text and upload it again"
        ) from error


def extract_one(loaded: Any, text: str) -> tuple[AttentionRecord, list[str]]:
    """Gold graphs of one text (truncated if too long) and the notes a user should read.

    Raises TextInputError for an empty text. A LongTextWarning becomes a note that says how
    the text was handled instead of a console warning nobody sees.
    """
    if loaded.max_length > LONG_EXTRACTION and _tokens(loaded, text) > LONG_EXTRACTION:
        return _extract_long(loaded, text)  # a long-context model (else: as always)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LongTextWarning)
        record = extract(loaded, text, long_text="truncate")[0]
    notes = [
        f"Text too long for the model: it has more than {loaded.max_length} tokens, so it was "
        f"truncated to its first {record.n_tokens} tokens ({w.message})."
        for w in caught
        if issubclass(w.category, LongTextWarning)
    ]
    notes.extend(input_notes(record, getattr(loaded.tokenizer, "unk_token", None)))
    return record, notes


#: Texts longer than this (on a long-context model) go through bounded-memory extraction.
LONG_EXTRACTION = 1024


def _tokens(loaded: Any, text: str) -> int:
    return len(loaded.tokenizer(text, truncation=False)["input_ids"])


def _extract_long(loaded: Any, text: str) -> tuple[AttentionRecord, list[str]]:
    """A long text on a long-context model: gold edges block by block (bounded memory,
    ``sparsefinder.data.long_context``), cut at the model's limit with the same note."""
    notes = []
    encoding = loaded.tokenizer(text, truncation=False, return_offsets_mapping=True)
    total = len(encoding["input_ids"])
    if total > loaded.max_length:
        end = encoding["offset_mapping"][loaded.max_length - 1][1]
        text = text[:end]
        while _tokens(loaded, text) > loaded.max_length:  # merges across the cut
            text = text[:-1]
    record = extract_long(loaded, text)
    if total > loaded.max_length:
        notes.append(f"Text too long for the model: it has {total} tokens, more than its "
                     f"maximum of {loaded.max_length}, so it was truncated to its first "
                     f"{record.n_tokens} tokens.")
    notes.extend(input_notes(record, getattr(loaded.tokenizer, "unk_token", None)))
    return record, notes


def input_notes(record: AttentionRecord, unk_token: str | None = "[UNK]") -> list[str]:
    """Warnings about text the tokenizer could not represent (emoji, uncovered scripts)."""
    if not unk_token:
        return []
    unknown = [i for i, token in enumerate(record.tokens) if token == unk_token]
    if not unknown:
        return []
    words = sorted({record.text[slice(*record.offsets[i])] for i in unknown} - {""})
    shown = ", ".join(repr(w) for w in words[:8]) + (" …" if len(words) > 8 else "")
    return [
        f"{len(unknown)} of {record.n_tokens} tokens are unknown to the model's vocabulary "
        f"({unk_token}), e.g. {shown}: emoji or scripts the tokenizer does not cover. "
        "Their attention is still shown, but the model sees them all as the same token."
    ]


def token_labels(record: AttentionRecord) -> list[str]:
    """Unique hover/axis labels ``"12 · the"``: positions keep repeated tokens apart."""
    return [f"{i} · {token}" for i, token in enumerate(record.tokens)]
