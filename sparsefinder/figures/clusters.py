"""Plotly figures for the cluster analysis (paper Fig. 6), shared by the CLI and the app.

Every function takes the tables of :mod:`sparsefinder.analysis.clusters` and returns a
``go.Figure``; nothing here computes statistics, so the figures always show exactly what the
CSV files hold.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.colors as pc
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sparsefinder.analysis.pos import SPECIAL_TAG, UPOS_TAGS

_TAG_ORDER = (*UPOS_TAGS, SPECIAL_TAG)


def order_tags(tags: Sequence[str]) -> list[str]:
    """Tags in the fixed UPOS order (stable colours/axes across heads), unknown ones last."""
    rank = {tag: i for i, tag in enumerate(_TAG_ORDER)}
    return sorted(tags, key=lambda t: (rank.get(t, len(rank)), t))


def cluster_colors(n_clusters: int) -> list[str]:
    """One distinct colour per cluster id (qualitative palettes, repeated beyond 24)."""
    palette = pc.qualitative.Plotly + pc.qualitative.Dark24
    return [palette[c % len(palette)] for c in range(n_clusters)]


def _bar_traces(percentages: pd.DataFrame, counts: pd.Series | None, show_legend: bool):
    tags = order_tags(list(percentages.index))
    table = percentages.loc[tags]
    colors = cluster_colors(len(table.columns))
    hover_counts = counts.reindex(tags).fillna(0).astype(int) if counts is not None else None
    for position, cluster in enumerate(table.columns):
        custom = None if hover_counts is None else hover_counts.to_numpy()
        yield go.Bar(
            name=f"cluster {cluster}",
            x=tags,
            y=table[cluster].to_numpy(),
            marker_color=colors[position],
            legendgroup=str(cluster),
            showlegend=show_legend,
            customdata=custom,
            hovertemplate=(
                f"cluster {cluster}<br>%{{x}}: %{{y:.1f}}%"
                + ("<br>%{customdata} tokens with this tag" if custom is not None else "")
                + "<extra></extra>"
            ),
        )


def breakdown_figure(
    percentages: pd.DataFrame, *, title: str = "", counts: pd.Series | None = None
) -> go.Figure:
    """Stacked bars: one bar per POS tag, split into the share (%) of each cluster.

    ``percentages``: tag × cluster table whose rows sum to 100 (``clusters.to_percentages``).
    ``counts`` (optional): tokens per tag, shown on hover.
    """
    fig = go.Figure(list(_bar_traces(percentages, counts, show_legend=True)))
    fig.update_layout(
        barmode="stack",
        title=title or None,
        xaxis_title="POS tag",
        yaxis_title="% of the tag's tokens",
        yaxis_range=[0, 100],
        legend_title_text="cluster",
    )
    return fig


def queries_keys_figure(
    query_percentages: pd.DataFrame,
    key_percentages: pd.DataFrame,
    *,
    title: str = "",
    query_counts: pd.Series | None = None,
    key_counts: pd.Series | None = None,
) -> go.Figure:
    """Fig. 6 for one head: queries (top) and keys (bottom), one shared cluster legend."""
    fig = make_subplots(rows=2, cols=1, subplot_titles=("queries", "keys"), vertical_spacing=0.12)
    for row, (table, counts) in enumerate(
        ((query_percentages, query_counts), (key_percentages, key_counts)), start=1
    ):
        for trace in _bar_traces(table, counts, show_legend=row == 1):
            fig.add_trace(trace, row=row, col=1)
        fig.update_yaxes(title_text="% of tag", range=[0, 100], row=row, col=1)
    fig.update_layout(barmode="stack", title=title or None, legend_title_text="cluster", height=700)
    return fig


def pos_recall_figure(scores: pd.DataFrame, *, title: str = "") -> go.Figure:
    """Recall and sparsity of the predicted graph per query POS tag (grouped bars).

    ``scores``: :func:`clusters.tag_scores` output (columns recall, sparsity, tokens).
    """
    tags = order_tags(list(scores.index))
    table = scores.loc[tags]
    tokens = table["tokens"].to_numpy()
    fig = go.Figure(
        [
            go.Bar(
                name=metric,
                x=tags,
                y=table[metric].to_numpy(),
                customdata=tokens,
                hovertemplate=f"%{{x}}: {metric} %{{y:.3f}}<br>%{{customdata}} query tokens"
                "<extra></extra>",
            )
            for metric in ("recall", "sparsity")
        ]
    )
    fig.update_layout(
        barmode="group",
        title=title or None,
        xaxis_title="POS tag of the query",
        yaxis_range=[0, 1.05],
    )
    return fig
