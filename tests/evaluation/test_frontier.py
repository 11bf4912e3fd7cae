"""Recall at a sparsity level must not depend on how finely a method's grid samples its curve.

The read-out rule (``recall_at_sparsity``, ``how="step"``): the best recall among frontier
points with sparsity ≥ the level. Its error against the true curve is at most the recall lost
between the level and the next sampled point, i.e. slope × grid spacing in sparsity: a dense
grid (or calibrated points that sit AT the level) makes it grid-independent.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.evaluation.curves import CURVES, register_curve
from sparsefinder.evaluation.frontier import recall_at_sparsity
from sparsefinder.evaluation.sweep import sweep
from sparsefinder.projections.heads import HeadProjections

LEVELS = (0.75, 0.9, 0.95)


def _curve(sparsity: np.ndarray) -> np.ndarray:
    """A smooth, decreasing sparsity→recall curve (max slope ≈ 4.5 on [0, 1))."""
    return 1.0 - sparsity**6


def _points(spacing: float, offset: float = 0.0) -> pd.DataFrame:
    s = np.arange(offset, 1.0, spacing)
    return pd.DataFrame({"method": "m", "params": "{}", "sparsity": s, "recall": _curve(s)})


@pytest.mark.parametrize("offset", [0.0, 0.0013, 0.0031])
def test_step_readout_converges_with_grid_spacing(offset: float) -> None:
    fine = recall_at_sparsity(_points(0.001, offset), LEVELS).iloc[0]
    dense = recall_at_sparsity(_points(0.004, offset / 2), LEVELS).iloc[0]
    for level in LEVELS:
        truth = float(_curve(np.array(level)))
        key = f"recall@{level:g}"
        assert 0 <= truth - fine[key] <= 6 * 0.001  # never optimistic, error ≤ slope·spacing
        assert abs(fine[key] - dense[key]) <= 6 * 0.004
    # a coarse grid (the paper's 0.25 steps in t are ~0.05 in sparsity) reads out visibly less
    coarse = recall_at_sparsity(_points(0.05, 0.04), LEVELS).iloc[0]
    assert fine["recall@0.9"] - coarse["recall@0.9"] > 0.05
    linear = recall_at_sparsity(_points(0.05, 0.04), LEVELS, how="linear").iloc[0]
    assert abs(linear["recall@0.9"] - fine["recall@0.9"]) < 0.02


HEADS, D, LAYERS = 2, 4, 1


def _record(gen: torch.Generator, n: int) -> AttentionRecord:
    q = torch.randn(HEADS, n, D, generator=gen)
    k = q + 0.8 * torch.randn(HEADS, n, D, generator=gen)
    noisy = -torch.cdist(q, k) + 0.5 * torch.randn(HEADS, n, n, generator=gen)
    gold = noisy >= noisy.topk(4, dim=-1).values[..., -1:]
    layers = [LayerGraph(q, k, gold, torch.ones(int(gold.sum())), D**-0.5)]
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=False, layers=layers)


def test_calibrated_readout_does_not_depend_on_the_target_grid() -> None:
    """Calibrated points land at their target (± a little), so with the linear read-out a
    grid containing the level reads out the same recall whatever the spacing of its other
    targets. (The step rule would drop a point landing at 0.899 for level 0.9 and fall back
    to the next sparser one: with calibrated methods read linearly or use a dense grid.)"""
    gen = torch.Generator().manual_seed(0)
    train = [_record(gen, n) for n in range(20, 60, 2)]
    held_out = [_record(gen, n) for n in range(21, 61, 4)]
    eye = torch.eye(D).expand(LAYERS, HEADS, D, D).clone()
    projections = HeadProjections(weight=eye, bias=torch.zeros(LAYERS, HEADS, D),
                                  model_id="synthetic", alpha=1.5)
    grids = {
        "_test-cal-coarse": [0.5, 0.75, 0.9, 0.95],
        "_test-cal-fine": [round(0.5 + 0.005 * i, 3) for i in range(91)],
    }
    try:  # two grids over the registered "distance:equal" method
        for name, targets in grids.items():
            register_curve(name, "distance:equal",
                           [{"target_sparsity": t} for t in targets])
        points = sweep(held_out, projections, list(grids), train_records=train)
    finally:
        for name in grids:
            CURVES.pop(name, None)
    at = recall_at_sparsity(points, LEVELS, how="linear").set_index("method")
    for level in LEVELS:
        key = f"recall@{level:g}"
        coarse, fine = at.loc["_test-cal-coarse", key], at.loc["_test-cal-fine", key]
        assert not np.isnan(coarse) and abs(coarse - fine) < 0.02, (level, coarse, fine)
    achieved = points.groupby("method")["sparsity"].apply(list)
    targets = grids["_test-cal-coarse"]
    assert np.allclose(achieved["_test-cal-coarse"], targets, atol=0.02)


# ---- hand-made read-outs: order, boundaries, columns -------------------------------------

def _hand(rows: list[tuple[str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"method": m, "params": f"p{i}", "sparsity": s, "recall": r}
                         for i, (m, s, r) in enumerate(rows)])


def test_methods_keep_their_first_seen_order_and_columns() -> None:
    """Read-outs list methods in the order the sweep produced them (curated order), not
    alphabetically, and the frontier keeps the input's columns and a fresh index."""
    from sparsefinder.evaluation.frontier import metrics_at_sparsity, pareto_frontier

    df = _hand([("zeta", 0.8, 0.9), ("alpha", 0.9, 0.5), ("zeta", 0.95, 0.4)])
    front = pareto_frontier(df)
    assert front["method"].tolist() == ["zeta", "zeta", "alpha"]
    assert list(front.columns) == list(df.columns)
    assert front.index.tolist() == [0, 1, 2]
    assert recall_at_sparsity(df)["method"].tolist() == ["zeta", "alpha"]
    assert metrics_at_sparsity(df, (0.75,))["method"].tolist() == ["zeta", "alpha"]


