"""Tables and files behind every figure: per-head metrics, diffs, edge lists, token rows,
CSV/JSON downloads and highlighted text.

Plain pandas/numpy: the app draws them, a test or a notebook can read them directly.
"""

from __future__ import annotations

import html
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from sparsefinder.data.records import AttentionRecord
from sparsefinder.explore.live import summarize
from sparsefinder.explore.state import ViewState
from sparsefinder.metrics.measures import GraphScores

DIFF_NONE, DIFF_TP, DIFF_FN, DIFF_FP = 0, 1, 2, 3
_DIFF_NAMES = ("none", "TP", "FN", "FP")


def metrics_frame(scores: GraphScores) -> pd.DataFrame:
    """One row per (layer, head): recall, sparsity, gold sparsity and the other metrics
    present (precision, exact fraction, mass recall, block recall; the CSV download)."""
    layers, heads = scores.recall.shape
    grid_layer, grid_head = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
    return pd.DataFrame({
        "layer": grid_layer.ravel(),
        "head": grid_head.ravel(),
        "recall": scores.recall.numpy().ravel(),
        "sparsity": scores.sparsity.numpy().ravel(),
        "gold_sparsity": scores.gold_sparsity.numpy().ravel(),
        **{name: values.numpy().ravel() for name, values in scores.metrics().items()
           if name not in ("recall", "sparsity")},
    })


def diff_codes(pred: Tensor, gold: Tensor) -> np.ndarray:
    """uint8 (n, m): 0 neither, 1 true positive, 2 missed gold edge (FN), 3 extra edge (FP)."""
    if pred.shape != gold.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and gold {tuple(gold.shape)} must match")
    p = pred.numpy().astype(np.uint8)
    g = gold.numpy().astype(np.uint8)
    # TP: 1·1 = 1; FN: 1·2 = 2; FP: 1·1·3 = 3; neither: 0
    return (g * (2 - p) + p * (1 - g) * 3).astype(np.uint8)


def heads_codes(record: AttentionRecord, preds: Sequence[Tensor], kind: str) -> np.ndarray:
    """uint8 (layers, heads, n, m) of every head for the model view: the gold graph, the
    predicted graph (0/1) or their diff (:func:`diff_codes`)."""
    gold = torch.stack(record.gold_masks())
    if kind == "gold":
        return gold.numpy().astype(np.uint8)
    pred = torch.stack(list(preds))
    if kind == "predicted":
        return pred.numpy().astype(np.uint8)
    if kind == "diff":
        return diff_codes(pred, gold)
    raise ValueError(f"kind must be gold, predicted or diff, got {kind!r}")


def diff_counts(codes: np.ndarray) -> dict[str, int]:
    """Number of TP, FN and FP cells of a diff (one comparison per class: np.bincount widens
    every uint8 cell to int64 first, 40x slower on a 500-token head)."""
    return {name: int(np.count_nonzero(codes == i)) for i, name in enumerate(_DIFF_NAMES) if i}


def edges_frame(
    record: AttentionRecord, layer: int, head: int, pred: Tensor | None = None
) -> pd.DataFrame:
    """Every gold or predicted edge of one head, with tokens, probability and status.

    Columns: query, key, query_token, key_token, gold_prob, gold, predicted, status
    (TP/FN/FP; "gold" when no prediction is given).
    """
    graph = record.layers[layer]
    gold = graph.gold_of(head)
    probs = graph.probs()[head]
    union = gold if pred is None else gold | pred
    rows, cols = (x.numpy() for x in union.nonzero(as_tuple=True))
    gold_at = gold.numpy()[rows, cols]
    tokens = np.asarray(record.tokens, dtype=object)
    frame = pd.DataFrame({
        "query": rows,
        "key": cols,
        "query_token": tokens[rows] if len(rows) else [],
        "key_token": tokens[cols] if len(cols) else [],
        "gold_prob": probs.numpy()[rows, cols],
        "gold": gold_at,
    })
    if pred is None:
        frame["status"] = "gold"
    else:
        pred_at = pred.numpy()[rows, cols]
        frame["predicted"] = pred_at
        frame["status"] = np.where(gold_at & pred_at, "TP", np.where(gold_at, "FN", "FP"))
    return frame


