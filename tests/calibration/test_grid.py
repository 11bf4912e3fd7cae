"""Per-head raw settings for a target sparsity, chosen on train graphs (issue 10)."""

from __future__ import annotations

import math

import pytest
import torch

from sparsefinder.attention.masks import causal_mask
from sparsefinder.calibration.grid import (
    head_grid,
    head_grid_families,
    layer_predictor,
    measure_grid,
)
from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.evaluation.curves import CURVES
from sparsefinder.evaluation.sweep import sweep
from sparsefinder.methods.registry import METHODS
from sparsefinder.metrics.measures import recall, sparsity
from sparsefinder.predictors import Window

HEADS, LAYERS, D = 4, 2, 6


def _record(gen: torch.Generator, n: int, causal: bool = False) -> AttentionRecord:
    """Gold: head h attends to keys within h·2 positions plus each query's best key."""
    layers = []
    for _ in range(LAYERS):
        q, k = torch.randn(HEADS, n, D, generator=gen), torch.randn(HEADS, n, D, generator=gen)
        scores = q @ k.transpose(-1, -2)
        if causal:
            scores = scores.masked_fill(~causal_mask(n, n), -math.inf)
        gold = scores >= scores.amax(-1, keepdim=True)
        for h in range(HEADS):
            gold[h] |= Window(2 * h).predict(q[:1], k[:1], causal=causal)[0]
        layers.append(LayerGraph(q, k, gold, torch.ones(int(gold.sum())), 1.0))
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=causal, layers=layers)


@pytest.fixture(scope="module")
def train() -> list[AttentionRecord]:
    gen = torch.Generator().manual_seed(0)
    return [_record(gen, n) for n in (12, 20, 31)]


def test_measured_table_is_the_per_head_macro_average(train):
    grid = [{"window": w} for w in (0, 1, 3, 7)]
    table = measure_grid(train, None, "window", grid)
    assert table.recall.shape == (LAYERS, HEADS, 4) and table.n_texts == 3
    for g, params in enumerate(grid):
        for layer in range(LAYERS):
            rec, spars = [], []
            for record in train:
                gold = record.layers[layer].gold
                pred = Window(params["window"]).predict(gold[..., :1], gold[..., :1].float())
                rec.append(recall(pred, gold))
                spars.append(sparsity(pred))
            assert torch.allclose(table.recall[layer, :, g], torch.stack(rec).mean(0))
            assert torch.allclose(table.density[layer, :, g], 1 - torch.stack(spars).mean(0))


def test_choice_meets_the_target_on_train_and_widens_for_dense_heads(train):
    table = measure_grid(train, None, "window", head_grid("window"))
    previous = 2.0
    for target in (0.5, 0.7, 0.8, 0.9):
        choice = table.choose(target)
        rec, spars = table.train_scores(choice)
        assert spars >= target - 1e-9  # the budget is never overspent
        assert spars <= target + 0.1  # and mostly spent (coarse grid, 8 heads)
        assert rec <= previous + 1e-12  # a sparser target never gains recall
        previous = rec
    # the head whose gold is a wide band (h = 3: Window(6)) gets a wider window than the
    # narrow-band head (h = 1: Window(2))
    choice = table.choose(0.7)
    windows = [[table.grid[i]["window"] for i in row] for row in choice.tolist()]
    assert all(row[3] > row[1] for row in windows)
    with pytest.raises(ValueError, match="target_sparsity"):
        table.choose(1.0)


def test_layer_predictor_predicts_each_head_with_its_setting(train):
    choice = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1]])
    gold = train[0].layers[0].gold
    q = k = torch.zeros(HEADS, gold.shape[1], 2)
    pred = layer_predictor("window", [{"window": 0}, {"window": 4}], choice[0], None,
                           0).predict(q, k)
    for head, index in enumerate(choice[0].tolist()):
        assert torch.equal(pred[head], Window(4 * index).predict(q, k)[head])


def test_per_head_methods_are_registered_and_swept_on_train_records(train):
    gen = torch.Generator().manual_seed(9)
    held_out = [_record(gen, n) for n in (15, 25)]
    # the families whose catalog entry declares a per-head grid, each calibrated from it
    assert head_grid_families() == ["quantization", "kmeans", "window", "kmeans-routed"]
    for name in head_grid_families():
        assert METHODS[name].variant("budget").fit is not None and f"{name}:budget" in CURVES
    with pytest.raises(ValueError, match="'distance' declares no per-head grid"):
        head_grid("distance")
    assert METHODS["window"].inputs == "shape"
    assert METHODS["kmeans-routed"].inputs == "original"
    points = sweep(held_out, None, "window:budget", train_records=train)
    assert len(points) == len(CURVES["window:budget"].specs)
    assert set(points["family"]) == {"window"} and set(points["calibration"]) == {"budget"}
    targets = [float(p.split(": ")[1].rstrip("}")) for p in points["params"]]
    # more sparsity asked, more sparsity got (held-out texts; no exact landing on 2 texts)
    assert points["sparsity"].is_monotonic_increasing or sorted(targets) == targets
    assert points["sparsity"].iloc[-1] > points["sparsity"].iloc[0]
    with pytest.warns(UserWarning, match="skipping window:budget"):
        sweep(held_out, None, "window:budget,window")
    with pytest.warns(FutureWarning, match="'window-budget' is deprecated; use 'window:budget'"):
        old = sweep(held_out, None, "window-budget", train_records=train)
    assert old.equals(points)  # the old name is an alias: the same curve, the same numbers


def test_points_the_projections_cannot_build_are_skipped_with_a_reason(train):
    """A user's projections with k-means centroids for some B only: the per-head choices equal
    those made on the buildable grid alone, and every other point says why it is missing."""
    from sparsefinder.projections.centroids import fit_centroids
    from sparsefinder.projections.hinge import train_projections

    projections = train_projections(train, rank=2, seed=0, model_id="synthetic")
    projections = fit_centroids(projections, train, [2, 4], n_init=1, seed=0)
    full = head_grid("kmeans")
    table = measure_grid(train, projections, "kmeans", full)
    buildable = [p for p in full if p["n_clusters"] in (2, 4)]
    alone = measure_grid(train, projections, "kmeans", buildable)
    assert table.grid == buildable and not alone.skipped
    assert len(table.skipped) == len(full) - len(buildable)
    assert all("no k-means centroids for B=" in reason for reason in table.skipped)
    for target in (0.3, 0.5, 0.7):
        assert torch.equal(table.choose(target), alone.choose(target))
    torch.testing.assert_close(table.recall, alone.recall, rtol=0, atol=0)
