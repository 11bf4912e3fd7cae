"""The model view: every head's pattern as a small tile in one layer × head mosaic.

bertviz's model view draws one small attention picture per head; at 512 tokens and 72 heads a
figure per head would cost the browser seconds. Here the tiles are pooled (every edge stays
visible, see ``graphs.pool``) into ONE palette PNG, and one invisible marker per tile carries
the hover text and the click that opens the head.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from sparsefinder.figures.common import (
    DIFF_COLORS,
    GOLD_COLOR,
    PRED_COLOR,
    fast_figure,
    png_data_uri,
)
from sparsefinder.figures.graphs import layer_labels, pool

#: Longest tile side in pixels; longer matrices are pooled down to it.
TILE_PIXELS = 48
_GAP = 3
_WHITE, _GAP_GREY = (255, 255, 255), (210, 210, 210)
_SOFTMAX_VEIL = "rgba(128, 128, 128, 0.45)"  # over a softmax layer's row: greyed
#: code → colour per view: graphs are 0/1, diffs 0–3 (TP, FN, FP); code 4 is the gap.
PALETTES = {
    "gold": [_WHITE, GOLD_COLOR, _WHITE, _WHITE, _GAP_GREY],
    "predicted": [_WHITE, PRED_COLOR, _WHITE, _WHITE, _GAP_GREY],
    "diff": [_WHITE, *DIFF_COLORS.values(), _GAP_GREY],
}
_PRIORITY = {"gold": [0, 1, 0, 0, 0], "predicted": [0, 1, 0, 0, 0], "diff": [0, 2, 3, 1, 0]}


def mosaic(codes: np.ndarray, kind: str) -> tuple[np.ndarray, int]:
    """uint8 codes (layers, heads, n, m) → (mosaic image codes, tile side in pixels)."""
    layers, heads, n, m = codes.shape
    factor = max(1, -(-max(n, m) // TILE_PIXELS))
    tiles = pool(codes, factor, _PRIORITY[kind][:4]) if factor > 1 else codes
    th, tw = tiles.shape[-2:]
    framed = np.pad(tiles, [(0, 0), (0, 0), (0, _GAP), (0, _GAP)], constant_values=4)
    image = framed.transpose(0, 2, 1, 3).reshape(layers * (th + _GAP), heads * (tw + _GAP))
    image = np.ascontiguousarray(image[:-_GAP, :-_GAP])
    return image, max(th, tw)


def heads_figure(codes: np.ndarray, kind: str, selected: tuple[int, int],
                 values: np.ndarray | None = None, metric: str = "",
                 softmax_layers: Sequence[int] = ()) -> go.Figure:
    """Mosaic of every head's graph (``kind``: gold, predicted or diff); the selected head is
    outlined; hover names the head (and ``metric`` from ``values`` (layers, heads)). The rows
    of ``softmax_layers`` (α = 1, dense gold graphs) are greyed and labelled "softmax"."""
    if kind not in PALETTES:
        raise ValueError(f"kind must be one of {list(PALETTES)}, got {kind!r}")
    layers, heads = codes.shape[:2]
    image, tile = mosaic(codes, kind)
    step = tile + _GAP
    centers_x = np.tile(np.arange(heads) * step + tile / 2, layers)
    centers_y = np.repeat(np.arange(layers) * step + tile / 2, heads)
    grid_l, grid_h = np.repeat(np.arange(layers), heads), np.tile(np.arange(heads), layers)
    extra = ([f"<br>{metric} {v:.3f}" for v in values.ravel()] if values is not None
             else [""] * (layers * heads))
    softmax = {int(i) for i in softmax_layers}
    text = [f"layer {lay} · head {hd}{' · softmax layer (α = 1)' if lay in softmax else ''}{e}"
            for lay, hd, e in zip(grid_l, grid_h, extra, strict=True)]
    sel_l, sel_h = selected
    data = [
        dict(type="image", source=png_data_uri(image, PALETTES[kind]), x0=0, dx=1, y0=0, dy=1,
             hoverinfo="skip"),
        dict(type="scatter", x=centers_x.tolist(), y=centers_y.tolist(), mode="markers",
             text=text, customdata=np.stack([grid_l, grid_h], 1).tolist(),
             marker=dict(symbol="square", size=max(tile // 2, 6), color="rgba(0,0,0,0)"),
             hovertemplate="%{text}<extra></extra>"),
    ]
    width = image.shape[1]
    layout = dict(
        height=min(900, 60 + image.shape[0] * max(1, 700 // width)),
        margin=dict(l=40, r=10, t=10, b=30), showlegend=False, plot_bgcolor="white",
        xaxis=dict(range=[-1, width], showgrid=False, zeroline=False, tickmode="array",
                   tickvals=(np.arange(heads) * step + tile / 2).tolist(),
                   ticktext=[f"h{h}" for h in range(heads)], side="top"),
        yaxis=dict(range=[image.shape[0], -1], showgrid=False, zeroline=False,
                   tickmode="array", tickvals=(np.arange(layers) * step + tile / 2).tolist(),
                   ticktext=layer_labels(layers, softmax), automargin=True,
                   scaleanchor="x"),
        shapes=[*(dict(type="rect", x0=-1, x1=width, y0=lay * step - 1, y1=lay * step + tile,
                       fillcolor=_SOFTMAX_VEIL, line=dict(width=0))
                  for lay in sorted(softmax)),
                dict(type="rect", x0=sel_h * step - 1.5, x1=sel_h * step + tile + 0.5,
                     y0=sel_l * step - 1.5, y1=sel_l * step + tile + 0.5,
                     line=dict(color="crimson", width=2))],
    )
    return fast_figure(data, layout)