def token_row_frame(
    record: AttentionRecord, preds: Sequence[Tensor], layer: int, query: int,
    direction: str = "row",
) -> pd.DataFrame:
    """Token view: for one token, every head's gold probability and prediction per partner.

    ``direction="row"``: the token as a query, its keys (what it attends to);
    ``"column"``: the token as a key, the queries that attend to it (bertviz's "both
    directions"). Only one row/column of each (n × n) matrix, so it stays readable (and
    small) at 512 tokens. Columns: head, key (the partner's position), key_token, gold_prob,
    gold, predicted, status.
    """
    if direction not in ("row", "column"):
        raise ValueError(f"direction must be 'row' or 'column', got {direction!r}")
    graph = record.layers[layer]
    pick = (slice(None), query, slice(None)) if direction == "row" else (
        slice(None), slice(None), query)
    gold = graph.gold[pick]  # (heads, partners)
    pred = preds[layer][pick]
    probs = graph.probs()[pick]
    heads, m = gold.shape
    head_ids, key_ids = np.meshgrid(np.arange(heads), np.arange(m), indexing="ij")
    g = gold.numpy().ravel()
    p = pred.numpy().ravel()
    return pd.DataFrame({
        "head": head_ids.ravel(),
        "key": key_ids.ravel(),
        "key_token": np.asarray(record.tokens, dtype=object)[key_ids.ravel()],
        "gold_prob": probs.numpy().ravel(),
        "gold": g,
        "predicted": p,
        "status": np.where(g & p, "TP", np.where(g, "FN", np.where(p, "FP", ""))),
    })


def to_csv(frame: pd.DataFrame) -> bytes:
    """A data frame as UTF-8 CSV bytes (what a download button serves)."""
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False)
    return buffer.getvalue().encode("utf-8")


def to_json(payload: Any) -> bytes:
    """A dict/list (dataclasses, tensors and frames allowed) as pretty UTF-8 JSON bytes."""
    return json.dumps(_plain(payload), indent=2, ensure_ascii=False).encode("utf-8")


def _plain(value: Any) -> Any:
    if isinstance(value, pd.DataFrame):
        return value.to_dict(orient="records")
    if isinstance(value, Tensor):
        return value.tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "__dataclass_fields__"):
        return _plain(asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def view_report(
    state: ViewState, scores: GraphScores, model_id: str, alpha: float, n_tokens: int,
    setting: str = "", text: str | None = None,
) -> dict[str, Any]:
    """The metrics behind the explorer as one JSON-able dict, reproducible: it has the view
    state, in ``setting`` the predictor that ran, and the text itself when it is a custom
    one (a bundled example is named by ``state.example``)."""
    return {
        "model": model_id,
        "alpha": alpha,
        "n_tokens": n_tokens,
        "state": asdict(state),
        "setting": setting,
        "text": text if state.text_id is not None else None,
        "summary": summarize(scores, state.layer, state.head),
        "per_head": metrics_frame(scores),
    }


def token_row_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per head of a token row: gold/predicted edge counts, TP/FN/FP and the row's recall."""
    grouped = frame.groupby("head")
    out = pd.DataFrame({
        "gold_edges": grouped["gold"].sum(),
        "predicted_edges": grouped["predicted"].sum(),
        "TP": grouped["status"].apply(lambda s: int((s == "TP").sum())),
        "FN": grouped["status"].apply(lambda s: int((s == "FN").sum())),
        "FP": grouped["status"].apply(lambda s: int((s == "FP").sum())),
    })
    out["recall"] = np.where(out["gold_edges"] > 0, out["TP"] / out["gold_edges"].clip(lower=1),
                             1.0)
    return out.reset_index()


def highlight_html(text: str, offsets: Sequence[tuple[int, int]],
                   positions: Sequence[int]) -> str:
    """``text`` as HTML with the characters of the tokens at ``positions`` in ``<mark>``.

    Everything is escaped; overlapping or adjacent token spans merge into one mark; empty
    spans (special tokens) mark nothing. Line breaks become ``<br>``.
    """
    covered = np.zeros(len(text) + 1, dtype=bool)
    for position in positions:
        start, end = offsets[position]
        covered[max(start, 0):min(end, len(text))] = True
    pieces: list[str] = []
    index = 0
    while index < len(text):
        end = index
        while end < len(text) and covered[end] == covered[index]:
            end += 1
        chunk = html.escape(text[index:end]).replace("\n", "<br>")
        pieces.append(f"<mark>{chunk}</mark>" if covered[index] else chunk)
        index = end
    return "".join(pieces)
