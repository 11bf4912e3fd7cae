"""Recall at a sparsity level must not depend on how finely a method's grid samples its curve.

The read-out rule (``recall_at_sparsity``, ``how="step"``): the best recall among frontier
points with sparsity ≥ the level. Its error against the true curve is at most the recall lost
between the level and the next sampled point, i.e. slope × grid spacing in sparsity: a dense
grid (or calibrated points that sit AT the level) makes it grid-independent.
"""

from __future__ import annotations

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
