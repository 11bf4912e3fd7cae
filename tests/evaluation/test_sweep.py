"""Sweeps over registered curves, Pareto frontiers and recall at fixed sparsity."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from tolerances import ratio_tol

from sparsefinder.attention.masks import causal_mask
from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.evaluation.curves import (
    CURVES,
    GROUPS,
    available_curves,
    curve_display_name,
    curve_spec,
    register_curve,
    resolve_methods,
    with_labels,
)
from sparsefinder.evaluation.frontier import pareto_frontier, recall_at_sparsity
from sparsefinder.evaluation.sweep import score_spec, sweep
from sparsefinder.methods.registry import METHODS, Method, register_method, unregister_method
from sparsefinder.methods.spec import RecordInputs, predict_record
from sparsefinder.metrics.measures import recall, sparsity
from sparsefinder.predictors import TopK
from sparsefinder.projections.heads import HeadProjections

HEADS, D, R, LAYERS = 3, 8, 4, 2


def _record(gen: torch.Generator, n: int, causal: bool = False) -> AttentionRecord:
    """Gold = each query's top-3 keys (of its non-future keys for a decoder)."""
    layers = []
    for _ in range(LAYERS):
        q = torch.randn(HEADS, n, D, generator=gen)
        k = torch.randn(HEADS, n, D, generator=gen)
        scores = q @ k.transpose(-1, -2)
        if causal:
            scores = scores.masked_fill(~causal_mask(n, n), -math.inf)
        gold = scores >= scores.topk(3, dim=-1).values[..., -1:]
        gold &= scores > -math.inf
        layers.append(LayerGraph(q, k, gold, torch.ones(int(gold.sum())) / 3, D**-0.5))
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=causal, layers=layers)


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
        unregister_method("full-test")
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


# ==================================================================== exact numbers


def _expected(records, projections, spec) -> tuple[float, float, list[float], list[float]]:
    """Macro averages recomputed with the plain metrics: texts, then heads, then layers."""
    built = spec.build_layers(projections, LAYERS)
    rec, spa = [], []
    for record in records:
        preds = predict_record(spec, built, RecordInputs(record, projections))
        golds = record.gold_masks()
        rec.append(torch.stack([recall(p, g) for p, g in zip(preds, golds, strict=True)]))
        spa.append(torch.stack([sparsity(p, causal=record.causal) for p in preds]))
    rec_layer = torch.stack(rec).mean(0).mean(-1)  # (texts, layers, heads) → (layers,)
    spa_layer = torch.stack(spa).mean(0).mean(-1)
    return (float(rec_layer.mean()), float(spa_layer.mean()), rec_layer.tolist(),
            spa_layer.tolist())


def _check_rows(df: pd.DataFrame, records, projections, names) -> None:
    for name in names:
        rows = df[df["method"] == name]
        assert len(rows) == len(CURVES[name].specs)
        for _, row in rows.iterrows():
            spec = curve_spec(name, json.loads(row["params"]))
            r, s, r_layer, s_layer = _expected(records, projections, spec)
            assert row["recall"] == pytest.approx(r, abs=1e-12), (name, row["params"])
            assert row["sparsity"] == pytest.approx(s, abs=1e-12), (name, row["params"])
            assert json.loads(row["recall_per_layer"]) == pytest.approx(r_layer, abs=1e-6)
            assert json.loads(row["sparsity_per_layer"]) == pytest.approx(s_layer, abs=1e-6)


def test_sweep_numbers_equal_the_plain_metrics(points, records, projections) -> None:
    """Every row of these curves is the macro average of recall/sparsity of its predictions."""
    _check_rows(points, records, projections,
                ["distance", "kmeans+window", "quantization", "window", "topk", "routing"])
    gold = [torch.stack([sparsity(g) for g in r.gold_masks()]) for r in records]
    per_layer = torch.stack(gold).mean(0).mean(-1)
    assert points.attrs["gold_sparsity_per_layer"] == pytest.approx(per_layer.tolist())
    assert points.attrs["gold_sparsity"] == pytest.approx(float(per_layer.mean()))


@pytest.fixture(scope="module")
def causal_records() -> list[AttentionRecord]:
    gen = torch.Generator().manual_seed(3)
    return [_record(gen, n, causal=True) for n in (5, 8)]