def test_identical_points_keep_the_first_one_even_among_many() -> None:
    from sparsefinder.evaluation.frontier import pareto_frontier

    rows = [("m", 0.5, 0.5)] * 40 + [("m", 0.7, 0.3)] * 40
    front = pareto_frontier(_hand(rows))
    assert front["params"].tolist() == ["p0", "p40"]


def test_metrics_at_sparsity_levels_in_any_order_and_exact_hits() -> None:
    from sparsefinder.evaluation.frontier import metrics_at_sparsity

    df = _hand([("m", 0.75, 0.8), ("m", 0.9, 0.6)])
    out = metrics_at_sparsity(df, (0.95, 0.9, 0.75))  # 0.95 unreachable: the others still read
    assert out[["level", "params", "recall", "sparsity"]].values.tolist() == [
        [0.9, "p1", 0.6, 0.9], [0.75, "p0", 0.8, 0.75]]  # a point AT the level counts
    empty = metrics_at_sparsity(df, (0.99,))
    assert empty.empty and list(empty.columns) == ["method", "level", "params", "recall",
                                                   "sparsity"]


def test_matched_sparsity_at_the_ends_of_the_other_curve_and_its_columns() -> None:
    from sparsefinder.evaluation.frontier import matched_sparsity

    ref = [("a", s, r) for s, r in ((0.2, 0.9), (0.5, 0.8), (0.7, 0.6), (0.9, 0.1))]
    other = [("b", s, r) for s, r in ((0.2, 1.0), (0.4, 0.6), (0.7, 0.3))]
    df = _hand(ref + other)
    df["exact_fraction"] = [0.5, 0.4, 0.3, 0.0, 0.9, 0.5, None]  # a missing value reads NaN
    got = matched_sparsity(df, "a", "b", metrics=("recall", "exact_fraction"))
    assert got["params"].tolist() == ["p3", "p2", "p1", "p0"]
    assert got["recall"].tolist() == [0.1, 0.6, 0.8, 0.9]  # the reference's own values
    assert got["exact_fraction"].tolist() == [0.0, 0.3, 0.4, 0.5]
    assert math.isnan(got["recall_other"][0])  # 0.9: beyond b's sparsest point
    assert got["recall_other"][1] == pytest.approx(0.3)  # exactly b's last point
    assert got["recall_other"][2] == pytest.approx(0.5)  # between b's 2nd and 3rd points
    assert got["recall_other"][3] == pytest.approx(1.0)  # exactly b's first point
    assert math.isnan(got["exact_fraction_other"][1])
    with pytest.raises(ValueError, match="no points of c, d in these results"):
        matched_sparsity(df, "c", "d")


def test_matched_sparsity_keeps_the_order_of_tied_reference_points() -> None:
    from sparsefinder.evaluation.frontier import matched_sparsity

    gen = np.random.default_rng(0)
    levels = gen.choice([0.3, 0.6, 0.9], size=60)
    df = _hand([("a", float(s), 0.5) for s in levels] + [("b", 0.1, 1.0), ("b", 0.95, 0.0)])
    got = matched_sparsity(df, "a", "b", metrics=("recall",))
    want = [f"p{i}" for s in (0.9, 0.6, 0.3) for i in range(60) if levels[i] == s]
    assert got["params"].tolist() == want
