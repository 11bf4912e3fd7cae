"""Block overview of one head on a long text: (query block × key block) cells, clickable.

Only blocks holding a gold or predicted pair are drawn (a causal head has none above the
diagonal), as square scatter markers — selectable, so a click reaches the app — coloured by
the prediction's recall in that block (grey: predicted pairs but no gold edge). The window
the Explorer shows is outlined.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from sparsefinder.explore.long_view import BlockOverview
from sparsefinder.figures.common import fast_figure


def block_overview_figure(overview: BlockOverview, window: tuple[int, int],
                          title: str = "") -> go.Figure:
    """The block grid of :func:`~sparsefinder.explore.long_view.block_overview`; each point's
    customdata is its block's first query position (a click moves the window there)."""
    gold, pred = overview.gold.numpy(), overview.predicted.numpy()
    recall = overview.recall.numpy()
    rows, cols = np.nonzero((gold > 0) | (pred > 0))
    b = overview.block
    nb = gold.shape[0]
    size = max(3, min(14, 600 // max(nb, 1)))
    has_gold = gold[rows, cols] > 0
    hover = ("queries %{customdata[1]}–%{customdata[2]} · keys %{customdata[3]}–"
             "%{customdata[4]}<br>gold edges %{customdata[5]} · predicted %{customdata[6]}"
             "<br>recall %{marker.color:.3f}<extra></extra>")

    def custom(r: np.ndarray, c: np.ndarray) -> np.ndarray:
        return np.stack([r * b, r * b, r * b + b - 1, c * b, c * b + b - 1,
                         gold[r, c], pred[r, c]], axis=1)

    data = [
        dict(type="scattergl", x=cols[has_gold].tolist(), y=rows[has_gold].tolist(),
             mode="markers", customdata=custom(rows[has_gold], cols[has_gold]).tolist(),
             marker=dict(symbol="square", size=size,
                         color=recall[rows[has_gold], cols[has_gold]].tolist(),
                         colorscale="Viridis", cmin=0.0, cmax=1.0,
                         colorbar=dict(title=dict(text="recall"), thickness=10)),
             hovertemplate=hover, name="gold"),
        dict(type="scattergl", x=cols[~has_gold].tolist(), y=rows[~has_gold].tolist(),
             mode="markers", customdata=custom(rows[~has_gold], cols[~has_gold]).tolist(),
             marker=dict(symbol="square", size=size, color="#cfcfcf"),
             hovertemplate="queries %{customdata[1]}–%{customdata[2]} · keys "
                           "%{customdata[3]}–%{customdata[4]}<br>predicted %{customdata[6]}, "
                           "no gold edge<extra></extra>", name="predicted only"),
    ]
    start, end = window
    lo, hi = start / b - 0.5, end / b - 0.5
    layout = dict(
        height=420, margin=dict(l=10, r=10, t=30 if title else 10, b=10), showlegend=False,
        title=dict(text=title, font=dict(size=12)) if title else None,
        xaxis=dict(title=dict(text=f"key block ({b} tokens)"), range=[-0.6, nb - 0.4],
                   zeroline=False),
        yaxis=dict(title=dict(text=f"query block ({b} tokens)"), range=[nb - 0.4, -0.6],
                   scaleanchor="x", zeroline=False),
        shapes=[dict(type="rect", x0=lo, x1=hi, y0=lo, y1=hi,
                     line=dict(color="crimson", width=2))],
        plot_bgcolor="white",
    )
    return fast_figure(data, layout)
