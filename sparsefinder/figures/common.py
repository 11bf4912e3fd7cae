"""What every figure shares: colours, the modebar config, fast construction, PNG images.

Attention matrices are drawn as PNG image traces (a 512×512 float heatmap is ~1.5 MB of JSON
per figure, a PNG a few KB). Every Plotly figure of the project lives in this package; the
numbers they draw come from the library (``sparsefinder.explore``, ``pareto``, ``clusters``,
``coref``).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from PIL import Image

#: Colours of the diff classes (index = views.DIFF_* code) and of plain graphs. The diff uses
#: Okabe–Ito's colour-blind-safe palette: TP blue (the predicted panel's hue), missed gold
#: edges (FN) vermillion, extra edges (FP) orange — errors warm, kept edges cool, FN darker
#: than FP, so no pair depends on telling red from green.
DIFF_COLORS = {1: (0, 114, 178), 2: (213, 94, 0), 3: (230, 159, 0)}  # TP, FN, FP
DIFF_LABELS = {1: "TP: predicted gold edge", 2: "FN: missed gold edge", 3: "FP: extra edge"}
GOLD_COLOR = (33, 33, 33)
PRED_COLOR = (25, 118, 210)


def swatch(rgb: tuple[int, int, int]) -> str:
    """A coloured square for plotly titles and legends (HTML span): a panel's colour key."""
    return "<span style='color:rgb({},{},{})'>■</span>".format(*rgb)


def diff_swatch(code: int) -> str:
    """The coloured square of a diff class."""
    return swatch(DIFF_COLORS[code])


#: A panel gets the token-label hover overlay when it has at most this many edges (else its
#: image hover shows positions only): thousands of hover points cost the browser ~1 s per
#: update, and at 500 tokens a panel has ~1 pixel per token, where labels are better read
#: in the Token view.
MAX_HOVER_EDGES = 3000
MAX_TICKS = 20
#: Longest matrix side drawn at one pixel per token; longer ones are pooled (see ``pool``).
MAX_PIXELS = 300


def chart_config(filename: str) -> dict:
    """Modebar config: the camera button saves a PNG named after the view."""
    return {
        "displaylogo": False,
        "toImageButtonOptions": {"format": "png", "filename": filename, "scale": 2},
        "modeBarButtonsToRemove": ["lasso2d", "select2d"],
    }


def fast_figure(data: list[dict], layout: dict) -> go.Figure:
    """A Figure from plain dicts without plotly's per-element validation.

    Validation walks every hover string (~200 ms for a few thousand); these figures are built
    by the code below from known-good keys, and ``st.plotly_chart`` does not validate a
    Figure again.
    """
    return go.Figure({"data": data, "layout": layout}, _validate=False)


def png_data_uri(codes: np.ndarray, palette: Sequence[tuple[int, int, int]]) -> str:
    """uint8 class codes (h, w) + one RGB colour per code → ``data:image/png`` URI.

    A palette PNG holds one byte per pixel: faster to encode and smaller than RGB.
    """
    image = Image.fromarray(np.ascontiguousarray(codes, dtype=np.uint8), mode="P")
    image.putpalette([c for rgb in palette for c in rgb])
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def write_figure_html(fig: go.Figure, path: str | Path) -> Path:
    """Self-contained HTML (plotly.js inlined, so it opens offline)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    return path