def test_causal_sweep_uses_the_decoder_denominator(causal_records, projections) -> None:
    """A decoder's sparsity counts only non-future pairs: n(n+1)/2, not n²."""
    df = sweep(causal_records, projections, "window,distance,kmeans")
    _check_rows(df, causal_records, projections, ["window", "distance", "kmeans"])
    window = df[df["method"] == "window"].set_index("params")
    # w = 1 keeps the diagonal: n of n(n+1)/2 pairs, sparsity 1 - 2/(n+1) per text.
    one = window.loc[json.dumps({"window": 1})]
    assert one["sparsity"] == pytest.approx(((1 - 2 / 6) + (1 - 2 / 9)) / 2, abs=1e-12)
    # Every key a decoder may see, and nothing of the future counted: sparsity exactly 0.
    everything = window.loc[json.dumps({"window": 251})]
    assert everything["sparsity"] == pytest.approx(0.0, abs=1e-12)
    assert everything["recall"] == 1.0
    # Gold: top-3 non-future keys per query: min(i + 1, 3) edges in row i.
    edges = {n: sum(min(i + 1, 3) for i in range(n)) for n in (5, 8)}
    gold = ((1 - edges[5] / 15) + (1 - edges[8] / 36)) / 2
    assert df.attrs["gold_sparsity"] == pytest.approx(gold, abs=1e-12)
    assert df.attrs["gold_sparsity_per_layer"] == pytest.approx([gold] * LAYERS, abs=1e-12)
    # The app's single-setting path gives the same numbers.
    spec = curve_spec("distance", {"threshold": 1.0})
    single = score_spec(causal_records, projections, spec)
    row = df[(df["method"] == "distance") & (df["params"] == spec.params_json())].iloc[0]
    assert (single.recall, single.sparsity) == (row["recall"], row["sparsity"])
    assert single.n_texts == 2


def test_recall_at_sparsity_with_a_point_exactly_at_a_level() -> None:
    df = _df([("a", 0.5, 0.9), ("a", 0.75, 0.8), ("a", 0.9, 0.6), ("a", 0.95, 0.3),
              ("b", 0.9, 0.7)])
    step = recall_at_sparsity(df, levels=(0.5, 0.75, 0.9, 0.95)).set_index("method")
    assert step.loc["a"].tolist() == [0.9, 0.8, 0.6, 0.3]  # a point at the level counts
    assert step.loc["b"].tolist()[2] == 0.7 and math.isnan(step.loc["b"].tolist()[3])
    linear = recall_at_sparsity(df, levels=(0.5, 0.75, 0.9, 0.95), how="linear")
    assert linear.set_index("method").loc["a"].tolist() == [0.9, 0.8, 0.6, 0.3]
    assert linear.columns.tolist() == ["method", "recall@0.5", "recall@0.75", "recall@0.9",
                                       "recall@0.95"]
    mid = recall_at_sparsity(df, levels=(0.8,), how="linear").set_index("method")
    assert mid.loc["a", "recall@0.8"] == pytest.approx(0.8 - 0.2 * 0.05 / 0.15)
    assert recall_at_sparsity(df).columns.tolist() == ["method", "recall@0.75", "recall@0.9",
                                                       "recall@0.95"]


def test_frontier_ties_and_empty() -> None:
    df = _df([("a", 0.5, 0.8), ("a", 0.5, 0.8), ("a", 0.5, 0.7), ("a", 0.6, 0.8)])
    front = pareto_frontier(df)
    assert list(zip(front["sparsity"], front["recall"], strict=True)) == [(0.6, 0.8)]
    assert pareto_frontier(df.iloc[:0]).empty
    same = pareto_frontier(_df([("a", 0.5, 0.8), ("a", 0.5, 0.8)]))
    assert len(same) == 1 and same["params"].tolist() == [json.dumps({"i": 0})]


# ==================================================================== the registry, exactly


@pytest.fixture
def default_curves():
    """The default registrations, run again: the check covers the registering function
    itself (mutation testing forks after import), not only what import left behind."""
    from sparsefinder.evaluation import curves

    saved = dict(CURVES)
    CURVES.clear()
    curves._register_defaults()
    first = dict(CURVES)
    curves._register_defaults()  # again over itself: every default is replaced, none raises
    assert CURVES.keys() == first.keys()
    assert all(CURVES[name] is not first[name] for name in first)
    try:
        yield CURVES
    finally:
        CURVES.clear()
        CURVES.update(saved)


