"""sparsefinder.explore: the live path: state → spec → masks → scores (no Streamlit)."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.attention.masks import causal_mask
from sparsefinder.explore import live, tables
from sparsefinder.explore import prepared as prep
from sparsefinder.explore import state as urlstate
from sparsefinder.explore.availability import available_methods
from sparsefinder.metrics.measures import recall, score_layers, sparsity

#: The raw (uncalibrated) distance family: ViewState defaults to its calibrated form.
RAW_DISTANCE = {"method": "distance", "calibration": "none"}


def test_clamp_fits_state_to_text(prepared):
    state = urlstate.ViewState(method="kmeans", layer=99, head=99, query=999, clusters=5,
                               top_k=8, t=None)
    clamped, notes = live.clamp(state, prepared)
    said = " ".join(notes)
    assert "layer=99" in said and "head=99" in said and "query=999" in said
    assert "graph is full" in said  # k=4 of B=4: every pair shares a cluster
    assert (clamped.layer, clamped.head) == (prepared.num_layers - 1, prepared.num_heads - 1)
    assert clamped.query == prepared.n_tokens - 1
    assert clamped.clusters in (4, 8) and clamped.top_k <= clamped.clusters
    assert clamped.t == prep.default_threshold(prepared)
    assert 0 < clamped.t <= prepared.t_max


def test_k_over_half_of_b_is_named_and_really_full(prepared):
    state = urlstate.ViewState(method="kmeans", clusters=4, top_k=3, window=0,
                               global_tokens=())
    clamped, notes = live.clamp(state, prepared)
    assert any("graph is full" in n for n in notes)
    assert all(mask.all() for mask in live.predict_layers(prepared, clamped))
    _, notes = live.clamp(state.with_(top_k=2), prepared)
    assert not any("graph is full" in n for n in notes)


def test_without_projections_learned_methods_are_off_but_fixed_patterns_work(record):
    bare = prep.prepare(record, None)
    # Quest and the oracles read the model's q/k; Longformer/BigBird only the shape
    assert available_methods(bare) == ["quest", "window", "longformer", "bigbird", "topk",
                                       "topp"]
    state = urlstate.ViewState(method="kmeans", window=3, global_tokens=())
    clamped, notes = live.clamp(state, bare)
    assert clamped.method == "kmeans" and notes and "projections" in notes[0]
    assert live.effective_method(clamped, bare) == "window"
    preds = live.predict_layers(bare, clamped)
    n = record.n_tokens
    band = torch.ones(n, n, dtype=torch.bool).tril(1).triu(-1)
    assert all(torch.equal(p, band.expand_as(p)) for p in preds)


def test_nothing_switched_on_predicts_the_empty_graph(prepared):
    state = urlstate.ViewState(method="window", window=0, global_tokens=())
    assert live.spec_for(state, prepared).build(prepared.projections, 0) is None
    scores = live.score(prepared, live.predict_layers(prepared, state))
    assert torch.all(scores.sparsity == 1.0)


@pytest.mark.parametrize(
    ("field", "values", "base"),
    [
        ("t", [0.0, 0.3, 0.8, 2.0], urlstate.ViewState(**RAW_DISTANCE, window=0,
                                                    global_tokens=())),
        ("window", [0, 1, 3, 9, 31], urlstate.ViewState(method="window", global_tokens=())),
        ("top_k", [1, 2, 3, 4], urlstate.ViewState(method="kmeans", clusters=4, window=0,
                                                global_tokens=())),
    ],
)
def test_larger_hyperparameter_never_lowers_recall(prepared, field, values, base):
    recalls, sparsities = [], []
    for value in values:
        scores = live.score(prepared, live.predict_layers(prepared, base.with_(**{field:
                                                                                     value})))
        recalls.append(scores.recall)
        sparsities.append(scores.sparsity)
    for before, after in zip(recalls, recalls[1:], strict=False):
        assert torch.all(after >= before - 1e-12)
    for before, after in zip(sparsities, sparsities[1:], strict=False):
        assert torch.all(after <= before + 1e-12)
    assert not torch.equal(recalls[0], recalls[-1]) or not torch.equal(sparsities[0],
                                                                       sparsities[-1])


def test_quantization_and_union_with_globals(prepared):
    state = urlstate.ViewState(method="quantization", bins=4, window=0, global_tokens=("first",))
    preds = live.predict_layers(prepared, state)
    assert preds[0].dtype == torch.bool and preds[0].shape == prepared.record.layers[0].gold.shape
    assert torch.all(preds[0][:, 0, :]) and torch.all(preds[0][:, :, 0])


def test_summary_matches_metrics(prepared):
    state = urlstate.ViewState(method="kmeans", clusters=4, top_k=1, window=3)
    preds = live.predict_layers(prepared, state)
    scores = live.score(prepared, preds)
    gold = prepared.record.layers[2].gold
    summary = live.summarize(scores, 2, 5)
    assert summary["head"].recall == pytest.approx(float(recall(preds[2], gold)[5]))
    assert summary["head"].sparsity == pytest.approx(float(sparsity(preds[2])[5]))
    assert summary["layer"].recall == pytest.approx(float(recall(preds[2], gold).mean()))
    assert summary["model"].gold_sparsity == pytest.approx(float(scores.gold_sparsity.mean()))
    frame = tables.metrics_frame(scores)
    assert len(frame) == prepared.num_layers * prepared.num_heads
    row = frame[(frame["layer"] == 2) & (frame["head"] == 5)].iloc[0]
    assert row.recall == pytest.approx(summary["head"].recall)


def test_describe_names_the_setting_that_runs(prepared):
    def describe(state, on=prepared):
        return live.describe(live.spec_for(state, on))

    assert describe(urlstate.ViewState(method="kmeans", clusters=8, top_k=2, window=3,
                                       global_tokens=("first",))) == (
        "k-means B=8 k=2 ∪ window 3 ∪ global first")
    assert describe(urlstate.ViewState(method="window", window=0,
                                       global_tokens=())) == "empty graph"
    bare = prep.prepare(prepared.record, None)
    assert describe(urlstate.ViewState(**RAW_DISTANCE, t=1.0, window=0,
                                       global_tokens=("first", "last")), bare) == (
        "global first+last")


def test_describe_names_a_generated_familys_parameters_by_their_labels():
    """No method id repeated as a parameter ("window window=23"): the family's name, then
    each parameter by its slider label."""
    from sparsefinder.methods.spec import PredictorSpec

    assert live.describe(PredictorSpec.of("window", {"window": 23})) == "Window w=23"
    assert live.describe(PredictorSpec.of("bigbird", {"n_random": 2}, window=3)) == (
        "BigBird, random keys 2 ∪ window 3")


def test_fast_score_equals_metrics_score_layers(prepared):
    from sparsefinder.metrics.measures import score_layers

    preds = live.predict_layers(prepared, urlstate.ViewState(**RAW_DISTANCE, t=0.6))
    fast = live.score(prepared, preds)
    slow = score_layers(preds, prepared.record.gold_masks(), causal=prepared.record.causal)
    for name in ("recall", "sparsity", "gold_sparsity"):
        assert torch.allclose(getattr(fast, name), getattr(slow, name))


def test_live_masks_are_the_predictors_masks(prepared):
    from sparsefinder.predictors import Distance, GlobalTokens, Union, Window

    state = urlstate.ViewState(**RAW_DISTANCE, t=0.7, window=3, global_tokens=("last",))
    preds = live.predict_layers(prepared, state)
    for index in range(prepared.num_layers):
        q, k = prepared.vectors.projected(index)
        expected = Union(Distance(0.7), Window(3), GlobalTokens(first=False, last=True)).predict(
            q, k, causal=prepared.record.causal)
        assert torch.equal(preds[index], expected)


def test_kmeans_layer_mask_matches_predict_layers(prepared):
    state = urlstate.ViewState(method="kmeans", clusters=8, top_k=2, window=0, global_tokens=())
    preds = live.predict_layers(prepared, state)
    assert torch.equal(live.kmeans_layer_mask(prepared, 2, 8, 2), preds[2])


# ---------------------------------------------------------------- a decoder, and boundaries


@pytest.fixture(scope="module")
def causal_prepared():
    """A synthetic decoder record (7 tokens, 2 layers, 2 heads) with random projections."""
    from sparsefinder.attention.masks import causal_mask
    from sparsefinder.data.records import AttentionRecord, LayerGraph
    from sparsefinder.projections.heads import HeadProjections

    gen = torch.Generator().manual_seed(4)
    n, heads, d = 7, 2, 4
    layers = []
    for _ in range(2):
        gold = (torch.rand(heads, n, n, generator=gen) < 0.5) & causal_mask(n, n)
        gold[..., 0] = True  # every row has an edge
        layers.append(LayerGraph(torch.randn(heads, n, d, generator=gen),
                                 torch.randn(heads, n, d, generator=gen), gold,
                                 torch.ones(int(gold.sum())), 0.5))
    record = AttentionRecord(text="x", tokens=[f"t{i}" for i in range(n)],
                             offsets=[(i, i + 1) for i in range(n)], special=[False] * n,
                             causal=True, layers=layers)
    projections = HeadProjections(
        weight=torch.randn(2, heads, 3, d, generator=gen), bias=torch.zeros(2, heads, 3),
        model_id="synthetic", alpha=1.5,
        centroids={b: torch.randn(2, heads, b, 3, generator=gen) for b in (2, 4, 8)})
    return prep.prepare(record, projections)


def test_a_decoder_is_scored_over_its_non_future_pairs(causal_prepared):
    """Window 1 keeps the diagonal: 7 of the 28 non-future pairs (not 7 of 49)."""
    p = causal_prepared
    state = urlstate.ViewState(method="window", window=1, global_tokens=())
    preds = live.predict_layers(p, state)
    scores = live.score(p, preds)
    assert torch.allclose(scores.sparsity, torch.full((2, 2), 0.75, dtype=torch.float64))
    golds = p.record.gold_masks()
    expected = score_layers(preds, golds, causal=True)
    assert torch.equal(scores.recall, expected.recall)
    assert torch.equal(scores.gold_sparsity, expected.gold_sparsity)
    edges = torch.stack([g.sum((-2, -1)) for g in golds]).double()
    assert torch.allclose(scores.gold_sparsity, 1 - edges / 28)
    # Every key (future ones too) predicted: recall 1 and, over the allowed pairs, sparsity 0.
    full = live.score(p, live.predict_layers(p, state.with_(window=31)))
    assert full.recall.eq(1).all() and full.sparsity.eq(0).all()
    # The Pareto star's path gives the same numbers for the same setting.
    spec = live.spec_for(state, p)
    star = live.score_setting([p.record], p.projections, spec)
    assert star.sparsity == pytest.approx(0.75, abs=1e-12)
    assert star.recall == pytest.approx(float(scores.recall.mean(-1).mean()), abs=1e-12)
    assert star.gold_sparsity == pytest.approx(float(scores.gold_sparsity.mean()), abs=1e-12)
    for method in ("distance", "kmeans", "quantization"):
        state = urlstate.ViewState(method=method, t=0.5, bins=3, clusters=4, window=0,
                                   global_tokens=())
        preds = live.predict_layers(p, state)
        mine = live.score(p, preds)
        assert torch.equal(mine.sparsity, score_layers(preds, golds, causal=True).sparsity)
        km = live.kmeans_layer_mask(p, 1, 4, 1) if method == "kmeans" else None
        if km is not None:
            assert torch.equal(km & causal_mask(7, 7), preds[1] & causal_mask(7, 7))


def test_clamp_at_the_boundaries(causal_prepared):
    p = causal_prepared
    at_edge = urlstate.ViewState(method="kmeans", layer=2, head=2, query=7, clusters=2,
                                 top_k=3, t=p.t_max)
    clamped, notes = live.clamp(at_edge, p)
    said = " ".join(notes)  # every change is said
    assert "layer=2" in said and "head=2" in said and "query=7" in said
    assert "graph is full" in said  # k=2 of B=2
    assert (clamped.layer, clamped.head, clamped.query) == (1, 1, 6)
    assert clamped.clusters == 2 and clamped.top_k == 2  # B kept, k cut to B
    assert clamped.t == p.t_max
    inside = urlstate.ViewState(method="kmeans", layer=1, head=1, query=6, clusters=8,
                                top_k=4, t=0.0, pages=2, bins=4)
    assert live.clamp(inside, p) == (inside, [])
    over = live.clamp(urlstate.ViewState(t=p.t_max + 1, clusters=5), p)[0]
    assert over.t == p.t_max and over.clusters == 4  # nearest stored B to 5
    assert live.clamp(urlstate.ViewState(clusters=7), p)[0].clusters == 8
    assert live.clamp(urlstate.ViewState(clusters=None), p)[0].clusters == 8  # the default B
    bare = prep.prepare(p.record, None)
    _, notes = live.clamp(urlstate.ViewState(**RAW_DISTANCE), bare)
    assert notes == ["Distance (t) needs learned projections for this model, which are not "
                     "loaded: it is off, and only the window/global patterns are predicted."]


def test_the_model_value_leaves_softmax_layers_out_as_the_sweep_does():
    from sparsefinder.metrics.measures import GraphScores
    from sparsefinder.metrics.scorer import macro_average

    recall = torch.tensor([[1.0, 1.0], [0.2, 0.4], [0.6, 0.8]], dtype=torch.float64)
    scores = GraphScores(recall=recall, sparsity=1 - recall)
    scores.counted = torch.tensor([False, True, True])  # layer 0 ran softmax
    model = live.summarize(scores, 1, 0)["model"]
    assert model.recall == pytest.approx(0.5)  # (0.3 + 0.7) / 2, not (1 + 0.3 + 0.7) / 3
    assert model.recall == pytest.approx(macro_average([scores])["recall"])
    scores.counted = torch.tensor([False, False, False])  # no entmax layer: all are kept
    assert live.summarize(scores, 1, 0)["model"].recall == pytest.approx(2.0 / 3)


def test_summarize_without_gold_sparsity_and_labels():
    from sparsefinder.metrics.measures import GraphScores

    values = torch.tensor([[0.2, 0.4], [0.6, 1.0]], dtype=torch.float64)
    out = live.summarize(GraphScores(recall=values, sparsity=1 - values), 1, 0)
    assert out["head"].recall == 0.6 and out["head"].gold_sparsity == pytest.approx(0.4)
    assert out["layer"].recall == pytest.approx(0.8)
    assert out["model"].recall == pytest.approx(0.55)
    assert out["model"].gold_sparsity == pytest.approx(0.45)
    spec = urlstate.to_spec(urlstate.ViewState(t=1.23456, window=0, global_tokens=()),
                            "distance")
    assert live.describe(spec) == "distance t=1.23"
    spec = urlstate.to_spec(urlstate.ViewState(bins=5, window=3,
                                               global_tokens=("first", "last")), "quantization")
    assert live.describe(spec) == "quantization β=5 ∪ window 3 ∪ global first+last"
    spec = urlstate.to_spec(urlstate.ViewState(window=0, global_tokens=()), "window")
    assert live.describe(spec) == "empty graph"


def test_quest_runs_from_the_model_vectors_without_projections(record):
    from sparsefinder.predictors.quest import QuestPages

    bare = prep.prepare(record, None)
    state = urlstate.ViewState(method="quest", pages=2, window=0, global_tokens=())
    assert live.effective_method(state, bare) == "quest"
    spec = live.spec_for(state, bare)
    assert spec.param_dict == {"page_size": urlstate.QUEST_PAGE, "pages": 2}
    preds = live.predict_layers(bare, state)
    graph = record.layers[0]
    expected = QuestPages(2, urlstate.QUEST_PAGE).predict(graph.queries, graph.keys,
                                                          causal=record.causal)
    assert torch.equal(preds[0], expected)
    parsed, problems = urlstate.parse_view_state({"method": "quest", "pages": "65"})
    assert parsed.method == "quest" and parsed.pages is None and "pages" in problems[0]


def test_the_default_threshold_opens_near_the_gold_sparsity(prepared):
    """Distance at its default t keeps about as many pairs as the gold graphs hold (not the
    solid square a fixed t gave), and the default sits inside the slider's range."""
    t = prep.default_threshold(prepared)
    assert 0 < t <= prepared.t_max and prepared.t_default == t
    from sparsefinder.methods.spec import PredictorSpec, predict_record

    spec = PredictorSpec.of("distance", {"threshold": t})
    masks = predict_record(spec, spec.build_layers(prepared.projections, prepared.num_layers),
                           prepared.vectors)
    scores = prepared.scorer.score(masks)
    gold = float(prepared.scorer.gold_sparsity.mean())
    assert abs(float(scores.sparsity.mean()) - gold) < 0.1


