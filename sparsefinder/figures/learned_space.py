"""Figures of the learned-space view: why one query keeps or misses each key.

They draw a :class:`~sparsefinder.explore.learned_space.HeadSpace` and compute nothing but
plot coordinates. Keys are coloured as in the Explorer's diff (kept gold key blue, missed
vermillion, extra orange, the others grey); a diamond marks a key kept only by the window / global
tokens. Every point carries ``customdata = [side, position]`` (side "q" or "k"), which the
app reads when a point is clicked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import torch

from sparsefinder.explore.learned_space import (
    KMEANS,
    QUANTIZATION,
    THRESHOLD,
    HeadSpace,
    kmeans_region,
)
from sparsefinder.figures.common import DIFF_COLORS, fast_figure

OTHER_COLOR = "rgb(176, 190, 197)"
QUERY_COLOR = "rgb(120, 120, 120)"
SELECTED_COLOR = "rgb(0, 0, 0)"
DECISION_COLOR = "rgb(103, 58, 183)"  # threshold, chosen clusters, the query's bins
#: (code, legend name) of the key classes, drawn in this order (gold keys on top).
KEY_CLASSES = ((0, "other key"), (3, "FP extra key"), (1, "TP kept gold key"),
               (2, "FN missed gold key"))
SPACE_HEIGHT = 520
ROW_HEIGHT = 420
REGION_STEPS = 80


def _rgb(code: int) -> str:
    return OTHER_COLOR if code == 0 else "rgb({}, {}, {})".format(*DIFF_COLORS[code])


def key_codes(space: HeadSpace) -> np.ndarray:
    """uint8 (m,): 0 other, 1 TP, 2 FN, 3 FP (the Explorer's diff codes) of the row."""
    gold = space.gold.numpy().astype(np.uint8)
    pred = space.predicted.numpy().astype(np.uint8)
    return (gold * (2 - pred) + pred * (1 - gold) * 3).astype(np.uint8)


def _hover_keys(space: HeadSpace, labels: Sequence[str]) -> list[str]:
    d = space.distances.numpy()
    p = space.probs.numpy()
    pattern = space.by_pattern.numpy()
    out = []
    for j in range(len(d)):
        text = f"key {labels[j]}<br>d = {d[j]:.4g} (exact, r-dim)"
        if p[j] > 0:
            text += f"<br>gold p = {p[j]:.3f}"
        if pattern[j]:
            text += "<br>kept by the window / global tokens"
        out.append(text)
    return out


def _marker_sizes(space: HeadSpace, base: float) -> np.ndarray:
    """Gold keys grow with their probability (missed mass reads at a glance)."""
    return base + 14.0 * np.sqrt(space.probs.numpy())


def _key_traces(space: HeadSpace, labels: Sequence[str], x: np.ndarray, y: np.ndarray,
                axes: tuple[str, str] = ("x", "y"), legend: bool = True,
                base: float = 7.0) -> list[dict]:
    codes = key_codes(space)
    hover = np.array(_hover_keys(space, labels), dtype=object)
    sizes = _marker_sizes(space, base)
    pattern = space.by_pattern.numpy()
    traces = []
    for code, name in KEY_CLASSES:
        idx = np.nonzero(codes == code)[0]
        if not len(idx):
            continue
        traces.append(dict(
            type="scattergl" if code == 0 and len(idx) > 300 else "scatter", mode="markers",
            name=f"{name} ({len(idx)})", x=x[idx].tolist(), y=y[idx].tolist(),
            xaxis=axes[0], yaxis=axes[1], showlegend=legend, legendgroup=str(code),
            customdata=[["k", int(j)] for j in idx], text=hover[idx].tolist(),
            hovertemplate="%{text}<extra></extra>",
            marker=dict(color=_rgb(code), size=sizes[idx].tolist(),
                        symbol=["diamond" if pattern[j] else "circle" for j in idx],
                        line=dict(width=0.5, color="white"),
                        opacity=0.55 if code == 0 else 0.95),
            # a click selects a point: keep the others readable, not faded out
            unselected=dict(marker=dict(opacity=0.5 if code == 0 else 0.85))))
    return traces


def space_figure(space: HeadSpace, labels: Sequence[str], title: str = "") -> go.Figure:
    """The head's queries and keys on its plane, the selected query as a star, and the
    decision where it can be drawn: the threshold circle (exact only when r ≤ 2: a projection
    never lengthens a distance, so a kept key always falls inside it), the k-means centroids
    with the query's chosen ones (and, r = 2, the region they keep), the query's bins (r = 2)."""
    q2 = space.queries_2d.numpy()
    k2 = space.keys_2d.numpy()
    i = space.query
    others = [p for p in range(len(q2)) if p != i]
    data: list[dict] = [dict(
        type="scatter", mode="markers", name="queries", x=q2[others, 0].tolist(),
        y=q2[others, 1].tolist(), customdata=[["q", p] for p in others],
        text=[f"query {labels[p]}" for p in others],
        hovertemplate="%{text}<br>click: make it the selected query<extra></extra>",
        marker=dict(color=QUERY_COLOR, size=5, symbol="x-thin-open", opacity=0.5),
        visible="legendonly" if len(q2) > 300 else True)]
    data += _key_traces(space, labels, k2[:, 0], k2[:, 1])
    shapes: list[dict] = []
    decision = space.decision
    qx, qy = float(q2[i, 0]), float(q2[i, 1])
    exact = space.plane.exact
    if decision.kind == THRESHOLD and decision.threshold is not None \
            and math.isfinite(decision.threshold):
        t = decision.threshold
        shapes.append(dict(type="circle", xref="x", yref="y", x0=qx - t, x1=qx + t,
                           y0=qy - t, y1=qy + t, layer="below",
                           line=dict(color=DECISION_COLOR, width=2,
                                     dash="solid" if exact else "dash"),
                           fillcolor="rgba(103, 58, 183, 0.06)"))
    if decision.kind == KMEANS:
        data += _centroid_traces(space)
        data += _region_trace(space, k2, q2)
    if decision.kind == QUANTIZATION and exact and decision.bands is not None:
        shapes += _band_shapes(decision.bands.numpy())
    data.append(dict(
        type="scatter", mode="markers", name=f"selected query {labels[i]}", x=[qx], y=[qy],
        customdata=[["q", i]], text=[f"selected query {labels[i]}"],
        hovertemplate="%{text}<extra></extra>",
        marker=dict(color=SELECTED_COLOR, size=18, symbol="star",
                    line=dict(width=1, color="white"))))
    axis = ("dim 1", "dim 2") if exact else ("PC 1 of the keys", "PC 2 of the keys")
    shown = [q2, k2]
    if decision.kind == KMEANS:
        shown.append(space.plane.apply(decision.centroids).numpy())
    view = _extent(np.concatenate(shown))  # the points fill the view; a wide circle clips
    layout = dict(
        title=dict(text=title, font=dict(size=14)) if title else None,
        height=SPACE_HEIGHT, margin=dict(l=10, r=10, t=40 if title else 10, b=10),
        plot_bgcolor="white", hovermode="closest", shapes=shapes, uirevision="space",
        legend=dict(orientation="h", yanchor="top", y=-0.14, x=0, font=dict(size=11)),
        xaxis=dict(title=dict(text=axis[0]), zeroline=False, gridcolor="#eee",
                   range=view[0]),
        yaxis=dict(title=dict(text=axis[1]), zeroline=False, gridcolor="#eee",
                   range=view[1], scaleanchor="x", scaleratio=1),
        clickmode="event+select")
    return fast_figure(data, layout)


def query_figure(space: HeadSpace, labels: Sequence[str]) -> go.Figure:
    """The keys around the selected query, each at its EXACT r-dimensional distance.

    Why: the PCA plane cannot show a threshold when the distances are decided off the plane
    (augmented projections: every key 21–23 away, the plane a few units wide). Here a key's
    direction from the query is the plane's, its radius ``d − ρ0`` with ``ρ0`` just below the
    nearest key's distance, a monotone map: a key lies inside the circle of radius ``t − ρ0``
    iff ``d ≤ t``, so the circle IS the decision. Keys a per-row floor keeps beyond ``t``
    fall inside a second, dashed circle (the farthest key the learned part kept).
    """
    q2 = space.queries_2d[space.query].numpy()
    k2 = space.keys_2d.numpy()
    d = space.distances.double().numpy()
    allowed = space.allowed.numpy()
    reach = d[allowed] if allowed.any() else d
    span = float(reach.max() - reach.min()) if len(reach) else 1.0
    rho0 = float(reach.min()) - 0.08 * max(span, 1e-6) if len(reach) else 0.0
    offset = k2 - q2
    norm = np.linalg.norm(offset, axis=1)
    angle = np.where(norm > 0, np.arctan2(offset[:, 1], offset[:, 0]),
                     np.linspace(0, 2 * np.pi, len(d), endpoint=False))
    radius = np.maximum(d - rho0, 0.0)
    data = _key_traces(space, labels, radius * np.cos(angle), radius * np.sin(angle))
    circles: list[tuple[float, str, str]] = []
    decision = space.decision
    t = decision.threshold if decision.kind == THRESHOLD else None
    if t is not None and math.isfinite(t):
        circles.append((t, "solid", f"t = {t:.4g}"))
    kept = decision.keep.numpy() & allowed
    if kept.any() and (t is None or not math.isfinite(t) or float(d[kept].max()) > t + 1e-9):
        circles.append((float(d[kept].max()), "dot", "the row's nearest keys (floor)"))
    steps = np.linspace(0, 2 * np.pi, 121)
    for value, dash, name in circles:
        ring = max(value - rho0, 0.0)
        data.append(dict(type="scatter", mode="lines", name=name, hoverinfo="skip",
                         x=(ring * np.cos(steps)).tolist(), y=(ring * np.sin(steps)).tolist(),
                         line=dict(color=DECISION_COLOR, width=2, dash=dash)))
    data.append(dict(
        type="scatter", mode="markers", name=f"selected query {labels[space.query]}", x=[0.0],
        y=[0.0], customdata=[["q", space.query]], hovertemplate="%{text}<extra></extra>",
        text=[f"selected query {labels[space.query]}"],
        marker=dict(color=SELECTED_COLOR, size=18, symbol="star",
                    line=dict(width=1, color="white"))))
    extent = float(max(radius.max() if len(radius) else 1.0,
                       *(max(v - rho0, 0.0) for v, _, _ in circles))) * 1.08
    layout = dict(
        height=SPACE_HEIGHT, margin=dict(l=10, r=10, t=10, b=10), plot_bgcolor="white",
        hovermode="closest", uirevision="query-space", clickmode="event+select",
        legend=dict(orientation="h", yanchor="top", y=-0.14, x=0, font=dict(size=11)),
        xaxis=dict(title=dict(text=f"distance − {rho0:.4g} (exact), direction on the plane"),
                   zeroline=False, gridcolor="#eee", range=[-extent, extent]),
        yaxis=dict(zeroline=False, gridcolor="#eee", range=[-extent, extent],
                   scaleanchor="x", scaleratio=1))
    return fast_figure(data, layout)


def _extent(points: np.ndarray, pad: float = 0.08) -> list[list[float]]:
    """[x range, y range] holding ``points`` (n, 2) with a margin."""
    low, high = points.min(0), points.max(0)
    margin = pad * np.maximum(high - low, 1e-6)
    return [[float(low[i] - margin[i]), float(high[i] + margin[i])] for i in range(2)]


def _centroid_traces(space: HeadSpace) -> list[dict]:
    decision = space.decision
    c2 = space.plane.apply(decision.centroids).numpy()
    chosen = set(decision.query_clusters.tolist())
    members = torch.bincount(decision.key_clusters[:, 0],
                             minlength=len(c2)).tolist()  # keys whose nearest it is
    traces = []
    for picked in (False, True):
        idx = [c for c in range(len(c2)) if (c in chosen) == picked]
        if not idx:
            continue
        traces.append(dict(
            type="scatter", mode="markers+text",
            name="the query's clusters" if picked else "other centroids",
            x=c2[idx, 0].tolist(), y=c2[idx, 1].tolist(), text=[f"c{c}" for c in idx],
            textposition="top center", textfont=dict(
                color=DECISION_COLOR if picked else QUERY_COLOR, size=11),
            hovertext=[f"centroid c{c}<br>nearest centroid of {members[c]} keys" for c in idx],
            hovertemplate="%{hovertext}<extra></extra>",
            marker=dict(symbol="x", size=14 if picked else 10,
                        color=DECISION_COLOR if picked else QUERY_COLOR,
                        line=dict(width=1, color="white"))))
    return traces


def _region_trace(space: HeadSpace, k2: np.ndarray, q2: np.ndarray) -> list[dict]:
    """r = 2 only: the part of the plane whose keys the query keeps, shaded."""
    points = np.concatenate([k2, q2, space.plane.apply(space.decision.centroids).numpy()])
    low, high = points.min(0), points.max(0)
    pad = 0.08 * np.maximum(high - low, 1e-6)
    xs = torch.linspace(float(low[0] - pad[0]), float(high[0] + pad[0]), REGION_STEPS)
    ys = torch.linspace(float(low[1] - pad[1]), float(high[1] + pad[1]), REGION_STEPS)
    inside = kmeans_region(space, xs, ys)
    if inside is None:
        return []
    return [dict(type="heatmap", x=xs.tolist(), y=ys.tolist(), z=inside.int().tolist(),
                 colorscale=[[0, "rgba(0,0,0,0)"], [1, "rgba(103, 58, 183, 0.10)"]],
                 showscale=False, hoverinfo="skip", name="kept region")]


def _band_shapes(bands: np.ndarray) -> list[dict]:
    """r = 2 only: the query's bin along dimension 1 (a vertical band) and 2 (horizontal)."""
    shapes = []
    for dim, (low, high) in enumerate(bands[:2]):
        if not np.isfinite(low):
            continue
        box = (dict(x0=low, x1=high, y0=0, y1=1, xref="x", yref="paper") if dim == 0 else
               dict(y0=low, y1=high, x0=0, x1=1, yref="y", xref="paper"))
        shapes.append(dict(type="rect", layer="below", line=dict(width=0),
                           fillcolor="rgba(103, 58, 183, 0.10)", **box))
    return shapes


def row_figure(space: HeadSpace, labels: Sequence[str]) -> go.Figure:
    """The row at a glance: every key's exact projected distance to the query, nearest
    first, with the threshold line (methods that have one) and, under it, the gold keys'
    α-entmax probabilities in the same order (missed mass in red)."""
    order = space.order.numpy()
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))  # key j is drawn at x = its rank
    d = space.distances.numpy()
    data = _key_traces(space, labels, rank, d, base=6.0)
    probs = space.probs.numpy()
    codes = key_codes(space)
    for code in (1, 2):
        idx = np.nonzero((codes == code) & (probs > 0))[0]
        if len(idx):
            data.append(dict(
                type="bar", name="gold p, " + ("kept" if code == 1 else "missed"),
                x=rank[idx].tolist(), y=probs[idx].tolist(), xaxis="x",
                yaxis="y2", marker=dict(color=_rgb(code)), showlegend=False, width=0.9,
                customdata=[["k", int(j)] for j in idx],
                text=[f"key {labels[j]}<br>gold p = {probs[j]:.3f}<br>d = {d[j]:.4g}"
                      for j in idx], hovertemplate="%{text}<extra></extra>"))
    shapes, notes = [], []
    t = space.decision.threshold
    if space.decision.kind == THRESHOLD and t is not None and math.isfinite(t):
        shapes.append(dict(type="line", xref="paper", x0=0, x1=1, yref="y", y0=t, y1=t,
                           line=dict(color=DECISION_COLOR, width=2)))
        notes.append(dict(text=f"t = {t:.4g}", xref="paper", x=1, yref="y", y=t,
                          xanchor="right", yanchor="bottom", showarrow=False,
                          font=dict(color=DECISION_COLOR, size=12)))
    reach = space.reach()
    if reach is not None:
        shapes.append(dict(type="line", xref="paper", x0=0, x1=1, yref="y", y0=reach,
                           y1=reach, line=dict(color=_rgb(2), width=1, dash="dot")))
        notes.append(dict(text=f"farthest gold key {reach:.4g}", xref="paper", x=0, yref="y",
                          y=reach, xanchor="left", yanchor="bottom", showarrow=False,
                          font=dict(color=_rgb(2), size=11)))
    layout = dict(
        height=ROW_HEIGHT, margin=dict(l=10, r=10, t=10, b=10), plot_bgcolor="white",
        hovermode="closest", shapes=shapes, annotations=notes, barmode="overlay",
        legend=dict(orientation="h", y=-0.15, x=0, font=dict(size=11)), uirevision="row",
        xaxis=dict(title=dict(text="keys, nearest first"), anchor="y2", gridcolor="#eee",
                   zeroline=False),
        yaxis=dict(title=dict(text="distance to the query"), domain=[0.36, 1.0],
                   gridcolor="#eee", zeroline=False),
        yaxis2=dict(title=dict(text="gold p"), domain=[0.0, 0.28], gridcolor="#eee",
                    rangemode="tozero"),
        clickmode="event+select")
    return fast_figure(data, layout)


