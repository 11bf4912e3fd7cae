"""Sparsity–recall figures: each method's points and frontier, the gold sparsity, the current
setting as a star (the numbers come from ``sparsefinder.evaluation.sweep``).

Colours and markers come from :mod:`.palette` (one colour per method on every chart); the
legend sits outside the plot and the figure grows with it, so a PNG export holds all of it.
"""

from __future__ import annotations

import json

import pandas as pd
import plotly.graph_objects as go

from sparsefinder.evaluation.frontier import pareto_frontier
from sparsefinder.explore.pareto import curve_label
from sparsefinder.figures.palette import CURRENT_MARKER, method_color, method_dash

#: Smallest figure height, and the pixels of one legend row (11 px font).
PLOT_HEIGHT = 460
LEGEND_ROW = 20
#: Top (title) and bottom (axis title) margins: plotly fits the legend between them and
#: scrolls it (so a PNG export cuts it) when it is taller.
MARGIN = {"t": 80, "b": 70, "r": 20}
CURRENT_NAME = "your setting"


def legend_height(entries: int) -> int:
    """Figure height whose plot area holds ``entries`` legend rows and the legend's title
    (never scrolled, never cut in an export)."""
    return max(PLOT_HEIGHT, MARGIN["t"] + MARGIN["b"] + 40 + LEGEND_ROW * entries)


def _custom(points: pd.DataFrame, method: str) -> list[list[str]]:
    """Per point: its params (hover) and its curve, so a click names the setting."""
    return [[p, method] for p in points["params"]]


def pareto_figure(
    df: pd.DataFrame, gold_sparsity: float | None = None, title: str = "Sparsity–recall",
    *, frontier: pd.DataFrame | None = None,
) -> go.Figure:
    """All points (faint) and each method's frontier (line); gold sparsity as a dashed line.

    A reference on the exact scores (top-k) is grey and dashed, ``<method>+window`` is dotted
    in ``<method>``'s colour. Hover shows params; each point's ``customdata`` is
    ``[params, curve]``.
    """
    fig = go.Figure()
    if frontier is None:  # a caller that already has it passes it
        frontier = pareto_frontier(df)
    methods = list(dict.fromkeys(df["method"]))
    for method in methods:
        color, label = method_color(method), curve_label(method)
        points = df[df["method"] == method]
        front = frontier[frontier["method"] == method]
        hover = ("%{customdata[0]}<br>sparsity=%{x:.4f}<br>recall=%{y:.4f}<extra>" + label
                 + "</extra>")
        fig.add_trace(go.Scatter(
            x=points["sparsity"], y=points["recall"], customdata=_custom(points, method),
            mode="markers", marker={"color": color, "opacity": 0.35, "size": 6},
            legendgroup=method, showlegend=False, name=f"{method} (all)",
            hovertemplate=hover,
        ))
        fig.add_trace(go.Scatter(
            x=front["sparsity"], y=front["recall"], customdata=_custom(front, method),
            mode="lines+markers", line={"color": color, "dash": method_dash(method)},
            marker={"color": color, "size": 8}, legendgroup=method, name=label,
            meta=method, hovertemplate=hover,
        ))
    if gold_sparsity is None:
        gold_sparsity = df.attrs.get("gold_sparsity")
    if gold_sparsity is not None:
        fig.add_vline(
            x=gold_sparsity, line_dash="dash", line_color="black",
            annotation_text=f"gold sparsity {gold_sparsity:.3f}",
            annotation_position="bottom left",
        )
    fig.update_layout(
        title=title, xaxis_title="sparsity (1 − |Ĝ| / nm)", yaxis_title="recall (|Ĝ ∩ G| / |G|)",
        xaxis_range=[0, 1.0], yaxis_range=[0, 1.02], template="plotly_white",
        legend={"title": "method (frontier)", "font": {"size": 11}, "tracegroupgap": 0,
                "x": 1.02, "xanchor": "left", "y": 1.0, "yanchor": "top"},
        height=legend_height(len(methods) + 1),  # + the current setting
        margin=MARGIN,
    )
    return fig


def mark_current(fig: go.Figure, sparsity: float, recall: float, label: str) -> go.Figure:
    """The current slider setting as a star on a sparsity–recall figure."""
    fig.add_trace(go.Scatter(
        x=[sparsity], y=[recall], mode="markers", name=CURRENT_NAME, marker=CURRENT_MARKER,
        hovertemplate=f"{label}<br>sparsity=%{{x:.4f}}<br>recall=%{{y:.4f}}"
                      "<extra>your setting</extra>",
    ))
    return fig


def clicked_point(point: dict) -> tuple[str, dict] | None:
    """A point of a selection event → (curve, params); None for the star or a bare point."""
    custom = point.get("customdata")
    if not isinstance(custom, (list, tuple)) or len(custom) != 2:
        return None
    params, curve = custom
    return str(curve), json.loads(params)