def _grid(name: str) -> tuple[str, int, list[dict]]:
    curve = CURVES[name]
    assert {s.method_id for s in curve.specs} == {curve.method} and curve.name == name
    assert {s.window for s in curve.specs} == {curve.specs[0].window}
    assert all(s.global_tokens == () for s in curve.specs)
    fixed = dict(curve.fixed)  # the form its name says (not in a sweep's params column)
    assert all(s.param_dict.items() >= fixed.items() for s in curve.specs)
    return curve.method, curve.specs[0].window, [
        {k: v for k, v in s.param_dict.items() if k not in fixed} for s in curve.specs]


def test_default_curves_exactly(default_curves) -> None:
    distance = [{"threshold": 0.25 * i} for i in range(1, 21)]
    clusters = [2, 4, 6, 8, 10, 12, 16, 20]
    bins = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32]
    expected = {
        "distance": ("distance", 0, distance),
        "kmeans": ("kmeans", 0, [{"n_clusters": b, "top_k": 1} for b in clusters]),
        "quantization": ("quantization", 0, [{"bins": b} for b in bins]),
        "kmeans-top2": ("kmeans", 0, [{"n_clusters": b, "top_k": 2} for b in clusters[1:]]),
        "window": ("window", 0, [{"window": w} for w in (
            0, 1, 3, 5, 7, 9, 11, 15, 19, 23, 27, 31, 41, 51, 75, 101, 125, 151, 175, 201,
            251)]),
        "longformer": ("longformer", 0, [{"n_global": g} for g in (4, 8, 12, 16, 20)]),
        "bigbird": ("bigbird", 0, [{"n_random": r} for r in (2, 4, 6, 8, 10)]),
        "reformer": ("reformer", 0, [{"n_buckets": b} for b in (2, 4, 6, 8, 10, 12)]),
        "routing": ("routing", 0, [{"n_clusters": c} for c in (2, 4, 6, 8, 10)]),
        "topk": ("topk", 0, [{"k": k} for k in (1, 2, 4, 8, 16, 32)]),
        "sparsebert-dams": ("sparsebert", 0,
                            [{"target_sparsity": t} for t in (0.5, 0.7, 0.8, 0.9, 0.95, 0.98)]),
        "sparsebert-damu": ("sparsebert", 0,
                            [{"target_sparsity": t} for t in (0.5, 0.7, 0.8, 0.9, 0.95, 0.98)]),
        "distance-nodiag": ("distance", 0, distance),
    }
    for name in ("distance", "kmeans", "quantization", "kmeans-top2", "reformer", "routing"):
        method, _, grid = expected[name]
        expected[f"{name}+window"] = (method, 3, grid)
    # finer raw grid, calibrated targets, routed k-means and the top-p oracle
    from sparsefinder.calibration.curves import DISTANCE_FINE_GRID, calibrated_grids, floor_grid

    ROUTED_BUDGET_GRID = [{"n_clusters": b, "budget": f} for b in (64, 128)  # noqa: N806
                          for f in (0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.12,
                                    0.15, 0.2, 0.25, 0.3)]
    ROUTED_TOP_GRID = [{"n_clusters": 128, "n_routes": t}  # noqa: N806
                       for t in (2, 4, 6, 8, 9, 10, 11, 12, 14, 16, 20, 24, 32)]
    TOPP_GRID = [0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 1.0]  # noqa: N806

    expected["distance-fine"] = ("distance", 0, [{"threshold": t} for t in DISTANCE_FINE_GRID])
    for name, grid in calibrated_grids().items():
        expected[name] = (name, 0, grid)
    for calibration in ("equal", "budget"):  # the default floor's, under their old names
        expected[f"distance-floor:{calibration}"] = (f"distance:{calibration}", 0, floor_grid())
    expected["kmeans-routed"] = ("kmeans-routed", 0, ROUTED_BUDGET_GRID)
    expected["kmeans-routed-top"] = ("kmeans-routed", 0, ROUTED_TOP_GRID)
    expected["topp"] = ("topp", 0, [{"p": p} for p in TOPP_GRID])
    expected["rowfrac"] = ("rowfrac", 0, [{"fraction": f} for f in
                                          (0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3,
                                           0.5)])
    # long-context baselines
    expected["quest"] = ("quest", 0, [{"page_size": 16, "pages": p}
                                      for p in (1, 2, 4, 8, 16, 32, 64)])
    expected["hashattention"] = ("hashattention", 0, [{"max_distance": t} for t in range(9)])
    # block Sparsefinder at blocks of 32 and 16, and with single keys
    blocks = [0, 1, 2, 3, 4, 5, 6, 8, 10, 12]
    for name, size, keys in (("block", 32, 0), ("block16", 16, 0), ("block+keys", 32, 16)):
        expected[name] = ("block", 0, [{"block": size, "n_blocks": b, "n_keys": keys}
                                       for b in blocks])
    # ... and with projections learned on pooled 32-token blocks (paper §6)
    for name, size in (("block-learned", 32), ("block16-learned", 16)):
        expected[name] = ("block", 0, [{"block": size, "n_blocks": b} for b in blocks])
    # ... and single keys nearest to sub-blocks of 8 queries (the long-context selector)
    expected["block-keys"] = ("block", 0, [{"block": 32, "n_keys": k, "sub_block": 8}
                                           for k in (0, 2, 4, 8, 16, 32, 64, 128)])
    assert set(default_curves) == set(expected)
    for name, want in expected.items():
        assert _grid(name) == want, name
    for name in ("distance", "distance+window", "kmeans", "window"):
        assert all(isinstance(next(iter(s.param_dict.values())), int | float)
                   for s in default_curves[name].specs)
    assert default_curves["topk"].specs[0].oracle
    assert default_curves["sparsebert-dams"].needs_training
    # forms that were families: the curve's name says its fixed parameter
    assert dict(default_curves["sparsebert-damu"].fixed) == {"kind": "unstructured"}
    assert dict(default_curves["distance-nodiag"].fixed) == {"diag": False}
    assert dict(default_curves["kmeans-routed-top"].fixed) == {"mode": "top"}
    assert dict(default_curves["block-keys"].fixed) == {"select": "keys"}
    assert not default_curves["window"].needs_projections


