"""Sparsity–recall figures: each method's points and frontier, the gold sparsity, the current
setting as a star (the numbers come from ``sparsefinder.evaluation.sweep``)."""

from __future__ import annotations

import pandas as pd
import plotly.colors as pc
import plotly.graph_objects as go

from sparsefinder.evaluation.frontier import pareto_frontier

#: 24 distinct colours (plotly's Dark24): one per method family, no repeats below 24.
_PALETTE = list(pc.qualitative.Dark24)


def pareto_figure(
    df: pd.DataFrame, gold_sparsity: float | None = None, title: str = "Sparsity–recall",
    *, frontier: pd.DataFrame | None = None,
) -> go.Figure:
    """All points (faint) and each method's frontier (line); gold sparsity as a dashed line.

    ``<method>+window`` shares ``<method>``'s colour with a dashed line. Hover shows params.
    """
    fig = go.Figure()
    families: dict[str, str] = {}
    if frontier is None:  # a caller that already has it passes it
        frontier = pareto_frontier(df)
    for method in dict.fromkeys(df["method"]):
        family = method.split("+")[0]
        color = families.setdefault(family, _PALETTE[len(families) % len(_PALETTE)])
        dash = "dash" if "+" in method else "solid"
        points = df[df["method"] == method]
        front = frontier[frontier["method"] == method]
        hover = "%{customdata}<br>sparsity=%{x:.4f}<br>recall=%{y:.4f}<extra>" + method + "</extra>"
        fig.add_trace(go.Scatter(
            x=points["sparsity"], y=points["recall"], customdata=points["params"],
            mode="markers", marker={"color": color, "opacity": 0.35, "size": 6},
            legendgroup=method, showlegend=False, name=f"{method} (all)",
            hovertemplate=hover,
        ))
        fig.add_trace(go.Scatter(
            x=front["sparsity"], y=front["recall"], customdata=front["params"],
            mode="lines+markers", line={"color": color, "dash": dash},
            marker={"color": color, "size": 8}, legendgroup=method, name=method,
            hovertemplate=hover,
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
        legend={"title": "method (frontier)", "font": {"size": 10}, "tracegroupgap": 0},
        height=max(460, 30 + 18 * df["method"].nunique()),  # the legend never gets cut
    )
    return fig


def mark_current(fig: go.Figure, sparsity: float, recall: float, label: str) -> go.Figure:
    """The current slider setting as a star on a sparsity–recall figure."""
    fig.add_trace(go.Scatter(
        x=[sparsity], y=[recall], mode="markers", name="current setting",
        marker=dict(symbol="star", size=16, color="gold", line=dict(color="black", width=1)),
        hovertemplate=f"{label}<br>sparsity=%{{x:.4f}}<br>recall=%{{y:.4f}}"
                      "<extra>current</extra>",
    ))
    return fig
