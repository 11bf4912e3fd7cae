"""The bertviz-style head view: token lines between a query column and a key column, gold
against predicted, for a window of tokens.

bertviz draws every token of a text and every head's lines; at 512 tokens that is unreadable
(and its JSON is tens of MB). Here a *window* ``[start, stop)`` of at most
:data:`MAX_WINDOW` tokens is drawn on both sides, with each head's edges inside it, and every
token also carries how many of its gold edges leave the window, so nothing is silently
hidden. The payload is plain JSON for :mod:`sparsefinder.figures.head_lines`.

Edge status codes are those of :func:`sparsefinder.explore.tables.diff_codes`:
1 TP (gold and predicted), 2 FN (gold, missed), 3 FP (predicted, not gold).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from sparsefinder.data.records import AttentionRecord

#: Widest window drawn: at 16 px a row, 96 tokens fill a screen; more lines are a hairball.
MAX_WINDOW = 96
DEFAULT_WINDOW = 40


@dataclass(frozen=True)
class HeadLines:
    """Everything the head view draws for one layer and one window of tokens.

    ``edges[h]`` holds rows ``(query, key, gold probability, status)`` with positions
    *relative to* ``start``; ``out_of_window[h]`` holds, per window token, its gold edges to
    tokens outside the window (as a query, then as a key).
    """

    layer: int
    start: int
    tokens: list[str]
    heads: list[int]
    edges: list[list[list[float]]]
    out_as_query: list[list[int]]
    out_as_key: list[list[int]]

    def to_json(self) -> dict:
        """The payload the HTML view reads (lists and numbers only)."""
        return {"layer": self.layer, "start": self.start, "tokens": self.tokens,
                "heads": self.heads, "edges": self.edges,
                "outAsQuery": self.out_as_query, "outAsKey": self.out_as_key}


def window_bounds(n_tokens: int, center: int, size: int = DEFAULT_WINDOW) -> tuple[int, int]:
    """``[start, stop)`` of ``size`` tokens around ``center``, shifted to fit in the text."""
    if n_tokens < 1:
        raise ValueError("the text has no tokens")
    if not 1 <= size <= MAX_WINDOW:
        raise ValueError(f"window size must be in 1..{MAX_WINDOW}, got {size}")
    size = min(size, n_tokens)
    center = min(max(center, 0), n_tokens - 1)
    start = min(max(center - size // 2, 0), n_tokens - size)
    return start, start + size


def head_lines(record: AttentionRecord, preds: Sequence[Tensor], layer: int,
               start: int, stop: int, heads: Sequence[int] | None = None) -> HeadLines:
    """The head view of ``layer`` for tokens ``[start, stop)`` (queries and keys alike).

    ``preds[layer]`` is the predicted bool graph (heads, n, m) aligned with the record's
    gold graph. Probabilities are the gold (exact entmax) ones; an FP edge has probability 0.
    """
    n = record.n_tokens
    if not 0 <= layer < record.num_layers:
        raise ValueError(f"layer {layer} is out of range 0..{record.num_layers - 1}")
    if not (0 <= start < stop <= n) or stop - start > MAX_WINDOW:
        raise ValueError(f"window [{start}, {stop}) must lie in [0, {n}) and hold at most "
                         f"{MAX_WINDOW} tokens")
    graph = record.layers[layer]
    pred = preds[layer]
    if tuple(pred.shape) != graph.gold_shape:
        raise ValueError(f"prediction {tuple(pred.shape)} does not match the gold graph "
                         f"{graph.gold_shape} of layer {layer}")
    heads = list(range(record.num_heads)) if heads is None else [int(h) for h in heads]
    window = slice(start, stop)
    all_gold = graph.gold_of(heads)
    gold = all_gold[:, window, window]
    kept = pred[heads][:, window, window].to(torch.bool)
    probs = graph.probs()[heads][:, window, window]
    status = torch.where(gold & kept, 1, torch.where(gold, 2, torch.where(kept, 3, 0)))
    edges: list[list[list[float]]] = []
    for h in range(len(heads)):
        q, k = torch.nonzero(status[h], as_tuple=True)
        rows = np.stack([q.numpy(), k.numpy(), probs[h, q, k].numpy(),
                         status[h, q, k].numpy()], axis=1) if len(q) else np.zeros((0, 4))
        edges.append([[int(a), int(b), float(p), int(s)] for a, b, p, s in rows])
    inside_rows = all_gold[:, window, window].sum(-1)
    inside_cols = all_gold[:, window, window].sum(-2)
    out_q = all_gold[:, window, :].sum(-1) - inside_rows
    out_k = all_gold[:, :, window].sum(-2) - inside_cols
    return HeadLines(layer=layer, start=start, tokens=list(record.tokens[window]), heads=heads,
                     edges=edges, out_as_query=out_q.tolist(), out_as_key=out_k.tolist())


#: A click on the left column (a query) selects the token's row, on the right (a key) its
#: column, as the Token view's direction names them.
DIRECTIONS = {"query": "row", "key": "column"}


def picked_token(value: object, n_tokens: int) -> tuple[int, str] | None:
    """The head view's click payload ``{"side": "query"|"key", "index": position}`` → (token
    position, direction "row"|"column"); None for anything else (it comes from the browser,
    so it is checked, never trusted)."""
    if not isinstance(value, dict):
        return None
    side, index = value.get("side"), value.get("index")
    if side not in DIRECTIONS or isinstance(index, bool) or not isinstance(index, int):
        return None
    if not 0 <= index < n_tokens:
        return None
    return index, DIRECTIONS[side]