def test_quest_opens_with_the_pages_that_hold_the_gold_density(prepared):
    """A link without ``pages`` gets the text's default (about the gold density), not the
    nearly full graph a fixed 8 pages gave on a short text."""
    clamped, _ = live.clamp(urlstate.ViewState(method="quest", window=0, global_tokens=()),
                            prepared)
    density = 1.0 - float(prepared.scorer.gold_sparsity.mean())
    expected = max(1, round(density * prepared.n_tokens / urlstate.QUEST_PAGE))
    assert clamped.pages == prep.default_pages(prepared) == expected
    kept = urlstate.ViewState(method="quest", pages=3)
    assert live.clamp(kept, prepared)[0].pages == 3  # a link's own value stays


def test_the_first_head_shown_is_the_one_nearest_the_models_average():
    from sparsefinder.metrics.measures import GraphScores

    recall = torch.tensor([[0.1, 0.8, 0.9], [0.7, 0.75, 1.0]])
    sparsity = torch.tensor([[0.95, 0.85, 0.6], [0.9, 0.88, 0.5]])
    scores = GraphScores(recall=recall, sparsity=sparsity)
    layer, head = live.representative_head(scores)
    # mean (0.708, 0.780), spread (0.310, 0.181): L0H1 (0.80, 0.85) is 0.24 away in squared
    # spread units, L1H1 (0.75, 0.88) 0.33, L0H0 (0.10, 0.95) 4.7
    assert (layer, head) == (0, 1)


