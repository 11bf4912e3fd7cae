"""Block overview of one head on a long text: (query block × key block) cells, clickable.

The cells are two heatmaps — blocks holding a gold edge, coloured by the prediction's recall
in the block, and blocks with predicted pairs but no gold edge, in grey; empty blocks stay
blank (a causal head has none above the diagonal). A heatmap redraws ~6× faster than one
WebGL marker per block in a software-rendered browser (27 vs 176 ms for 128 × 128 blocks),
but Streamlit's plotly selection returns no point for a heatmap click, so a strip of one
small marker per query block, left of the grid, carries the click (its customdata is the
block's first query position). The window the Explorer shows is outlined.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from sparsefinder.explore.long_view import BlockOverview
from sparsefinder.figures.common import fast_figure

#: x of the clickable query-block strip, left of key block 0, and its trace's index.
STRIP_X = -1.5
STRIP_TRACE = 2
_GREY = "#cfcfcf"


def block_overview_figure(overview: BlockOverview, window: tuple[int, int],
                          title: str = "") -> go.Figure:
    """The block grid of :func:`~sparsefinder.explore.long_view.block_overview`: cell (i, j)
    is query block i × key block j; x and y count blocks, the hover names the first token of
    each. A click on the strip's marker of row i moves the window to that query block."""
    gold, pred = overview.gold.numpy(), overview.predicted.numpy()
    recall = overview.recall.numpy().astype(np.float32)  # NaN where no gold edge: blank
    only_pred = np.where((gold == 0) & (pred > 0), pred, np.nan).astype(np.float32)
    b = overview.block
    nb, mb = gold.shape
    starts = np.arange(nb, dtype=np.int32) * b
    data = [
        dict(type="heatmap", z=recall, customdata=gold.astype(np.uint16), zmin=0.0, zmax=1.0,
             colorscale="Viridis", colorbar=dict(title=dict(text="recall"), thickness=10),
             hovertemplate=f"query block %{{y}} · key block %{{x}} ({b} tokens each)<br>"
                           "gold edges %{customdata} · recall %{z:.3f}<extra></extra>",
             name="gold"),
        dict(type="heatmap", z=only_pred, colorscale=[[0, _GREY], [1, _GREY]],
             showscale=False, hovertemplate=f"query block %{{y}} · key block %{{x}} ({b} "
                                            "tokens each)<br>predicted %{z}, no gold edge"
                                            "<extra></extra>", name="predicted only"),
        dict(type="scatter", mode="markers", x=np.full(nb, STRIP_X, dtype=np.float32),
             y=np.arange(nb, dtype=np.int32), customdata=starts,
             marker=dict(symbol="triangle-right", size=max(4, min(10, 600 // max(nb, 1))),
                         color="#888888"),
             hovertemplate="query block %{y}: click to show its queries (from token "
                           "%{customdata})<extra></extra>", name="query blocks"),
    ]
    start, end = window
    lo, hi = start / b - 0.5, end / b - 0.5
    layout = dict(
        height=420, margin=dict(l=10, r=10, t=30 if title else 10, b=10), showlegend=False,
        title=dict(text=title, font=dict(size=12)) if title else None,
        xaxis=dict(title=dict(text=f"key block ({b} tokens)"), range=[STRIP_X - 0.6, mb - 0.4],
                   zeroline=False, constrain="domain"),  # square cells: narrow, not widen
        yaxis=dict(title=dict(text=f"query block ({b} tokens)"), range=[nb - 0.4, -0.6],
                   scaleanchor="x", zeroline=False),
        shapes=[dict(type="rect", x0=lo, x1=hi, y0=lo, y1=hi,
                     line=dict(color="crimson", width=2))],
        plot_bgcolor="white", clickmode="event+select",
    )
    return fast_figure(data, layout)