def test_register_curve_checks_names_grids_and_windows() -> None:
    with pytest.raises(ValueError, match=r"^curve name must be non-empty without commas, "
                                         r"got 'a,b'$"):
        register_curve("a,b", "window", [{"window": 1}])
    with pytest.raises(ValueError, match=r"^curve name must be non-empty without commas, "):
        register_curve("", "window", [{"window": 1}])
    with pytest.raises(ValueError, match=r"^curve 'empty-test' needs at least one parameter "
                                         r"dict in its grid$"):
        register_curve("empty-test", "window", [])
    assert "empty-test" not in CURVES
    try:
        curve = register_curve("w-test", "distance", [{"threshold": 1.0}], window=5)
        assert curve is CURVES["w-test"] and curve.name == "w-test"
        assert curve.specs[0].window == 5 and curve.method == "distance"
        again = register_curve("w-test", "window", [{"window": 1}], replace=True)
        assert CURVES["w-test"] is again and again.method == "window"
    finally:
        CURVES.pop("w-test", None)


def test_resolve_methods_messages_and_order() -> None:
    assert resolve_methods(" window , ,distance,window") == ["window", "distance"]
    assert resolve_methods(["window", "topk"]) == ["window", "topk"]
    assert resolve_methods("calibrated")[:3] == ["distance:equal", "distance:budget",
                                                 "distance:recall"]
    with pytest.warns(FutureWarning, match="'rowfrac-budget' is deprecated; use 'rowfrac:budget'"):
        assert resolve_methods("rowfrac-budget,window") == ["rowfrac:budget", "window"]
    with pytest.raises(ValueError, match=r"^no methods given; use 'sparsefinder', 'all' or a "
                                         r"comma list$"):
        resolve_methods(" , ")
    with pytest.raises(ValueError, match=r"^unknown method 'nope'; choose from: all, "
                                         r"sparsefinder, baselines, long-context, calibrated, "
                                         r"distance, "):
        resolve_methods("nope")


def test_available_curves_and_why_the_others_are_not(projections) -> None:
    names = ["window", "distance", "kmeans", "sparsebert-dams", "topk"]
    available, skipped = available_curves(None, names)
    assert available == ["window", "topk"]
    assert skipped == {
        "distance": "needs learned projections",
        "kmeans": "needs learned projections",
        "sparsebert-dams": "learned from training graphs (sparsefinder sweep --train-passages)",
    }
    partial = HeadProjections(
        weight=projections.weight, bias=projections.bias, model_id="synthetic", alpha=1.5,
        centroids={2: projections.centroids[2]},
    )
    available, skipped = available_curves(partial, ["kmeans", "distance", "routing"])
    assert available == ["distance", "routing"]
    assert skipped["kmeans"].startswith("no k-means centroids for B=4")
    assert ";" not in skipped["kmeans"]
    everything, _ = available_curves(projections)
    assert "distance" in everything and "sparsebert-dams" not in everything
    assert len(everything) + len(_) == len(CURVES)