@pytest.fixture(scope="module")
def calibrated(record, projections):
    """The test text with the bundled calibration table and its own projections."""
    from sparsefinder.bundle import bundle
    from sparsefinder.calibration.table import CalibrationTable

    path = bundle().path("calibration")
    table = CalibrationTable.load(path)
    return prep.prepare(record, projections, calibration=table,
                        calibration_projections=table.own_projections(path))


def test_clamp_keeps_a_calibrated_state_and_snaps_its_target(calibrated):
    p = calibrated
    assert 0.9 in p.calibration.targets and 0.5 in p.calibration.targets
    clamped, notes = live.clamp(urlstate.ViewState(), p)  # distance-floor:budget at 0.9
    assert notes == [] and clamped.method_id == "distance-floor:budget"
    assert clamped.target_sparsity == 0.9
    for wanted, nearest in ((0.903, 0.9), (0.897, 0.9), (0.56, 0.6), (0.3, 0.5)):
        wanted_state = urlstate.ViewState(method="distance", floor=0, target_sparsity=wanted)
        clamped, notes = live.clamp(wanted_state, p)
        assert clamped.target_sparsity == nearest and clamped.method_id == "distance:budget"
        assert notes == [f"target sparsity {wanted:g} is not calibrated: showing the nearest "
                         f"calibrated target, {nearest:g}."]
    routed = urlstate.ViewState(method="kmeans-routed", target_sparsity=0.76)
    assert live.clamp(routed, p) == (live.clamp(routed, p)[0], [])
    assert live.clamp(routed, p)[0].method_id == "kmeans-routed:budget"


