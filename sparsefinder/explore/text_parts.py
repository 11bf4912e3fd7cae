"""A text longer than the model reads, explored part by part instead of cut off.

The text is split into overlapping model-sized parts on token boundaries (sentence ends
first: :func:`sparsefinder.data.chunking.chunk_passages`); the app shows one part at a time
and says so in one sentence, and the link keeps the part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sparsefinder.data.chunking import chunk_spans

#: Tokens shared by consecutive parts, so an edge near a cut is seen whole in one of them.
OVERLAP = 64
#: At most this share of a part is overlap: a model that reads few tokens (64) still moves
#: on by three quarters of what it reads from one part to the next.
MAX_OVERLAP_SHARE = 0.25


def part_overlap(tokenizer: Any, max_length: int, overlap: int = OVERLAP) -> int:
    """The overlap of consecutive parts for a model reading ``max_length`` tokens: ``overlap``,
    or a quarter of the text tokens a part holds when that is less (0 for a model whose
    special tokens leave room for a token or two)."""
    room = max_length - tokenizer.num_special_tokens_to_add(pair=False)
    return max(0, min(overlap, int(room * MAX_OVERLAP_SHARE)))


@dataclass(frozen=True)
class TextPart:
    """One part: its text and where it sits in the whole text (tokens, without specials)."""

    index: int
    text: str
    first_token: int
    last_token: int
    #: tokens this part shares with the next (the same for every part of a text)
    overlap: int = OVERLAP

    def label(self, count: int) -> str:
        return f"part {self.index + 1} of {count}: tokens {self.first_token}–{self.last_token}"


def text_parts(tokenizer: Any, text: str, max_length: int,
               overlap: int = OVERLAP) -> list[TextPart]:
    """The parts of ``text`` for a model reading ``max_length`` tokens (one part when it
    fits); token positions count the text's own tokens, from 0."""
    encoding = tokenizer(text, add_special_tokens=False, truncation=False,
                         return_offsets_mapping=True, verbose=False)
    offsets = [(start, end) for start, end in encoding["offset_mapping"]]
    starts = torch.tensor([start for start, _ in offsets] or [0])
    parts = []
    overlap = part_overlap(tokenizer, max_length, overlap)
    spans = chunk_spans(text, tokenizer, max_length, overlap, offsets=offsets)
    for index, (begin, end) in enumerate(spans):
        inside = ((starts >= begin) & (starts < end)).nonzero().flatten()
        first, last = (int(inside[0]), int(inside[-1])) if len(inside) else (0, 0)
        parts.append(TextPart(index, text[begin:end].strip(), first, last, overlap))
    return parts


def parts_sentence(parts: list[TextPart], shown: int, total_tokens: int,
                   max_length: int) -> str | None:
    """The one sentence that says a long text is shown in parts (None when it fits)."""
    if len(parts) < 2:
        return None
    return (f"This text has {total_tokens} tokens and the model reads {max_length} at a time, "
            f"so it is shown in {len(parts)} parts that overlap by about {parts[0].overlap} "
            f"tokens: {parts[shown].label(len(parts))}.")