def test_scoring_errors_name_the_problem(records, projections) -> None:
    from sparsefinder.evaluation.sweep import score_specs
    from sparsefinder.methods.spec import PredictorSpec

    window = PredictorSpec.of("window", {"window": 1})
    with pytest.raises(ValueError, match=r"^scoring needs at least one record \(a text's gold "
                                         r"graphs\)$"):
        score_specs([], None, [window])
    one_layer = AttentionRecord(text="x", tokens=["t"] * 9, offsets=[(0, 0)] * 9,
                                special=[False] * 9, causal=False,
                                layers=records[0].layers[:1])
    with pytest.raises(ValueError, match=r"^records come from models with different numbers "
                                         r"of layers$"):
        score_specs([records[0], one_layer], None, [window])
    with pytest.raises(ValueError, match=r"^these methods need learned projections; pass "
                                         r"projections=\.\.\. \(train them with `sparsefinder "
                                         r"train --model NAME --out DIR`\)$"):
        score_specs(records, None, [PredictorSpec.of("distance", {"threshold": 1.0})])
    with pytest.raises(ValueError, match=r"^sweep needs at least one record \(a text's gold "
                                         r"graphs\)$"):
        sweep([], None, "window")
    with pytest.raises(ValueError, match=r"^train_records come from a differently shaped "
                                         r"model$"):
        sweep(records, None, "window", train_records=[one_layer])
    with pytest.raises(ValueError, match=r"^methods \['window', 'distance'\] need learned "
                                         r"projections; pass projections=\.\.\.$"):
        sweep(records, None, "window,distance")
    # An empty train_records list means none: the static masks are skipped with a warning.
    with pytest.warns(UserWarning, match=r"^skipping sparsebert-dams: they are learned from "
                                         r"training gold graphs; pass train_records=\.\.\. "):
        df = sweep(records, None, "sparsebert-dams,window", train_records=[])
    assert set(df["method"]) == {"window"}


def test_progress_is_reported_after_each_text(records) -> None:
    from sparsefinder.evaluation.sweep import score_specs
    from sparsefinder.methods.spec import PredictorSpec

    seen = []
    specs = [PredictorSpec.of("window", {"window": w}) for w in (1, 3)]
    results, gold = score_specs(records, None, specs, on_progress=lambda f, m: seen.append((f, m)))
    assert seen == [(1 / 3, "text 1 of 3 (2 settings)"), (2 / 3, "text 2 of 3 (2 settings)"),
                    (1.0, "text 3 of 3 (2 settings)")]
    assert [r.n_texts for r in results] == [3, 3]
    assert gold.recall.tolist() == [1.0] * LAYERS
    assert len(gold.sparsity) == LAYERS
    frame = sweep(records, None, "window", on_progress=lambda f, m: seen.append((f, m)))
    assert seen[-1] == (1.0, f"text 3 of 3 ({len(frame)} settings)")


def test_sweep_defaults_to_the_sparsefinder_group(records, projections) -> None:
    with pytest.warns(UserWarning, match="no k-means centroids"):
        partial = HeadProjections(weight=projections.weight, bias=projections.bias,
                                  model_id="synthetic", alpha=1.5, centroids={})
        df = sweep(records, partial)
    # the group in catalog order, each curve followed by its +window twin
    assert list(dict.fromkeys(df["method"])) == ["distance", "distance+window", "quantization",
                                                 "quantization+window", "window"]


def test_one_record_sweeps_and_fitted_of_the_wrong_length(records, train_records) -> None:
    from sparsefinder.evaluation.sweep import score_specs
    from sparsefinder.methods.spec import PredictorSpec

    one = score_spec(records[:1], None, PredictorSpec.of("window", {"window": 1}))
    assert one.n_texts == 1
    df = sweep(records[:1], None, "sparsebert-dams,window", train_records=train_records[:1])
    assert set(df["method"]) == {"sparsebert-dams", "window"}
    with pytest.raises(ValueError, match="zip"):
        score_specs(records, None, [PredictorSpec.of("window", {"window": 1})], fitted=[])
    with pytest.warns(UserWarning) as caught:
        sweep(records, None, "sparsebert-dams,window")
    assert "(sparsefinder sweep: --train-passages N > 0)" in str(caught[0].message)


def test_the_skip_warning_points_at_the_caller(records) -> None:
    with pytest.warns(UserWarning) as caught:
        sweep(records, None, "sparsebert-dams,window")
    assert caught[0].filename == __file__