def test_a_target_counts_as_calibrated_only_strictly_within_1e_9():
    from types import SimpleNamespace

    # what clamp reads of a prepared text, with a table whose targets sit 1e-9 apart;
    # 2e-9 - 1e-9 is exactly 1e-9 in floating point: not within, so snapped
    table = SimpleNamespace(targets=[1e-9, 0.5], has=lambda method: False)
    fake = SimpleNamespace(calibration=table, available=["window"],
                           has_projections=False, t_max=1.0, cluster_choices=[],
                           num_layers=1, num_heads=1, n_tokens=4, t_default=0.25,
                           bins_default=None)
    assert 2e-9 - 1e-9 == 1e-9
    state = urlstate.ViewState(method="window", target_sparsity=2e-9, t=0.5, pages=1)
    clamped, notes = live.clamp(state, fake)
    assert clamped.target_sparsity == 1e-9 and notes == [
        "target sparsity 2e-09 is not calibrated: showing the nearest calibrated target, 1e-09."]
    near = live.clamp(state.with_(target_sparsity=1e-9 + 5e-10), fake)[0]
    assert near.target_sparsity == 1e-9 + 5e-10


def test_clamp_says_why_a_method_is_off(prepared, record):
    # projections but no calibration table: a calibrated method cannot run
    clamped, notes = live.clamp(urlstate.ViewState(method="distance", floor=0), prepared)
    assert clamped.method_id == "distance:budget"
    assert notes == [
        "Distance (t), per head, sparsity budget across heads needs settings calibrated for these "
        "projections (`sparsefinder calibrate --projections FILE --out calibration.pt`), which "
        "are not loaded: it is off, and only the window/global patterns are predicted."]
    # neither: the projections are what is missing
    _, notes = live.clamp(urlstate.ViewState(), prep.prepare(record, None))
    assert notes[0].startswith("Distance (t) ∪ nearest keys per row (floor m), per head, sparsity "
                               "budget across heads needs learned projections for this model, "
                               "which are not loaded")
    # a raw method whose learned parts are missing (no hash codes here) is not "calibrated"
    assert live.clamp(urlstate.ViewState(method="hashattention"), prepared)[1] == [
        "HashAttention (learned bit codes) needs learned projections for this model, which are "
        "not loaded: it is off, and only the window/global patterns are predicted."]
    # a raw learned method with projections runs: nothing said
    assert live.clamp(urlstate.ViewState(method="distance", calibration="none"), prepared)[1] == []