def bands_figure(space: HeadSpace, labels: Sequence[str]) -> go.Figure:
    """Quantization, exact: one strip per projected dimension with every key at its value,
    the interval of the query's bin shaded and the query's own value as a star (queries are
    binned among queries, so it may sit outside that interval). A key is kept when it falls
    in the shaded interval of at least one strip."""
    decision = space.decision
    if decision.kind != QUANTIZATION:
        raise ValueError(f"bands_figure draws quantization decisions, got {decision.kind!r}")
    keys = space.keys.numpy()
    r = keys.shape[1]
    rows = np.arange(len(keys))
    jitter = ((rows * 0.618) % 1.0 - 0.5) * 0.5  # fixed spread inside a strip
    data: list[dict] = []
    for dim in range(r):
        data += _key_traces(space, labels, keys[:, dim], dim + jitter, legend=dim == 0,
                            base=5.0)
    query = space.queries[space.query].numpy()
    data.append(dict(
        type="scatter", mode="markers", name="selected query", x=query.tolist(),
        y=list(range(r)), customdata=[["q", space.query]] * r,
        text=[f"query {labels[space.query]}: bin {int(b)}"
              for b in decision.query_bins.tolist()],
        hovertemplate="%{text}<extra></extra>",
        marker=dict(color=SELECTED_COLOR, size=14, symbol="star")))
    shapes = []
    for dim, (low, high) in enumerate(decision.bands.numpy()):
        if np.isfinite(low):
            shapes.append(dict(type="rect", xref="x", yref="y", x0=low, x1=high,
                               y0=dim - 0.42, y1=dim + 0.42, layer="below",
                               line=dict(color=DECISION_COLOR, width=1),
                               fillcolor="rgba(103, 58, 183, 0.10)"))
    layout = dict(
        height=70 * r + 110, margin=dict(l=10, r=10, t=10, b=10), plot_bgcolor="white",
        hovermode="closest", shapes=shapes, showlegend=False, uirevision="bands",
        xaxis=dict(title=dict(text="projected value"), gridcolor="#eee", zeroline=False),
        yaxis=dict(tickvals=list(range(r)), ticktext=[f"dim {d + 1}" for d in range(r)],
                   range=[r - 0.5, -0.5], zeroline=False),
        clickmode="event+select")
    return fast_figure(data, layout)
