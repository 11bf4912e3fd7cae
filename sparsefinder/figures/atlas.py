"""Figures of the head atlas: the layer × head grid, the similarity heatmap, the head map and
one head's distributions. Heads are named ``L{layer}H{head}`` everywhere."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from sparsefinder.analysis.atlas import HeadAtlas
from sparsefinder.analysis.atlas_stats import SPARSITY_BINS
from sparsefinder.analysis.atlas_types import PATTERN_LABELS, PATTERN_TYPES
from sparsefinder.figures.common import fast_figure

#: One colour per pattern type (the map's legend).
TYPE_COLOURS = dict(zip(PATTERN_TYPES, ("#9e9e9e", "#d62728", "#1f77b4", "#2ca02c", "#17becf",
                                        "#ff7f0e", "#9467bd", "#8c564b"), strict=True))
_SHORT = {"dense": "D", "sink": "S", "diagonal": "=", "previous": "←", "next": "→",
          "local": "L", "broad": "B", "mixed": "·"}


def symbol_key() -> str:
    """What each symbol of :func:`grid_figure` stands for, e.g. ``"S first-token/sink"``."""
    return " · ".join(f"**{_SHORT[kind]}** {PATTERN_LABELS[kind]}" for kind in PATTERN_TYPES)


def head_names(atlas: HeadAtlas) -> list[str]:
    return [f"L{layer}H{head}" for layer, head in zip(atlas.heads["layer"], atlas.heads["head"],
                                                      strict=True)]


def grid_figure(atlas: HeadAtlas, column: str, label: str, selected: tuple[int, int],
                keep: np.ndarray | None = None) -> go.Figure:
    """Clickable layer × head grid coloured by ``column`` (scatter squares: a click reaches
    the app); each cell shows its type's symbol; heads a filter drops are faded."""
    values = atlas.heads[column].to_numpy(dtype=float)
    layers, heads = atlas.heads["layer"].to_numpy(), atlas.heads["head"].to_numpy()
    keep = np.ones(len(values), dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
    size = 30
    symbols = [_SHORT[t] for t in atlas.heads["type"]]
    finite = values[np.isfinite(values)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    data = [
        dict(type="scatter", x=heads.tolist(), y=layers.tolist(), mode="markers+text",
             text=symbols,
             textfont=dict(color="white", size=12),
             marker=dict(symbol="square", size=size, color=np.nan_to_num(values, nan=low),
                         colorscale="Viridis", cmin=low, cmax=high if high > low else low + 1,
                         opacity=np.where(keep, 1.0, 0.18),
                         colorbar=dict(title=dict(text=label), thickness=10)),
             customdata=np.column_stack([values, atlas.heads["type_label"]]),
             hovertemplate=f"L%{{y}}H%{{x}} · %{{customdata[1]}}<br>{label} "
                           "%{customdata[0]:.3f}<extra></extra>"),
        dict(type="scatter", x=[selected[1]], y=[selected[0]], mode="markers", hoverinfo="skip",
             marker=dict(symbol="square-open", size=size + 6, color="crimson",
                         line=dict(width=3))),
    ]
    layout = dict(height=60 + atlas.num_layers * (size + 12),
                  margin=dict(l=10, r=10, t=10, b=10), showlegend=False, plot_bgcolor="white",
                  xaxis=dict(title=dict(text="head"), tickmode="linear", dtick=1,
                             range=[-0.6, atlas.num_heads - 0.4]),
                  yaxis=dict(title=dict(text="layer"), tickmode="linear", dtick=1,
                             range=[atlas.num_layers - 0.4, -0.6]))
    return fast_figure(data, layout)


def similarity_figure(atlas: HeadAtlas) -> go.Figure:
    """Mean JSD between heads, rows and columns in cluster order (similar heads adjacent)."""
    names = np.array(head_names(atlas))
    order = np.asarray(atlas.order)
    matrix = atlas.similarity[np.ix_(order, order)]
    data = [dict(type="heatmap", z=matrix, x=names[order], y=names[order], colorscale="Blues",
                 zmin=0.0, zmax=float(matrix.max()) or 1.0,
                 colorbar=dict(title=dict(text="JSD (bits)"), thickness=10),
                 hovertemplate="%{y} vs %{x}<br>mean JSD %{z:.3f} bits<extra></extra>")]
    side = min(720, 140 + 9 * len(order))
    layout = dict(height=side, margin=dict(l=10, r=10, t=10, b=10),
                  xaxis=dict(tickfont=dict(size=8), type="category"),
                  yaxis=dict(tickfont=dict(size=8), type="category", autorange="reversed"))
    return fast_figure(data, layout)


def map_figure(atlas: HeadAtlas, selected: tuple[int, int]) -> go.Figure:
    """The heads on a 2-D MDS map of their JSD distances, coloured by pattern type."""
    names = np.array(head_names(atlas))
    data = []
    for kind in PATTERN_TYPES:
        which = (atlas.heads["type"] == kind).to_numpy()
        if not which.any():
            continue
        data.append(dict(type="scatter", x=atlas.coords[which, 0], y=atlas.coords[which, 1],
                         mode="markers", name=kind, text=names[which],
                         customdata=atlas.heads.loc[which, ["layer", "head"]].to_numpy(),
                         marker=dict(size=10, color=TYPE_COLOURS[kind]),
                         hovertemplate="%{text} · " + kind + "<extra></extra>"))
    index = selected[0] * atlas.num_heads + selected[1]
    # only the selected head is labelled (every label at once piled up): the others on hover
    data.append(dict(type="scatter", x=[atlas.coords[index, 0]], y=[atlas.coords[index, 1]],
                     mode="markers+text", text=[names[index]], textposition="top center",
                     textfont=dict(size=12, color="crimson"), hoverinfo="skip",
                     showlegend=False,
                     marker=dict(symbol="circle-open", size=18, color="crimson",
                                 line=dict(width=3))))
    layout = dict(height=460, margin=dict(l=10, r=10, t=10, b=10), plot_bgcolor="white",
                  legend=dict(orientation="h", y=-0.05),
                  xaxis=dict(showticklabels=False, title=dict(text="MDS 1"), zeroline=False),
                  yaxis=dict(showticklabels=False, title=dict(text="MDS 2"), zeroline=False))
    return fast_figure(data, layout)


def distributions_figure(atlas: HeadAtlas, layer: int, head: int) -> go.Figure:
    """One head: the histogram of its per-text gold sparsity and of its keys kept per row."""
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=1, cols=2, subplot_titles=(
        "gold sparsity per text", "keys kept per row"), horizontal_spacing=0.12)
    sparsity = atlas.sparsity_hist[layer, head]
    used = np.nonzero(sparsity)[0]
    lo, hi = (int(used[0]), int(used[-1]) + 1) if used.size else (0, SPARSITY_BINS)
    centres = (np.arange(lo, hi) + 0.5) / SPARSITY_BINS
    figure.add_bar(x=centres, y=sparsity[lo:hi], row=1, col=1, marker_color="#1f77b4",
                   hovertemplate="sparsity %{x:.3f}: %{y} texts<extra></extra>")
    support = atlas.support_hist[layer, head]
    used = np.nonzero(support)[0]
    top = int(used[-1]) + 1 if used.size else 1
    figure.add_bar(x=np.arange(top), y=support[:top], row=1, col=2, marker_color="#ff7f0e",
                   hovertemplate="%{x} keys: %{y} rows<extra></extra>")
    figure.update_layout(height=260, showlegend=False, margin=dict(l=10, r=10, t=30, b=10),
                         bargap=0.05)
    figure.update_yaxes(title_text="texts", row=1, col=1)
    figure.update_yaxes(title_text="rows", row=1, col=2)
    return figure
