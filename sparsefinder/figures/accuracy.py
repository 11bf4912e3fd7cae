"""Sparsity–accuracy figures: one panel per measure, each method's points and frontier, full
entmax as a black diamond and the gold sparsity as a line (the numbers come from
``sparsefinder.evaluation.accuracy_sweep``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sparsefinder.evaluation.accuracy_sweep import MEASURE_LABELS, MEASURES, frontier
from sparsefinder.explore.pareto import curve_label
from sparsefinder.figures.palette import CURRENT_MARKER, FULL_MARKER, method_color, method_dash
from sparsefinder.figures.pareto import CURRENT_NAME, MARGIN, legend_height


def accuracy_figure(
    df: pd.DataFrame, gold_sparsity: float | None, title: str = "Sparsity–accuracy",
    measures: Sequence[str] = MEASURES,
) -> go.Figure:
    """One panel per measure: every point (faint), each method's frontier (line), full
    entmax as a black diamond (accuracy 1 at the gold sparsity) and the gold sparsity as a
    line; a method's colour is the one it has on the recall chart."""
    cols = 2
    rows = math.ceil(len(measures) / cols)
    fig = make_subplots(rows=rows, cols=cols,
                        subplot_titles=[MEASURE_LABELS.get(m, m) for m in measures])
    methods = list(dict.fromkeys(df["method"]))
    for index, measure in enumerate(measures):
        r, c = index // cols + 1, index % cols + 1
        front = frontier(df, measure)
        for method in methods:
            color, dash, label = method_color(method), method_dash(method), curve_label(method)
            hover = ("%{customdata}<br>sparsity=%{x:.4f}<br>" + measure + "=%{y:.4f}<extra>"
                     + label + "</extra>")
            points = df[df["method"] == method]
            line = front[front["method"] == method]
            fig.add_trace(go.Scatter(
                x=points["sparsity"], y=points[measure], customdata=points["params"],
                mode="markers", marker={"color": color, "opacity": 0.3, "size": 5},
                legendgroup=method, showlegend=False, hovertemplate=hover,
            ), row=r, col=c)
            fig.add_trace(go.Scatter(
                x=line["sparsity"], y=line[measure], customdata=line["params"],
                mode="lines+markers", line={"color": color, "dash": dash},
                marker={"color": color, "size": 7}, legendgroup=method, name=label,
                showlegend=index == 0, hovertemplate=hover,
            ), row=r, col=c)
        if gold_sparsity is not None:
            fig.add_trace(go.Scatter(
                x=[gold_sparsity], y=[1.0], mode="markers", name="full α-entmax",
                marker=FULL_MARKER,
                legendgroup="full", showlegend=index == 0,
                hovertemplate="full α-entmax<br>gold sparsity=%{x:.4f}<extra></extra>",
            ), row=r, col=c)
            fig.add_vline(x=gold_sparsity, line_dash="dash", line_color="black", row=r, col=c)
        fig.update_xaxes(title_text="sparsity", range=[0, 1.0], row=r, col=c)
    fig.update_layout(title=title, template="plotly_white",
                      height=max(420 * rows, legend_height(len(methods) + 1)), margin=MARGIN,
                      legend={"title": "method (frontier)", "x": 1.02, "xanchor": "left",
                              "y": 1.0, "yanchor": "top"})
    return fig


def mark_current(fig: go.Figure, sparsity: float, values: dict[str, float],
                 measures: Sequence[str], label: str) -> go.Figure:
    """The current slider setting as a star on each panel of :func:`accuracy_figure` (the
    same star as on the recall chart)."""
    cols = 2
    for index, measure in enumerate(measures):
        fig.add_trace(go.Scatter(
            x=[sparsity], y=[values[measure]], mode="markers", name=CURRENT_NAME,
            marker=CURRENT_MARKER, showlegend=index == 0, legendgroup="current",
            hovertemplate=f"{label}<br>sparsity=%{{x:.4f}}<br>{measure}=%{{y:.4f}}"
                          "<extra>your setting</extra>",
        ), row=index // cols + 1, col=index % cols + 1)
    return fig