def test_clamp_gives_a_family_outside_the_app_its_raw_calibration(prepared):
    # window is offered raw only: the state gives it its raw calibration at once
    assert urlstate.ViewState(method="window", calibration="budget").calibration == "none"
    state = urlstate.ViewState(method="sparsebert", calibration="budget", t=0.1, pages=1,
                               clusters=4, bins=4)
    assert state.calibration == "budget"  # not an app family: ViewState leaves it
    clamped, _ = live.clamp(state, prepared)
    assert clamped.calibration == "none" and clamped.method_id == "sparsebert"
    assert clamped == state.with_(calibration="none")
    # ... and is then clamped, notes included, as that raw family
    assert live.clamp(state, prepared) == live.clamp(state.with_(calibration="none"), prepared)


def test_clamp_notes_say_the_range_and_the_full_graph_exactly(prepared):
    state = urlstate.ViewState(method="kmeans", layer=99, clusters=5, top_k=3, t=0.1, pages=1)
    clamped, notes = live.clamp(state, prepared)
    last = prepared.num_layers - 1
    assert clamped.clusters == 4 and clamped.top_k == 3 and clamped.layer == last
    assert notes == [
        f"layer=99 is beyond this text and model (0–{last}): showing layer {last} instead.",
        "k=3 of B=4 clusters: every query and key joins more than half of the clusters, so "
        "every pair shares one and the graph is full."]
    clamped, notes = live.clamp(state.with_(layer=0, clusters=2, top_k=5), prepared)
    assert (clamped.clusters, clamped.top_k) == (2, 2)
    assert notes == ["k=2 of B=2 clusters: every query and key joins more than half of the "
                     "clusters, so every pair shares one and the graph is full."]


