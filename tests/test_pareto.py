"""Sweeps over registered curves, Pareto frontiers and recall at fixed sparsity."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch

from sparsefinder.graphs import AttentionRecord, LayerGraph
from sparsefinder.metrics import recall
from sparsefinder.pareto import (
    CURVES,
    GROUPS,
    pareto_frontier,
    recall_at_sparsity,
    register_curve,
    resolve_methods,
    sweep,
)
from sparsefinder.predictors import TopK
from sparsefinder.projections import HeadProjections
from sparsefinder.spec import METHODS, Method, register_method

HEADS, D, R, LAYERS = 3, 8, 4, 2


def _record(gen: torch.Generator, n: int) -> AttentionRecord:
    layers = []
    for _ in range(LAYERS):
        q = torch.randn(HEADS, n, D, generator=gen)
        k = torch.randn(HEADS, n, D, generator=gen)
        scores = q @ k.transpose(-1, -2)
        gold = scores >= scores.topk(3, dim=-1).values[..., -1:]
        layers.append(LayerGraph(q, k, gold, torch.ones(int(gold.sum())) / 3, D**-0.5))
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=False, layers=layers)


@pytest.fixture(scope="module")
def records() -> list[AttentionRecord]:
    gen = torch.Generator().manual_seed(0)
    return [_record(gen, n) for n in (9, 14, 20)]


@pytest.fixture(scope="module")
def projections(records: list[AttentionRecord]) -> HeadProjections:
    gen = torch.Generator().manual_seed(1)
    centroids = {b: torch.randn(LAYERS, HEADS, b, R, generator=gen) * 3
                 for b in (2, 4, 6, 8, 10, 12, 16, 20)}
    return HeadProjections(
        weight=torch.randn(LAYERS, HEADS, R, D, generator=gen),
        bias=torch.zeros(LAYERS, HEADS, R), model_id="synthetic", alpha=1.5,
        centroids=centroids,
    )


@pytest.fixture(scope="module")
def train_records() -> list[AttentionRecord]:
    gen = torch.Generator().manual_seed(2)
    return [_record(gen, n) for n in (12, 18)]


@pytest.fixture(scope="module")
def points(records, projections, train_records) -> pd.DataFrame:
    return sweep(records, projections, "all", train_records=train_records)


def _df(rows: list[tuple[str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"method": m, "params": json.dumps({"i": i}), "sparsity": s, "recall": r}
         for i, (m, s, r) in enumerate(rows)]
    )


def test_frontier_on_hand_made_points() -> None:
    df = _df([
        ("a", 0.1, 0.9), ("a", 0.5, 0.8), ("a", 0.4, 0.7), ("a", 0.9, 0.2), ("a", 0.5, 0.8),
        ("a", 0.9, 0.1), ("a", 0.5, 0.75), ("b", 0.3, 0.3), ("b", 0.2, 0.3),
    ])
    front = pareto_frontier(df)
    got = {m: list(zip(g["sparsity"], g["recall"], strict=True))
           for m, g in front.groupby("method")}
    assert got == {"a": [(0.1, 0.9), (0.5, 0.8), (0.9, 0.2)], "b": [(0.3, 0.3)]}


def test_recall_at_sparsity_step_and_linear() -> None:
    df = _df([("a", 0.5, 0.9), ("a", 0.8, 0.7), ("a", 0.96, 0.3), ("b", 0.7, 1.0)])
    step = recall_at_sparsity(df, levels=(0.75, 0.9, 0.99)).set_index("method")
    assert step.loc["a", "recall@0.75"] == 0.7
    assert step.loc["a", "recall@0.9"] == 0.3
    assert math.isnan(step.loc["a", "recall@0.99"]) and math.isnan(step.loc["b", "recall@0.75"])
    linear = recall_at_sparsity(df, levels=(0.4, 0.75, 0.9), how="linear").set_index("method")
    assert linear.loc["a", "recall@0.4"] == 0.9  # below the frontier: step rule
    assert linear.loc["a", "recall@0.75"] == pytest.approx(0.9 - 0.2 * 25 / 30)
    assert linear.loc["a", "recall@0.9"] == pytest.approx(0.7 - 0.4 * 10 / 16)
    with pytest.raises(ValueError, match="how"):
        recall_at_sparsity(df, how="cubic")


def test_sweep_one_row_per_config(points: pd.DataFrame, records) -> None:
    # kmeans-routed* read the bundled key codebooks of the default model: skipped for the
    # synthetic model here (tests/test_key_codebooks.py sweeps them)
    runnable = {n: c for n, c in CURVES.items() if not n.startswith("kmeans-routed")}
    expected = sum(len(curve.specs) for curve in runnable.values())
    assert len(points) == expected
    assert points.groupby("method").size().to_dict() == {
        name: len(curve.specs) for name, curve in runnable.items()
    }
    assert (points["n_texts"] == len(records)).all()
    assert points["recall"].between(0, 1).all() and points["sparsity"].between(0, 1).all()
    assert len(json.loads(points["recall_per_layer"].iloc[0])) == LAYERS
    assert 0 < points.attrs["gold_sparsity"] < 1
    assert len(points.attrs["gold_sparsity_per_layer"]) == LAYERS


def test_larger_threshold_never_lowers_recall(points: pd.DataFrame) -> None:
    for method in ("distance", "distance+window"):
        rows = points[points["method"] == method].copy()
        rows["t"] = [json.loads(p)["threshold"] for p in rows["params"]]
        rows = rows.sort_values("t")
        assert rows["recall"].is_monotonic_increasing
        assert rows["sparsity"].is_monotonic_decreasing


def test_window_union_adds_edges(points: pd.DataFrame) -> None:
    plain = points[points["method"] == "kmeans"].set_index("params")
    union = points[points["method"] == "kmeans+window"].set_index("params")
    assert (union["recall"] >= plain["recall"] - 1e-12).all()
    assert (union["sparsity"] <= plain["sparsity"] + 1e-12).all()
    window = points[points["method"] == "window"]
    zero = window[window["params"] == json.dumps({"window": 0})].iloc[0]
    assert zero["sparsity"] == 1.0 and zero["recall"] == 0.0


def test_register_baseline_and_resolve(records) -> None:
    class Full:
        def predict(self, q, k, *, causal=False):
            return torch.ones(q.shape[0], q.shape[1], k.shape[1], dtype=torch.bool)

    register_method(Method("full-test", "Full", (), lambda p, c: Full(), inputs="shape"))
    register_curve("full-test", "full-test", [{}])
    try:
        df = sweep(records, None, "full-test,window")
        full = df[df["method"] == "full-test"].iloc[0]
        assert full["recall"] == 1.0 and full["sparsity"] == 0.0
        assert "full-test" in resolve_methods("all")
        with pytest.raises(ValueError, match="need learned projections"):
            sweep(records, None, "distance")
        with pytest.raises(ValueError, match="already registered"):
            register_curve("full-test", "full-test", [{}])
        with pytest.raises(ValueError, match="already registered"):
            register_method(Method("full-test", "Full", (), lambda p, c: Full()))
    finally:
        CURVES.pop("full-test")
        METHODS.pop("full-test")
    assert "distance" in resolve_methods("sparsefinder")
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        resolve_methods("distance,nope")


def test_missing_centroids_are_skipped_with_a_warning(records, projections) -> None:
    partial = HeadProjections(
        weight=projections.weight, bias=projections.bias, model_id="synthetic", alpha=1.5,
        centroids={2: projections.centroids[2]},
    )
    with pytest.warns(UserWarning, match="no k-means centroids for B=4"):
        df = sweep(records, partial, "kmeans")
    assert df["params"].tolist() == [json.dumps({"n_clusters": 2, "top_k": 1})]


# ==================================================================== baselines


def _scores(df: pd.DataFrame, method: str) -> pd.DataFrame:
    return df[df["method"] == method].set_index("params")[["recall", "sparsity"]]


def test_topk_gets_original_vectors_in_a_mixed_sweep(records, projections) -> None:
    alone = sweep(records, None, "topk")
    mixed = sweep(records, projections, "topk,distance")
    pd.testing.assert_frame_equal(_scores(alone, "topk"), _scores(mixed, "topk"))
    assert set(mixed["method"]) == {"topk", "distance"}
    # Gold is the top-3 of the original scores, so top-4 of the original vectors covers it;
    # on the projections (r=4 instead of d=8) it would not.
    top4 = _scores(mixed, "topk").loc[json.dumps({"k": 4})]
    assert top4["recall"] == 1.0
    q, k = projections.project_record(records[0])[0]
    assert recall(TopK(4).predict(q, k), records[0].layers[0].gold).mean() < 1


def test_topk_with_k_n_has_recall_one(records, projections) -> None:
    n_max = max(r.n_tokens for r in records)
    register_curve("topk-n-test", "topk", [{"k": n_max}])
    try:
        df = sweep(records, projections, "topk-n-test,kmeans")
    finally:
        CURVES.pop("topk-n-test")
    row = df[df["method"] == "topk-n-test"].iloc[0]
    assert row["recall"] == 1.0 and row["sparsity"] == 0.0
    assert METHODS["topk"].inputs == "original" and not METHODS["topk"].needs_projections


def test_static_masks_need_train_records(records, projections, train_records) -> None:
    methods = "sparsebert-dams,sparsebert-damu,window"
    with pytest.warns(UserWarning, match="skipping sparsebert-dams, sparsebert-damu"):
        df = sweep(records, None, methods)
    assert set(df["method"]) == {"window"}
    with pytest.raises(ValueError, match="train_records"), pytest.warns(UserWarning):
        sweep(records, None, "sparsebert-dams")
    df = sweep(records, None, methods, train_records=train_records)
    for name in ("sparsebert-dams", "sparsebert-damu"):
        rows = df[df["method"] == name]
        targets = [json.loads(p)["target_sparsity"] for p in rows["params"]]
        assert targets == [0.5, 0.7, 0.8, 0.9, 0.95, 0.98]
        assert rows["recall"].between(0, 1).all()
        # Re-targeted copies of one fitted mask: sparser target → sparser prediction.
        assert rows["sparsity"].is_monotonic_increasing
        assert rows["recall"].is_monotonic_decreasing


def test_resolve_all_includes_every_baseline() -> None:
    everything = resolve_methods("all")
    for name in GROUPS["baselines"] + GROUPS["sparsefinder"]:
        assert name in everything
    assert set(GROUPS["baselines"]) >= {
        "longformer", "bigbird", "reformer", "reformer+window", "routing", "routing+window",
        "topk", "sparsebert-dams", "sparsebert-damu", "distance-nodiag",
    }
    assert resolve_methods("baselines") == GROUPS["baselines"]


def test_baselines_in_the_sweep(points: pd.DataFrame) -> None:
    grids = points.groupby("method")["params"].apply(
        lambda ps: [json.loads(p) for p in ps]
    ).to_dict()
    assert [p["n_global"] for p in grids["longformer"]] == [4, 8, 12, 16, 20]
    assert [p["n_random"] for p in grids["bigbird"]] == [2, 4, 6, 8, 10]
    assert [p["n_buckets"] for p in grids["reformer+window"]] == [2, 4, 6, 8, 10, 12]
    assert [p["n_clusters"] for p in grids["routing"]] == [2, 4, 6, 8, 10]
    assert [p["k"] for p in grids["topk"]] == [1, 2, 4, 8, 16, 32]
    plain = _scores(points, "distance")
    nodiag = _scores(points, "distance-nodiag")
    assert (nodiag["recall"] <= plain["recall"] + 1e-12).all()
    assert (nodiag["sparsity"] >= plain["sparsity"] - 1e-12).all()