def test_sweeps_report_exact_fraction_and_block_recall(records, projections) -> None:
    from sparsefinder.metrics.measures import block_recall, exact_fraction

    df = sweep(records, projections, ["block16", "distance"])
    block = df[df.method == "block16"]
    assert block.block_recall.notna().all()
    assert df[df.method == "distance"].block_recall.isna().all()
    assert (block.exact_fraction.diff().dropna() >= -1e-12).all()  # more blocks, more exact rows
    row = block.iloc[3]
    spec = curve_spec("block16", json.loads(row.params))
    preds = [spec.build(projections, layer) for layer in range(records[0].num_layers)]
    expected_exact, expected_block = [], []
    for record in records:
        masks = predict_record(spec, preds, RecordInputs(record, projections))
        golds = record.gold_masks()
        pairs = list(zip(masks, golds, strict=True))
        expected_exact.append(torch.stack([exact_fraction(p, g) for p, g in pairs]))
        expected_block.append(torch.stack([block_recall(p, g, 16, causal=record.causal)
                                           for p, g in pairs]))
    assert row.exact_fraction == pytest.approx(float(torch.stack(expected_exact).mean()))
    assert row.block_recall == pytest.approx(float(torch.stack(expected_block).mean()))


def test_sweep_extra_metrics_are_macro_averages_of_the_plain_functions(points, records,
                                                                      projections) -> None:
    """precision, exact fraction, mass recall and block recall columns (issue 10) are the
    macro averages (texts, heads, layers) of the metric functions on each prediction."""
    from sparsefinder.metrics.measures import (
        EXTRA_METRICS,
        block_recall,
        exact_fraction,
        mass_recall,
        precision,
    )

    functions = {
        "precision": lambda p, g, probs: precision(p, g),
        "exact_fraction": lambda p, g, probs: exact_fraction(p, g),
        "mass_recall": lambda p, g, probs: mass_recall(p, probs),
        "block_recall16": lambda p, g, probs: block_recall(p, g, 16),
        "block_recall64": lambda p, g, probs: block_recall(p, g, 64),
    }
    assert set(functions) == set(EXTRA_METRICS)
    for name in ("distance", "kmeans+window", "topk"):
        for _, row in points[points["method"] == name].iterrows():
            spec = curve_spec(name, json.loads(row["params"]))
            per_text = {metric: [] for metric in functions}
            for record in records:
                preds = predict_record(spec, spec.build_layers(projections, LAYERS),
                                       RecordInputs(record, projections))
                for metric, fn in functions.items():
                    per_text[metric].append(torch.stack([
                        fn(p, layer.gold, layer.probs())
                        for p, layer in zip(preds, record.layers, strict=True)]))
            # mass recall sums float32 probabilities (2n terms a row), the others count
            longest = max(r.n_tokens for r in records)
            for metric, values in per_text.items():
                expected = float(torch.stack(values).mean(0).mean(-1).mean())
                atol = ratio_tol(2 * longest, torch.float32) if metric == "mass_recall" \
                    else ratio_tol(longest * longest)
                assert row[metric] == pytest.approx(expected, abs=atol), (name, metric)


def test_metrics_at_sparsity_reads_the_step_rule_configuration() -> None:
    from sparsefinder.evaluation.frontier import metrics_at_sparsity

    df = _df([("a", 0.70, 0.99), ("a", 0.80, 0.90), ("a", 0.92, 0.60), ("a", 0.96, 0.30),
              ("b", 0.50, 1.00)])
    df["precision"] = [0.1, 0.2, 0.3, 0.4, 0.5]
    out = metrics_at_sparsity(df, (0.75, 0.9, 0.95))
    assert out["method"].tolist() == ["a", "a", "a"]  # b reaches no level
    assert out["recall"].tolist() == [0.90, 0.60, 0.30]
    assert out["precision"].tolist() == [0.2, 0.3, 0.4]
    at = recall_at_sparsity(df, (0.75, 0.9, 0.95)).set_index("method")
    assert out["recall"].tolist() == at.loc["a"].tolist()
    assert list(out.columns) == ["method", "level", "params", "recall", "sparsity",
                                 "precision"]