def test_the_calibrated_live_path_is_the_sweeps(calibrated, record):
    """predict() builds a calibrated method with the table's own projections and settings:
    the same numbers as the sweep's scoring of that setting."""
    from sparsefinder.methods.spec import PredictorSpec
    from sparsefinder.metrics.measures import EXTRA_METRICS

    p = calibrated
    for method in ("distance", "kmeans-routed"):
        spec = PredictorSpec.of(method, {"target_sparsity": 0.8}, calibration="budget")
        model = live.summarize(live.score(p, live.predict(p, spec)), 0, 0)["model"]
        star = live.score_setting([record], p.projections_for(spec.method_id), spec,
                                  p.fitted(spec.method_id))
        assert star.recall == pytest.approx(model.recall, abs=1e-12)
        assert star.sparsity == pytest.approx(model.sparsity, abs=1e-12)
        assert star.gold_sparsity == pytest.approx(model.gold_sparsity, abs=1e-12)
        assert set(star.extra) == set(model.extra) == set(EXTRA_METRICS)
        assert star.extra == pytest.approx(model.extra, abs=1e-12)


def test_describe_calibrated_settings():
    from sparsefinder.methods.spec import PredictorSpec

    def spec(method):
        return PredictorSpec.of(method, {"target_sparsity": 0.85}, window=3,
                                calibration="budget")

    assert live.describe(spec("rowfrac")) == "nearest keys, target sparsity 0.85 ∪ window 3"
    assert live.describe(spec("distance")) == "distance, target sparsity 0.85 ∪ window 3"
    assert live.describe(spec("kmeans-routed")) == (
        "routed k-means, target sparsity 0.85 ∪ window 3")


