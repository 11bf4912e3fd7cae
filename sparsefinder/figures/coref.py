"""Coreference figures: a head's pronoun rows (gold vs predicted) and the paper's coreference
head beside ours (paper §6, Fig. 5)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sparsefinder.figures.common import PRED_COLOR

#: The paper's coreference head (RoBERTa, Sparsefinder k-means): Fig. 5 / §6.
PAPER_RECALL, PAPER_SPARSITY = 0.80, 0.75
_PRED_RGB = "rgb({},{},{})".format(*PRED_COLOR)


def _pairs_label(pairs: tuple[int, ...]) -> str:
    return (f"pair {pairs[0]}" if len(pairs) == 1
            else "pairs " + ", ".join(str(p) for p in pairs))


def pronoun_figure(frame: pd.DataFrame, tag: str) -> go.Figure:
    """Gold probabilities (left) and predicted edges (right) of the pronoun rows only;
    antecedent keys are outlined in both panels.

    ``frame`` is :func:`sparsefinder.explore.coref.pronoun_rows_frame`: one row per pronoun
    token, so a pronoun with several candidate antecedents is one row with each candidate
    outlined (their hover names the pair), and the row's probabilities show which candidate
    the head prefers.
    """
    rows = frame.drop_duplicates("query")
    queries = rows["query"].to_numpy()
    ylabels = [f"{_pairs_label(p)}: {q} · {t}" for p, q, t in
               zip(rows["pairs"], queries, rows["query_token"], strict=True)]
    columns = frame.drop_duplicates("key").sort_values("key")
    keys = columns["key"].to_numpy()
    xlabels = [f"{i} · {t}" for i, t in zip(keys, columns["key_token"], strict=True)]
    table = frame.set_index(["query", "key"])

    def grid(column: str, fill: Any) -> np.ndarray:
        wide = table[column].unstack("key").reindex(index=queries, columns=keys)
        return wide.fillna(fill).to_numpy()

    prob = grid("prob", 0.0).astype(float)
    pred = grid("predicted", False).astype(float)
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=(f"Gold α-entmax probability · {tag}",
                                        f"Predicted (k-means) · {tag}"))
    fig.add_trace(go.Heatmap(z=prob, x=xlabels, y=ylabels, colorscale="Blues", zmin=0,
                             zmax=max(float(prob.max(initial=0.0)), 1e-6), showscale=False,
                             hovertemplate="%{y} → %{x}: %{z:.3f}<extra></extra>"), 1, 1)
    fig.add_trace(go.Heatmap(z=pred, x=xlabels, y=ylabels, zmin=0, zmax=1, showscale=False,
                             colorscale=[[0, "white"], [1, _PRED_RGB]],
                             hovertemplate="%{y} → %{x}: %{z}<extra></extra>"), 1, 2)
    marked = frame[frame["antecedent"]]
    row_of = {int(q): i for i, q in enumerate(queries)}
    col_of = {int(k): i for i, k in enumerate(keys)}
    r = [row_of[int(q)] for q in marked["query"]]
    c = [col_of[int(k)] for k in marked["key"]]
    notes = [f"antecedent of {_pairs_label(a)} · gold p = {p:.3f} · predicted: "
             f"{'yes' if k else 'no'}" for a, p, k in
             zip(marked["antecedent_of"], marked["prob"], marked["predicted"], strict=True)]
    for col in (1, 2):
        fig.add_trace(go.Scatter(
            x=[xlabels[i] for i in c], y=[ylabels[i] for i in r], mode="markers",
            marker=dict(symbol="square-open", size=14, color="#d62728", line=dict(width=2)),
            name="antecedent", showlegend=col == 1, text=notes,
            hovertemplate="%{y} → %{x}<br>%{text}<extra></extra>"), 1, col)
    fig.update_layout(height=140 + 34 * len(queries), margin=dict(l=0, r=0, t=40, b=0),
                      legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(tickangle=-60, tickfont=dict(size=10))
    fig.update_yaxes(autorange="reversed")  # the first pronoun of the text on top
    return fig


def reference_figure(ours: list[tuple[str, float, float]]) -> go.Figure:
    """The paper's coreference head beside ours (``(label, recall, sparsity)`` points) on
    the sparsity–recall plane."""
    fig = go.Figure([
        go.Scatter(x=[PAPER_SPARSITY], y=[PAPER_RECALL], mode="markers+text",
                   marker=dict(size=14, symbol="star", color="#7f7f7f"),
                   text=["paper (RoBERTa)"], textposition="bottom center", name="paper"),
        *[go.Scatter(x=[s], y=[r], mode="markers+text", marker=dict(size=12),
                     text=[label], textposition="top center", name=label)
          for label, r, s in ours if not np.isnan(r)],
    ])
    fig.update_layout(xaxis_title="sparsity of the head's graph", yaxis_title=(
        "recall on pronoun→antecedent edges"), xaxis_range=[0, 1.02], yaxis_range=[0, 1.05],
        height=360, showlegend=False, margin=dict(l=0, r=0, t=10, b=0))
    return fig