def test_matched_sparsity_interpolates_the_other_curve() -> None:
    from sparsefinder.evaluation.frontier import matched_sparsity

    df = pd.DataFrame([
        {"method": "a", "params": "{}", "sparsity": 0.5, "recall": 0.6, "exact_fraction": 0.1},
        {"method": "a", "params": "{}", "sparsity": 0.9, "recall": 0.2, "exact_fraction": 0.0},
        {"method": "b", "params": "{}", "sparsity": 0.4, "recall": 0.8, "exact_fraction": 0.5},
        {"method": "b", "params": "{}", "sparsity": 0.8, "recall": 0.4, "exact_fraction": 0.1},
    ])
    got = matched_sparsity(df, "a", "b", metrics=("recall", "exact_fraction"))
    assert got["sparsity"].tolist() == [0.9, 0.5]
    assert math.isnan(got["recall_other"][0])  # 0.9 is sparser than every point of b
    assert got["recall_other"][1] == pytest.approx(0.7)
    assert got["exact_fraction_other"][1] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="no points of c in these results"):
        matched_sparsity(df, "a", "c")


def test_sweep_counts_softmax_layers_out_of_its_averages(sparse_modernbert_records):
    from sparsefinder.evaluation.sweep import sweep

    frame = sweep(sparse_modernbert_records, None, "topk")
    assert frame.attrs["softmax_layers"] == [1, 2]
    gold = frame.attrs["gold_sparsity_per_layer"]
    assert frame.attrs["gold_sparsity"] == pytest.approx((gold[0] + gold[3]) / 2)


def test_skipped_points_are_summarised_once_per_curve_and_reason() -> None:
    from sparsefinder.evaluation.sweep import skipped_summary

    lines = [f'kmeans-routed {{"budget": {b}}}: codebooks are for another model'
             for b in (0.1, 0.2, 0.3)]
    lines.append('kmeans {"n_clusters": 6}: no k-means centroids for B=6')
    assert skipped_summary(lines) == (
        "kmeans-routed (3 settings): codebooks are for another model; "
        "kmeans (1 setting): no k-means centroids for B=6")


def test_curve_display_names_read_the_method_the_window_and_the_curve() -> None:
    assert curve_display_name("distance") == "Distance (t)"
    assert curve_display_name("distance+window") == "Distance (t) + window 3"
    assert curve_display_name("kmeans-top2") == "k-means (B, k) · kmeans-top2"
    assert curve_display_name("kmeans-top2+window") == "k-means (B, k) · kmeans-top2 + window 3"
    assert curve_display_name("distance:budget") == ("Distance (t), per head, sparsity budget "
                                                     "across heads")
    # no curve: read as a method id (an old name too), or left as it is
    assert curve_display_name("distance-budget") == curve_display_name("distance:budget")
    assert curve_display_name("nope+x") == "nope+x"
    try:  # a "+window" curve whose base is no curve, and a "+window" name without a window
        register_curve("solo+window", "distance", [{"threshold": 1.0}], window=5)
        register_curve("bare+window", "window", [{"window": 1}])
        assert curve_display_name("solo+window") == "Distance (t) + window 5"
        assert curve_display_name("bare+window") == "Window (w) · bare+window"
    finally:
        CURVES.pop("solo+window", None)
        CURVES.pop("bare+window", None)


def test_with_labels_appends_one_label_column_once() -> None:
    frame = pd.DataFrame({"method": ["distance", "window"], "recall": [0.5, 0.25]})
    labelled = with_labels(frame)
    assert list(labelled.columns) == ["method", "recall", "label"]
    assert labelled["label"].tolist() == ["Distance (t)", "Window (w)"]
    assert "label" not in frame  # the input is left as it was
    assert with_labels(labelled) is labelled  # already labelled: unchanged
    no_method = pd.DataFrame({"recall": [0.5]})
    assert with_labels(no_method) is no_method


def test_group_names_and_all_are_never_read_as_old_method_names(recwarn) -> None:
    from sparsefinder.methods.registry import METHODS, register_alias

    try:
        register_alias("baselines", "distance", "budget")
        register_alias("all", "window")
        assert resolve_methods("baselines") == GROUPS["baselines"]
        assert resolve_methods("all") == list(CURVES)
        assert not [w for w in recwarn if issubclass(w.category, FutureWarning)]
    finally:
        METHODS.aliases().pop("baselines", None)
        METHODS.aliases().pop("all", None)


def test_available_curves_build_layer_zero_and_curve_spec_of_a_single_point(records) -> None:
    one_layer = HeadProjections(weight=torch.randn(1, HEADS, R, D), bias=torch.zeros(1, HEADS, R),
                                model_id="synthetic", alpha=1.5,
                                centroids={2: torch.randn(1, HEADS, 2, R)})
    try:  # a one-layer file builds every point (the check builds layer 0, which always exists)
        register_curve("kmeans2-test", "kmeans", [{"n_clusters": 2, "top_k": 1}])
        available, skipped = available_curves(one_layer, ["kmeans2-test", "distance"])
        assert available == ["kmeans2-test", "distance"] and skipped == {}
        register_curve("single-test", "distance", [{"threshold": 2.0}], window=7)
        spec = curve_spec("single-test", {"threshold": 0.5})
        assert spec.method == "distance" and spec.window == 7
        assert spec.param_dict == {"threshold": 0.5}
    finally:
        CURVES.pop("single-test", None)
        CURVES.pop("kmeans2-test", None)


