"""Pareto frontiers of sweep points and their read-outs at fixed sparsity levels.

:func:`recall_at_sparsity` reads a method's frontier at fixed sparsity levels; see its
docstring for the interpolation rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from sparsefinder.metrics.measures import EXTRA_METRICS

SPARSITY_LEVELS = (0.75, 0.9, 0.95)


def _frontier_one(group: pd.DataFrame) -> pd.DataFrame:
    ordered = group.sort_values(["sparsity", "recall"], ascending=[False, False], kind="stable")
    keep, best = [], -math.inf
    for index, value in ordered["recall"].items():
        if value > best:  # nothing sparser (seen so far) reaches this recall
            keep.append(index)
            best = value
    return group.loc[keep].sort_values("sparsity", kind="stable")


def pareto_frontier(df: pd.DataFrame) -> pd.DataFrame:
    """Per method, the points no other point of that method dominates, by sparsity.

    A point is dominated when another has recall ≥ and sparsity ≥ with one of them strictly
    greater; of identical points one is kept.
    """
    if df.empty:
        return df.copy()
    parts = [_frontier_one(g) for _, g in df.groupby("method", sort=False)]
    return pd.concat(parts).reset_index(drop=True)


def recall_at_sparsity(
    df: pd.DataFrame, levels: Sequence[float] = SPARSITY_LEVELS, how: str = "step"
) -> pd.DataFrame:
    """Recall of each method's frontier at fixed sparsity levels → one row per method.

    ``how="step"`` (default): the best recall among frontier points with sparsity ≥ level —
    a recall some actual configuration reaches at that sparsity or better (conservative).
    ``how="linear"``: linear interpolation between the two frontier points around the level
    (the curve as drawn); for a level below every frontier point the step rule applies.
    Either way a level sparser than every point of a method gives NaN. ``df`` may be a
    frontier already (:func:`pareto_frontier` of a frontier is that frontier).
    """
    if how not in ("step", "linear"):
        raise ValueError(f"how must be 'step' or 'linear', got {how!r}")
    frontier = pareto_frontier(df)
    rows = []
    for method, group in frontier.groupby("method", sort=False):
        s = group["sparsity"].to_numpy()
        r = group["recall"].to_numpy()  # frontier: s ascending, r descending
        row: dict[str, Any] = {"method": method}
        for level in levels:
            above = s >= level
            value = float(r[above].max()) if above.any() else math.nan
            if how == "linear" and above.any() and (~above).any():
                i = int(above.argmax())  # first point at or above the level
                s0, s1, r0, r1 = s[i - 1], s[i], r[i - 1], r[i]
                value = float(r0 + (r1 - r0) * (level - s0) / (s1 - s0))
            row[f"recall@{level:g}"] = value
        rows.append(row)
    return pd.DataFrame(rows)


def metrics_at_sparsity(df: pd.DataFrame, levels: Sequence[float] = SPARSITY_LEVELS
                        ) -> pd.DataFrame:
    """Every metric of the configuration that gives each method's recall at each level.

    The configuration is the one the step rule of :func:`recall_at_sparsity` reads: the
    frontier point with the best recall among those with sparsity ≥ level. One row per
    (method, level) that some configuration reaches: ``method``, ``level``, ``params``,
    ``recall``, ``sparsity`` and the :data:`~sparsefinder.metrics.measures.EXTRA_METRICS` present in
    ``df`` (how good the graph at that point is besides its recall).
    """
    extras = [name for name in EXTRA_METRICS if name in df.columns]
    rows = []
    for method, group in pareto_frontier(df).groupby("method", sort=False):
        for level in levels:
            above = group[group["sparsity"] >= level]
            if above.empty:
                continue
            best = above.loc[above["recall"].idxmax()]
            rows.append({"method": method, "level": level, "params": best["params"],
                         "recall": best["recall"], "sparsity": best["sparsity"],
                         **{name: best[name] for name in extras}})
    return pd.DataFrame(rows, columns=["method", "level", "params", "recall", "sparsity",
                                       *extras])


def matched_sparsity(df: pd.DataFrame, reference: str, other: str,
                     metrics: Sequence[str] = ("recall", "block_recall", "exact_fraction")
                     ) -> pd.DataFrame:
    """Curve ``other`` read at the sparsity of every point of curve ``reference``.

    One row per ``reference`` point (by sparsity, descending): its ``params``, ``sparsity``,
    each metric, and ``<metric>_other``: ``other``'s metric linearly interpolated between its
    two points around that sparsity (the curve as drawn; NaN outside its sparsity range).
    For a fair comparison of two predictors whose grids do not land on the same sparsities
    (e.g. learned vs pooled block projections at one number of key blocks).
    """
    import numpy as np

    ref = df[df["method"] == reference].sort_values("sparsity", ascending=False, kind="stable")
    oth = df[df["method"] == other].sort_values("sparsity", kind="stable")
    if ref.empty or oth.empty:
        missing = [name for name, part in ((reference, ref), (other, oth)) if part.empty]
        raise ValueError(f"no points of {', '.join(missing)} in these results")
    xs = oth["sparsity"].to_numpy(dtype=float)
    rows = []
    for _, row in ref.iterrows():
        inside = xs[0] <= row["sparsity"] <= xs[-1]
        out: dict[str, Any] = {"params": row["params"], "sparsity": row["sparsity"]}
        for name in metrics:
            out[name] = row[name]
            out[f"{name}_other"] = (float(np.interp(row["sparsity"], xs,
                                                    oth[name].to_numpy(dtype=float)))
                                    if inside else math.nan)
        rows.append(out)
    return pd.DataFrame(rows)
