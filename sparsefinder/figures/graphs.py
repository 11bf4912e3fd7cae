"""Attention-graph figures: one head (gold | predicted | diff), the layer × head overview and
one query row over every head.

Axes are integer token positions with token strings as tick text: token strings as categories
would merge repeated tokens ("the", ","). A transparent scatter overlay on the edges carries the
token labels on hover.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from sparsefinder.figures.common import (
    DIFF_COLORS,
    DIFF_LABELS,
    GOLD_COLOR,
    MAX_HOVER_EDGES,
    MAX_PIXELS,
    MAX_TICKS,
    PRED_COLOR,
    diff_swatch,
    fast_figure,
    png_data_uri,
    swatch,
)
from sparsefinder.figures.layout import (
    DEFAULT_WIDTH,
    PANEL_GAP,
    TICK_CHARS,
    TITLE_PX,
    TickPlan,
    head_height,
    panel_side,
    tick_plan,
)

#: Up to this many tokens every one is labelled (e.g. a windowed range of a long text).
ALL_TICKS = 64


def _ticks(labels: Sequence[str], plan: TickPlan | None = None
           ) -> tuple[list[int], list[str]]:
    """Tick positions and texts: every ``plan.step``-th token, or (no plan) all up to
    ``ALL_TICKS`` tokens and about ``MAX_TICKS`` beyond."""
    if plan is None:
        plan = TickPlan(1 if len(labels) <= ALL_TICKS else -(-len(labels) // MAX_TICKS), 9)
    positions = plan.positions(len(labels))
    text = [labels[i].split(" · ", 1)[-1] for i in positions]
    return positions, [t if len(t) <= TICK_CHARS else t[: TICK_CHARS - 1] + "…" for t in text]


def _axes(labels: Sequence[str], index: int, domain: tuple[float, float],
          plan: TickPlan) -> dict:
    """Layout of subplot ``index`` (1-based): integer positions with token tick text, every
    ``plan.step``-th token labelled at ``plan.font`` px (labels never overlap)."""
    n = len(labels)
    tickvals, ticktext = _ticks(labels, plan)
    common = dict(tickmode="array", tickvals=tickvals, ticktext=ticktext, showgrid=False,
                  tickfont=dict(size=plan.font), zeroline=False)
    suffix = "" if index == 1 else str(index)
    x = dict(common, domain=list(domain), range=[-0.5, n - 0.5], tickangle=-90,
             title=dict(text="key", standoff=2), constrain="domain", anchor=f"y{suffix}")
    y = dict(common, range=[n - 0.5, -0.5], autorange=False, anchor=f"x{suffix}",
             scaleanchor=f"x{suffix}", constrain="domain", constraintoward="top")
    if index == 1:
        y["title"] = dict(text="query", standoff=2)
    else:  # zooming one panel zooms all three
        x["matches"], y["matches"] = "x", "y"
        y["showticklabels"] = False
    return {f"xaxis{suffix}": x, f"yaxis{suffix}": y}


def pool(codes: np.ndarray, factor: int, priority: Sequence[int]) -> np.ndarray:
    """Shrink class codes by ``factor`` per axis, keeping the most important class per block.

    A 500-token matrix drawn in ~300 screen pixels would lose isolated edges to the browser's
    downscaling; pooling first keeps every edge visible (``priority[c]``: rank of class c).
    Works on a stack of matrices too: ``codes`` (..., n, m).
    """
    if factor <= 1:
        return codes
    rank = np.asarray(priority, dtype=np.uint8)[codes]
    n, m = codes.shape[-2:]
    pad = [(0, 0)] * (codes.ndim - 2) + [(0, -n % factor), (0, -m % factor)]
    rank = np.pad(rank, pad)
    lead = rank.shape[:-2]
    blocks = rank.reshape(*lead, rank.shape[-2] // factor, factor, rank.shape[-1] // factor,
                          factor)
    pooled = blocks.max(axis=(-3, -1))
    back = np.argsort(priority).astype(np.uint8)  # rank -> class
    return back[pooled]


def _image(uri: str, index: int, factor: int = 1) -> dict:
    """The matrix as a PNG; its own hover (positions only) costs the browser nothing.

    A pooled image (``factor`` > 1) covers the same integer axis: pixel p spans tokens
    [p·f, p·f + f).
    """
    suffix = "" if index == 1 else str(index)
    offset = (factor - 1) / 2
    return dict(type="image", source=uri, x0=offset, dx=factor, y0=offset, dy=factor,
                hovertemplate="query %{y} · key %{x}<extra></extra>",
                xaxis=f"x{suffix}", yaxis=f"y{suffix}")


def _overlay(rows: np.ndarray, cols: np.ndarray, tokens: Sequence[str], name: str,
             index: int, probs: np.ndarray | None = None) -> dict:
    """Invisible markers on the edges: hover shows "q12 the -> k40 cat p=0.132" (the gold
    probability when ``probs`` is given; ASCII: no JSON escapes). ``tokens`` are the labels
    "12 the" (positions stay absolute in a windowed range)."""
    text = [f"q{tokens[r]} -> k{tokens[c]}"
            + (f" p={probs[r, c]:.3f}" if probs is not None else "")
            for r, c in zip(rows.tolist(), cols.tolist(), strict=True)]
    suffix = "" if index == 1 else str(index)
    return dict(
        type="scattergl", x=cols.astype(np.int16), y=rows.astype(np.int16), text=text,
        mode="markers", name=name, marker=dict(size=4, color="rgba(0,0,0,0)"),
        hovertemplate=f"%{{text}}<extra>{name}</extra>", xaxis=f"x{suffix}",
        yaxis=f"y{suffix}",
    )


def _ascii_tokens(labels: Sequence[str]) -> list[str]:
    """"12 · the" → "12 the", ASCII only (hover texts stay plain JSON strings)."""
    return [label.replace(" · ", " ", 1).encode("ascii", "replace").decode()
            for label in labels]


def head_figure(gold: np.ndarray, pred: np.ndarray, codes: np.ndarray, labels: Sequence[str],
                tag: str, counts: dict[str, int], probs: np.ndarray | None = None,
                width: float | None = None, edge_hover: str = "all") -> go.Figure:
    """Gold graph, predicted graph and their diff for one head, side by side in ONE figure.

    One figure instead of three: the browser lays out and creates a WebGL context once per
    update, which is most of a slider move's cost on a CPU-only machine. The panels share
    zoom. Panels with more than ``MAX_HOVER_EDGES`` edges hover with positions only.
    Each title carries its colour key: gold edges (α-entmax probability > 0) near-black,
    predicted (kept) pairs blue, and the diff (Okabe–Ito): TP blue, missed gold edges (FN)
    vermillion, extra predicted edges (FP) orange.

    ``width``: the px the figure is drawn in (the app's main column; None: a 1280-px
    screen's). The height follows it so the square panels fill the width, and the tick
    labels follow the cell size (:mod:`sparsefinder.figures.layout`).

    ``edge_hover``: ``"all"`` panels name each edge's tokens on hover, or only the ``"diff"``
    panel (every gold and predicted edge is one of its TP, FN, FP). The per-edge markers are
    most of a redraw in a software-rendered browser (a 256-token window of a 4096-token
    text: ~0.2 s of ~0.45 s a slider move), and the diff panel's alone are ~2/5 of them; the
    other panels then hover with positions only.
    """
    if edge_hover not in ("all", "diff"):
        raise ValueError(f"edge_hover must be 'all' or 'diff', got {edge_hover!r}")
    white = (255, 255, 255)
    # a title is two lines (name; colour key with counts), so thousands of edges never make
    # one panel's title run into the next one's
    panels = [
        (f"<b>Gold {tag}</b><br>{swatch(GOLD_COLOR)} {int(gold.sum())} edges (p>0)",
         gold.view(np.uint8), [white, GOLD_COLOR], {1: "gold"}),
        (f"<b>Predicted</b><br>{swatch(PRED_COLOR)} {int(pred.sum())} kept pairs",
         pred.view(np.uint8), [white, PRED_COLOR], {1: "predicted"}),
        (f"<b>Diff</b><br>{diff_swatch(1)}TP {counts['TP']} {diff_swatch(2)}FN {counts['FN']} "
         f"{diff_swatch(3)}FP {counts['FP']}", codes,
         [white, *DIFF_COLORS.values()], {c: DIFF_LABELS[c].split(":")[0] for c in DIFF_COLORS}),
    ]
    tokens = _ascii_tokens(labels)
    gap = PANEL_GAP
    share = (1 - 2 * gap) / 3
    n = len(labels)
    plan = tick_plan(max(n, 1), panel_side(width or DEFAULT_WIDTH))
    chars = max((len(t) for t in _ticks(labels, plan)[1]), default=1)
    data: list[dict] = []
    layout: dict = dict(
        height=head_height(width, n, chars), margin=dict(l=0, r=0, t=TITLE_PX, b=0),
        plot_bgcolor="white", showlegend=False, hovermode="closest", uirevision="head",
        annotations=[],
    )
    for index, (title, image, palette, classes) in enumerate(panels, start=1):
        left = (index - 1) * (share + gap)
        layout.update(_axes(labels, index, (left, left + share), plan))
        factor = -(-image.shape[0] // MAX_PIXELS)
        # when pooling: FN over TP over FP over nothing; an edge over no edge
        shown = pool(image, factor, [0, 2, 3, 1] if len(palette) == 4 else [0, 1])
        data.append(_image(png_data_uri(shown, palette), index, factor))
        hover = edge_hover == "all" or index == len(panels)
        if hover and np.count_nonzero(image) <= MAX_HOVER_EDGES:
            for code, name in classes.items():
                rows, cols = np.nonzero(image == code)
                if len(rows):
                    data.append(_overlay(rows, cols, tokens, name, index, probs))
        layout["annotations"].append(dict(
            text=title, y=1.0, xref="paper", yref="paper", yanchor="bottom", showarrow=False,
            font=dict(size=11), **_title_place(title, left, share, width or DEFAULT_WIDTH)))
    return fast_figure(data, layout)


#: Width of one character of an 11-px panel title, in px (a generous average: digits and
#: capitals of the sans-serif font Plotly draws with).
TITLE_CHAR_PX = 6.5


def _title_place(title: str, left: float, share: float, width: float) -> dict:
    """Where a panel title goes: centred over its panel, or, when its key line is wider than
    the panel (thousands of edges on a narrow screen), flush with the panel's right edge, so
    it runs into the gap on its left and never over the neighbouring panel's title."""
    visible = max(len(re.sub(r"<[^>]+>", "", line)) for line in title.split("<br>"))
    if visible * TITLE_CHAR_PX <= share * width:
        return dict(x=left + share / 2, xanchor="center")
    return dict(x=left + share, xanchor="right")


#: Above this many tokens a cluster's edges are not outlined one by one (the markers would
#: cover the graphs): ticks on the top edge mark the keys they reach instead.
OUTLINE_MAX_TOKENS = 160
#: Outlines are thin and translucent: the graph under them stays readable.
OUTLINE_COLOR = "rgba(0, 0, 0, 0.55)"


def outline_cluster(fig: go.Figure, edges: np.ndarray, rows: np.ndarray, cluster: int,
                    labels: Sequence[str]) -> go.Figure:
    """Outline one k-means cluster on the three panels of :func:`head_figure`: its query rows
    as ticks on the left edge of each panel, and its edges as thin open squares the size of a
    cell — or, beyond ``OUTLINE_MAX_TOKENS`` tokens, the keys of its edges as ticks on the
    top edge. Two traces a panel, named ``cluster <id>``. The ticks sit in a margin the axes
    are widened by (WebGL markers outside an axis range are not drawn)."""
    tokens = _ascii_tokens(labels)
    n = len(labels)
    e_rows, e_cols = np.nonzero(edges)
    q_rows = np.nonzero(rows)[0]
    name = f"cluster {cluster}"
    tick = dict(size=6, color=OUTLINE_COLOR)
    if n <= OUTLINE_MAX_TOKENS:
        cell = float(np.clip(360 / max(n, 1), 2, 6))  # a panel is ~360 px wide
        edge_trace = dict(
            x=e_cols.astype(np.int32), y=e_rows.astype(np.int32), hoverinfo="skip",
            marker=dict(symbol="square-open", size=cell, color=OUTLINE_COLOR,
                        line=dict(width=0.75, color=OUTLINE_COLOR)))
    else:
        keys = np.unique(e_cols)
        edge_trace = dict(
            x=keys.astype(np.int32), y=np.full(len(keys), -1.5),
            text=[f"k{tokens[k]}" for k in keys.tolist()],
            hovertemplate=f"%{{text}}<extra>{name}: a key of its edges</extra>",
            marker=dict(symbol="triangle-down", **tick))
    for index in range(1, 4):
        suffix = "" if index == 1 else str(index)
        fig.update_layout({f"xaxis{suffix}.range": [-2.5, n - 0.5],
                           f"yaxis{suffix}.range": [n - 0.5, -2.5]})
        fig.add_trace(dict(type="scattergl", mode="markers", name=name,
                           xaxis=f"x{suffix}", yaxis=f"y{suffix}", **edge_trace))
        fig.add_trace(dict(
            type="scattergl", x=np.full(len(q_rows), -1.5), y=q_rows.astype(np.int32),
            text=[f"q{tokens[r]}" for r in q_rows.tolist()], mode="markers", name=name,
            marker=dict(symbol="triangle-right", **tick),
            hovertemplate=f"%{{text}}<extra>{name}</extra>",
            xaxis=f"x{suffix}", yaxis=f"y{suffix}"))
    return fig


PAIR_COLOR = "rgb(103, 58, 183)"


def mark_pair(fig: go.Figure, row: int, col: int, label: str) -> go.Figure:
    """Ring one query–key cell (``row``, ``col`` on the figure's axes) on the three panels of
    :func:`head_figure`: the pair picked on the Learned space page."""
    for index in range(1, 4):
        suffix = "" if index == 1 else str(index)
        fig.add_trace(dict(
            type="scatter", mode="markers", x=[col], y=[row], name="picked pair",
            text=[label], hovertemplate="%{text}<extra>picked pair</extra>",
            marker=dict(symbol="circle-open", size=16, color=PAIR_COLOR,
                        line=dict(width=2.5, color=PAIR_COLOR)),
            xaxis=f"x{suffix}", yaxis=f"y{suffix}"))
    return fig


#: Fill of a softmax layer's cells: grey, crossed (its dense gold graph is not a finding).
SOFTMAX_CELL = "#d4d4d4"


def layer_labels(layers: int, softmax_layers: Sequence[int] = ()) -> list[str]:
    """Axis labels ``L0``, ``L1 softmax``, …: a softmax layer (α = 1) is named as such."""
    softmax = {int(i) for i in softmax_layers}
    return [f"L{i} softmax" if i in softmax else f"L{i}" for i in range(layers)]


def overview_figure(values: np.ndarray, metric: str, selected: tuple[int, int],
                    softmax_layers: Sequence[int] = ()) -> go.Figure:
    """Clickable layer × head grid coloured by a metric; the chosen head is outlined.

    Drawn as square scatter markers rather than a heatmap: scatter points are selectable,
    so a click reaches the app through ``on_select``. The cells of ``softmax_layers`` (α = 1:
    every allowed pair is a gold edge) are grey and crossed, and the axis says "softmax", so
    a dense layer reads as the model's choice, not as a predictor's result.
    """
    layers, heads = values.shape
    grid_l, grid_h = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
    dense = np.isin(grid_l, [int(i) for i in softmax_layers])
    size = 28
    hover = f"layer %{{y}} · head %{{x}}<br>{metric} %{{marker.color:.3f}}<extra></extra>"
    data = [
        dict(type="scatter", x=grid_h[~dense].tolist(), y=grid_l[~dense].tolist(),
             mode="markers",
             marker=dict(symbol="square", size=size, color=values[~dense].tolist(),
                         colorscale="Viridis", cmin=0.0, cmax=1.0,
                         colorbar=dict(title=dict(text=metric), thickness=10)),
             hovertemplate=hover),
    ]
    if dense.any():
        data.append(dict(
            type="scatter", x=grid_h[dense].tolist(), y=grid_l[dense].tolist(),
            mode="markers", customdata=values[dense].tolist(),
            marker=dict(symbol="square-x", size=size, color=SOFTMAX_CELL,
                        line=dict(color="grey", width=1)),
            hovertemplate=(f"layer %{{y}} · head %{{x}}<br>softmax layer (α = 1): every pair "
                           f"is a gold edge<br>{metric} %{{customdata:.3f}}<extra></extra>")))
    data.append(dict(type="scatter", x=[selected[1]], y=[selected[0]], mode="markers",
                     hoverinfo="skip",
                     marker=dict(symbol="square-open", size=size + 6, color="crimson",
                                 line=dict(width=3))))
    layout = dict(
        height=50 + layers * (size + 14),
        margin=dict(l=10, r=10, t=10, b=10), showlegend=False,
        xaxis=dict(title=dict(text="head"), tickmode="linear", dtick=1,
                   range=[-0.6, heads - 0.4]),
        yaxis=dict(title=dict(text="layer"), tickmode="array", tickvals=list(range(layers)),
                   ticktext=layer_labels(layers, softmax_layers), automargin=True,
                   range=[layers - 0.4, -0.6]),
        plot_bgcolor="white",
    )
    return fast_figure(data, layout)


def token_figure(frame: pd.DataFrame, labels: Sequence[str], query: int,
                 heads: Sequence[int], direction: str = "row") -> go.Figure:
    """One token, every head: gold probability per key (``direction="row"``) or per query
    that attends to it (``"column"``) as bars, predictions as ticks.

    Rows are heads (small multiples sharing the key axis), so a 512-token row stays readable.
    Ticks under the bars: TP blue, FN vermillion (a gold key the predictor misses), FP
    orange.
    """
    tokens = _ascii_tokens(labels)
    rows = len(heads)
    gap = 0.012
    band = (1 - gap * (rows - 1)) / rows
    data: list[dict] = []
    layout: dict = dict(
        height=60 + 46 * rows, margin=dict(l=40, r=10, t=30, b=10), showlegend=False,
        bargap=0.0, plot_bgcolor="white", hovermode="closest",
        title=dict(text=(f"query {labels[query]}" if direction == "row" else
                         f"queries attending to key {labels[query]}")
                   + ": gold probability (bars); ticks: TP blue · FN vermillion · FP orange",
                   font=dict(size=13)),
    )
    tickvals, ticktext = _ticks(labels)
    layout["xaxis"] = dict(tickmode="array", tickvals=tickvals, ticktext=ticktext,
                           tickangle=-90, tickfont=dict(size=9),
                           range=[-0.5, len(labels) - 0.5], anchor=f"y{rows}")
    for row, head in enumerate(heads, start=1):
        axis = f"y{row}" if row > 1 else "y"
        top = 1 - (row - 1) * (band + gap)
        layout[f"yaxis{row}" if row > 1 else "yaxis"] = dict(
            domain=[top - band, top], range=[-0.2, 1.0], showticklabels=False,
            title=dict(text=f"h{head}", font=dict(size=10)), zeroline=False, anchor="x")
        part = frame[frame["head"] == head]
        keys = part["key"].to_numpy()
        data.append(dict(type="bar", x=keys, y=part["gold_prob"].to_numpy(), yaxis=axis,
                         marker=dict(color="rgb(33,33,33)"), text=[tokens[k] for k in keys],
                         textposition="none",
                         hovertemplate=f"k%{{text}}<br>gold p=%{{y:.3f}}"
                                       f"<extra>head {head}</extra>"))
        for code, status in ((1, "TP"), (2, "FN"), (3, "FP")):
            mark = part[part["status"] == status]
            if mark.empty:
                continue
            keys = mark["key"].to_numpy()
            data.append(dict(
                type="scatter", x=keys, y=np.full(len(keys), -0.1), yaxis=axis,
                mode="markers", text=[tokens[k] for k in keys],
                marker=dict(symbol="line-ns-open", size=8, line=dict(width=2),
                            color="rgb({},{},{})".format(*DIFF_COLORS[code])),
                hovertemplate=f"k%{{text}}<extra>{status} · head {head}</extra>"))
    return fast_figure(data, layout)