def _block_records(alphas: tuple[float | None, ...], texts: int = 2) -> list[AttentionRecord]:
    gen = torch.Generator().manual_seed(11)
    records = []
    for _ in range(texts):
        layers = []
        for alpha in alphas:
            q, k = torch.randn(2, 16, 4, generator=gen), torch.randn(2, 16, 4, generator=gen)
            gold = torch.rand(2, 16, 16, generator=gen) < 0.3
            layers.append(LayerGraph(q, k, gold, torch.ones(int(gold.sum())), 0.5,
                                     alpha=alpha))
        records.append(AttentionRecord(text="x", tokens=["t"] * 16, offsets=[(0, 0)] * 16,
                                       special=[False] * 16, causal=False, layers=layers))
    return records


@pytest.mark.parametrize("alphas", [(1.5, 1.0, 1.5), (1.0, 1.0, 1.0)])
def test_own_block_recall_averages_the_counted_layers_or_all_when_none_is(alphas):
    """A spec's block recall at its own block size: macro over texts and heads, over the
    entmax layers only; a model whose every layer is softmax averages all of them."""
    from sparsefinder.evaluation.sweep import own_block_recall, score_specs
    from sparsefinder.methods.spec import PredictorSpec
    from sparsefinder.metrics.scorer import Scorer

    records = _block_records(alphas)
    spec = PredictorSpec.of("block", {"block": 4, "n_keys": 3, "sub_block": 2, "select": "keys"})
    (got,), _ = score_specs(records, None, [spec])
    built = spec.build_layers(None, len(alphas))
    per_text = torch.stack([own_block_recall(spec, predict_record(spec, built,
                                                                  RecordInputs(r, None)),
                                             Scorer(r)) for r in records])  # (texts, L, H)
    counted = torch.tensor([a != 1.0 for a in alphas])
    counted = counted if bool(counted.any()) else torch.ones_like(counted)
    assert got.block_recall == pytest.approx(float(per_text[:, counted].mean()), abs=1e-12)
    assert got.n_softmax_layers == sum(a == 1.0 for a in alphas)
    if not bool(torch.tensor([a != 1.0 for a in alphas]).any()):  # not the layers' mean
        assert got.recall == pytest.approx(float(torch.tensor(got.recall_per_layer).mean()))
    plain = PredictorSpec.of("topk", {"k": 2})  # no block parameter: NaN
    (none,), _ = score_specs(records, None, [plain])
    assert math.isnan(none.block_recall)


def test_points_frame_writes_the_one_column_set_in_order():
    from sparsefinder.evaluation.sweep import SpecScores, points_frame
    from sparsefinder.methods.spec import PredictorSpec
    from sparsefinder.metrics.measures import EXTRA_METRICS

    spec = PredictorSpec.of("distance", {"threshold": 1.5}, window=3)
    result = SpecScores(recall=0.5, sparsity=0.75, recall_per_layer=[0.1234567891, 0.9],
                        sparsity_per_layer=[0.7, 0.8], n_texts=3,
                        extra={"precision": 0.25}, block_recall=0.125)
    frame = points_frame([("distance+window", spec)], [result])
    assert list(frame.columns) == ["method", "family", "calibration", "params", "recall",
                                   "sparsity", *EXTRA_METRICS, "recall_per_layer",
                                   "sparsity_per_layer", "n_texts", "block_recall"]
    row = frame.iloc[0]
    assert (row["method"], row["family"], row["calibration"]) == ("distance+window",
                                                                  "distance", "none")
    assert row["params"] == spec.params_json()
    assert (row["recall"], row["sparsity"], row["n_texts"], row["block_recall"]) == (
        0.5, 0.75, 3, 0.125)
    assert row["precision"] == 0.25
    assert all(math.isnan(row[name]) for name in EXTRA_METRICS if name != "precision")
    assert json.loads(row["recall_per_layer"]) == [0.123457, 0.9]
    assert json.loads(row["sparsity_per_layer"]) == [0.7, 0.8]
    with pytest.raises(ValueError):
        points_frame([("a", spec), ("b", spec)], [result])