def test_summarize_carries_every_extra_metric():
    from sparsefinder.metrics.measures import GraphScores

    values = torch.tensor([[0.2, 0.4, 0.9], [0.6, 1.0, 0.3]], dtype=torch.float64)
    scores = GraphScores(recall=values, sparsity=1 - values, precision=values / 2,
                         exact_fraction=values / 4)
    out = live.summarize(scores, 1, 2)
    assert out["head"].extra == {"precision": 0.15, "exact_fraction": 0.075}
    assert out["layer"].extra == pytest.approx({"precision": 19 / 60, "exact_fraction": 19 / 120})
    assert out["model"].extra == pytest.approx({"precision": 3.4 / 12, "exact_fraction": 3.4 / 24})
    assert out["model"].recall == pytest.approx(3.4 / 6)


def test_representative_head_matches_a_brute_force_reference():
    from sparsefinder.metrics.measures import GraphScores

    gen = torch.Generator().manual_seed(3)
    for layers, heads in ((3, 5), (4, 2), (2, 7)):
        for _ in range(5):
            recall = torch.rand(layers, heads, generator=gen, dtype=torch.float64)
            sparsity = torch.rand(layers, heads, generator=gen, dtype=torch.float64)
            pts = [(float(recall[i, j]), float(sparsity[i, j]))
                   for i in range(layers) for j in range(heads)]
            count = len(pts)
            mean = [sum(p[c] for p in pts) / count for c in (0, 1)]
            std = [(sum((p[c] - mean[c]) ** 2 for p in pts) / (count - 1)) ** 0.5 for c in (0, 1)]
            dist = [sum(((p[c] - mean[c]) / std[c]) ** 2 for c in (0, 1)) for p in pts]
            best = min(range(count), key=dist.__getitem__)
            assert live.representative_head(GraphScores(recall, sparsity)) == divmod(best, heads)


def test_softmax_layers_are_the_ones_the_scores_leave_out():
    from sparsefinder.metrics.measures import GraphScores

    values = torch.tensor([[0.2, 0.4], [0.6, 1.0], [0.3, 0.3]], dtype=torch.float64)
    scores = GraphScores(recall=values, sparsity=1 - values)
    assert live.softmax_layers(scores) == []  # no flags: every layer is counted
    scores.counted = torch.tensor([False, True, False])
    assert live.softmax_layers(scores) == [0, 2]


def test_short_text_note_says_why_a_target_is_out_of_reach():
    from sparsefinder.methods.spec import PredictorSpec

    floor = PredictorSpec.of("distance", {"target_sparsity": 0.9, "floor": 5},
                             calibration="budget")
    note = live.short_text_note(floor, 5, 0.0)  # a 3-word text: [CLS] + 3 + [SEP]
    assert note is not None
    assert "only 5 keys per row" in note and "5 nearest keys" in note and "50 keys" in note
    assert live.short_text_note(floor, 60, 0.9) is None  # 1 - 5/60 > 0.9: reachable
    plain = PredictorSpec.of("distance", {"threshold": 0.5})
    assert live.short_text_note(plain, 5, 0.0) is None  # no target, nothing to explain
    # the default's floor, capped by the row's length, takes min(12, max(1, ⌊0.1 n⌋)) keys:
    # a 40-key row keeps 4 of them (reachable 0.90), a 5-key row still one (0.80 at most)
    capped = PredictorSpec.of("distance", {"target_sparsity": 0.9, "floor": 12,
                                           "floor_share": 1.0}, calibration="budget")
    assert live.short_text_note(capped, 40, 0.9) is None
    note = live.short_text_note(capped, 5, 0.0)
    assert note is not None and "at least one key" in note and "10 keys" in note


def test_quantization_opens_at_the_beta_closest_to_the_gold_sparsity(prepared):
    """β is not fixed at 4 (sparsity 0.33 against gold 0.94 on the bundled example): clamp
    gives the β whose sparsity, on this text, is closest to the gold graphs'."""
    clamped, _ = live.clamp(urlstate.ViewState(method="quantization"), prepared)
    assert clamped.bins == prepared.bins_default is not None
    gold = float(prepared.scorer.gold_sparsity.mean())

    def gap(bins: int) -> float:
        scores = live.score(prepared, live.predict_layers(prepared, clamped.with_(bins=bins)))
        return abs(float(scores.sparsity.mean()) - gold)

    chosen = gap(clamped.bins)
    for other in (1, 4, urlstate.MAX_BINS):  # measured on every 4th token: near, not exact
        assert chosen <= gap(other) + 0.05
    # a β the link gives is kept
    assert live.clamp(urlstate.ViewState(method="quantization", bins=3), prepared)[0].bins == 3
