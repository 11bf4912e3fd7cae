"""The Explorer on long texts (thousands of tokens): a window, a search, block overviews.

A 4096-token head is 16M query–key pairs: drawn whole it is one pixel per ~14 tokens and
every slider move would ship and draw it three times. For texts longer than
:data:`LONG_TEXT` tokens the Explorer therefore shows a *window* of tokens (by default the
first :data:`DEFAULT_WINDOW`), which a search box moves to where a word occurs, and draws
the whole head as a *block overview*: one cell per (query block, key block) of
:func:`block_size` tokens with its gold edge count and the prediction's recall there, so the
structure of the whole head stays visible at (n/b)² cells. Everything here is computed for
one head only (never a dense (heads, n, n) float copy).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.metrics.measures import count_true

#: Above this many tokens the Explorer opens on a window instead of the whole head.
LONG_TEXT = 512
#: Tokens shown at first in a long text (every token labelled up to 64; 256 stays readable).
DEFAULT_WINDOW = 256
#: Cells per side of a block overview, at most.
OVERVIEW_CELLS = 64
_BYTES = 0x00FF00FF00FF00FF  # the even bytes of an int64 word
_SHORTS = 0x0000FFFF0000FFFF  # its even 16-bit lanes


def default_window(n: int, size: int = DEFAULT_WINDOW) -> tuple[int, int]:
    """``(start, end)`` first shown: everything for a short text, the first ``size`` else."""
    return (0, n) if n <= LONG_TEXT else (0, min(n, size))


def window_around(position: int, n: int, size: int) -> tuple[int, int]:
    """A window of ``size`` tokens (clipped to the text) with ``position`` near its middle."""
    size = max(1, min(size, n))
    start = min(max(0, position - size // 2), n - size)
    return start, start + size


def find_tokens(record: AttentionRecord, query: str, limit: int = 50) -> list[int]:
    """Positions of the tokens where ``query`` occurs (case-insensitive), in order; at most
    ``limit``. The text is searched, not the token strings, so a word split into several
    subword tokens is found (at its first token); a query matching only a token string
    (e.g. a special token) is found too."""
    needle = query.strip().casefold()
    if not needle:
        return []
    starts = [a for a, b in record.offsets]
    ends = [b for a, b in record.offsets]
    found: set[int] = set()
    text = record.text.casefold()
    at = text.find(needle)
    while at >= 0 and len(found) < limit:
        i = bisect.bisect_right(starts, at) - 1  # last token starting at or before ``at``
        while i + 1 < len(starts) and ends[i] <= at:  # ``at`` in a gap: the next token
            i += 1
        if 0 <= i < len(starts) and i < record.n_tokens:
            found.add(i)
        at = text.find(needle, at + 1)
    found |= {i for i, token in enumerate(record.tokens) if needle in token.casefold()}
    return sorted(found)[:limit]


def head_probs(graph: LayerGraph, head: int, rows: slice, cols: slice) -> Tensor:
    """Gold probabilities of one head on a window, float32 (rows, cols), without building
    the dense (heads, n, m) matrix (``LayerGraph.probs`` does; 268 MB at 4 heads, n=4096).

    ``prob_values`` are in row-major order of ``gold.nonzero()``, so the window's rows are
    one contiguous run of it: edges before the head, then before the first shown row
    (both counted on the packed bits; only the shown rows are unpacked).
    """
    n = graph.gold_shape[-2]
    first_row, last_row, _ = rows.indices(n)
    before_head = graph.gold_count(slice(0, head))  # the heads before it only
    before_rows = graph.gold_count(head, slice(0, first_row)) if first_row else 0
    shown = graph.gold_of(head, slice(first_row, last_row))  # the window's rows unpacked
    start = before_head + before_rows
    values = graph.prob_values[start:start + int(count_true(shown[None])[0])]
    dense = torch.zeros(shown.shape, dtype=values.dtype)
    dense[shown] = values
    return dense[:, cols]


def block_size(n: int, cells: int = OVERVIEW_CELLS) -> int:
    """Tokens per overview block: the smallest power of two giving ≤ ``cells`` blocks."""
    return max(1, 2 ** math.ceil(math.log2(max(1, math.ceil(n / cells)))))


@dataclass
class BlockOverview:
    """One head at block level: counts per (query block, key block)."""

    block: int
    gold: Tensor  # int64 (nb, mb): gold edges in the block
    predicted: Tensor  # int64 (nb, mb): predicted pairs in the block
    hits: Tensor  # int64 (nb, mb): predicted gold edges

    @property
    def recall(self) -> Tensor:
        """float (nb, mb): hits / gold, NaN where a block has no gold edge."""
        return torch.where(self.gold > 0, self.hits / self.gold.clamp(min=1), torch.nan)


def _padded(mask: Tensor, block: int) -> Tensor:
    """``mask`` (n, m) padded with False to whole blocks, contiguous."""
    n, m = mask.shape
    nb, mb = -(-n // block), -(-m // block)
    if nb * block != n or mb * block != m:
        mask = torch.nn.functional.pad(mask, (0, mb * block - m, 0, nb * block - n))
    return mask.contiguous()


def _words(mask: Tensor, block: int) -> Tensor | None:
    """int64 (N, M / 8) of the padded mask, 8 keys (0/1 bytes) per word; None when a block
    is not a whole number of words."""
    if block % 8:
        return None
    padded = _padded(mask, block)
    if padded.storage_offset() % 8:  # a head of a larger tensor, not word-aligned
        padded = padded.clone()
    return padded.view(torch.int64)


def _word_counts(words: Tensor, block: int) -> Tensor:
    """int64 (nb, mb) pair counts per block from :func:`_words`. The block's rows are summed
    first, word by word (each byte is 0/1, so a byte holds a row count <= 255 without
    carrying into the next), then each word's 8 byte counts are added in 16- and 32-bit
    lanes: one pass over the mask with no (n, m) temporary, ~10x fewer elements after it."""
    rows, cols = words.shape
    chunk = max(c for c in range(1, min(block, 255) + 1) if block % c == 0)
    partial = words.view(rows // chunk, chunk, cols).sum(1)
    lanes = (partial & _BYTES) + ((partial >> 8) & _BYTES)  # 16-bit lanes, each <= 510
    lanes = (lanes & _SHORTS) + ((lanes >> 16) & _SHORTS)  # 32-bit lanes
    per_word = (lanes & 0xFFFFFFFF) + (lanes >> 32)
    return per_word.view(rows // block, block // chunk, cols * 8 // block, block // 8).sum(
        (1, 3))


def _block_counts(mask: Tensor, block: int) -> Tensor:
    """int64 (nb, mb) pair counts per block: keys summed first along the contiguous axis
    (as uint8 bytes), then query rows; ~10x faster than one sum over a 4-d view."""
    words = _words(mask, block)
    if words is not None:
        return _word_counts(words, block)
    padded = _padded(mask, block)
    nb, mb = padded.shape[0] // block, padded.shape[1] // block
    per_row = padded.view(torch.uint8).view(nb * block, mb, block).sum(-1, dtype=torch.int32)
    return per_row.view(nb, block, mb).sum(1, dtype=torch.int64)


def block_overview(gold: Tensor, pred: Tensor, block: int | None = None) -> BlockOverview:
    """Counts of one head's gold (n, m) and predicted (n, m) bool masks per block."""
    if gold.shape != pred.shape or gold.dim() != 2:
        raise ValueError(f"gold {tuple(gold.shape)} and pred {tuple(pred.shape)} must be the "
                         "same (n, m) masks of one head")
    size = block or block_size(max(gold.shape))
    gold_words, pred_words = _words(gold, size), _words(pred, size)
    if gold_words is not None and pred_words is not None:  # hits: one AND per word
        return BlockOverview(size, _word_counts(gold_words, size),
                             _word_counts(pred_words, size),
                             _word_counts(gold_words & pred_words, size))
    return BlockOverview(size, _block_counts(gold, size), _block_counts(pred, size),
                         _block_counts(gold & pred, size))
