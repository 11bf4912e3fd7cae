"""sparsefinder.views: everything the app shows, tested without Streamlit."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from sparsefinder import views
from sparsefinder.graphs import TextInputError
from sparsefinder.metrics import recall, sparsity
from sparsefinder.projections import HeadProjections

TEXT = "The cat sat on the mat because the cat was tired, and the mat was warm."


@pytest.fixture(scope="module")
def record(default_model):
    rec, notes = views.extract_one(default_model, TEXT)
    assert notes == []
    return rec


@pytest.fixture(scope="module")
def projections(default_model, record):
    """Random (untrained) projections with centroids: enough to exercise every code path."""
    gen = torch.Generator().manual_seed(0)
    layers, heads, d, r = record.num_layers, record.num_heads, record.layers[0].queries.shape[2], 4
    weight = torch.randn(layers, heads, r, d, generator=gen) / d**0.5
    centroids = {b: torch.randn(layers, heads, b, r, generator=gen) for b in (2, 4, 8)}
    return HeadProjections(weight=weight, bias=torch.zeros(layers, heads, r),
                           model_id=default_model.model_id, alpha=1.5, centroids=centroids)


@pytest.fixture(scope="module")
def prepared(record, projections):
    return views.prepare(record, projections)


# ---------------------------------------------------------------- view state / URL


def test_view_state_round_trips_through_query_params():
    state = views.ViewState(method="distance", t=1.25, bins=6, clusters=8, top_k=2, window=5,
                            global_tokens=("last",), layer=3, head=7, query=4,
                            example="science_news")
    params = views.view_state_to_params(state)
    assert all(isinstance(v, str) for v in params.values())
    parsed, problems = views.parse_view_state(params)
    assert problems == []
    assert parsed == state


def test_bad_query_params_fall_back_to_defaults_with_a_message():
    params = {"method": "magic", "t": "-1", "beta": "x", "window": "999", "layer": "2",
              "global": "first,middle", "example": "nope", "k": ["1", "3"]}
    state, problems = views.parse_view_state(params)
    default = views.ViewState()
    assert state.method == default.method and state.t is None and state.bins == default.bins
    assert state.window == default.window and state.global_tokens == default.global_tokens
    assert state.example == default.example
    assert state.layer == 2 and state.top_k == 3  # good values kept; last of a list wins
    named = " ".join(problems)
    for key in ("method", "t=", "beta", "window", "global", "example"):
        assert key in named


def test_global_none_round_trips():
    state = views.ViewState(global_tokens=())
    assert views.view_state_to_params(state)["global"] == "none"
    assert views.parse_view_state({"global": "none"})[0].global_tokens == ()


def test_clamp_fits_state_to_text(prepared):
    state = views.ViewState(layer=99, head=99, query=999, clusters=5, top_k=8, t=None)
    clamped, notes = views.clamp(state, prepared)
    assert notes == []
    assert (clamped.layer, clamped.head) == (prepared.num_layers - 1, prepared.num_heads - 1)
    assert clamped.query == prepared.n_tokens - 1
    assert clamped.clusters in (4, 8) and clamped.top_k <= clamped.clusters
    assert clamped.t == views.default_threshold(prepared)
    assert 0 < clamped.t <= prepared.t_max


def test_without_projections_learned_methods_are_off_but_fixed_patterns_work(record):
    bare = views.prepare(record, None)
    assert bare.available_methods() == ["fixed"]
    state = views.ViewState(method="kmeans", window=3, global_tokens=())
    clamped, notes = views.clamp(state, bare)
    assert clamped.method == "kmeans" and notes and "projections" in notes[0]
    assert views.effective_method(clamped, bare) == "fixed"
    preds = views.predict_layers(bare, clamped)
    n = record.n_tokens
    band = torch.ones(n, n, dtype=torch.bool).tril(1).triu(-1)
    assert all(torch.equal(p, band.expand_as(p)) for p in preds)


# ---------------------------------------------------------------- predictions and scores


def test_nothing_switched_on_predicts_the_empty_graph(prepared):
    state = views.ViewState(method="fixed", window=0, global_tokens=())
    assert views.build_predictor(state, 0, prepared) is None
    scores = views.score(prepared, views.predict_layers(prepared, state))
    assert torch.all(scores.sparsity == 1.0)


@pytest.mark.parametrize(
    ("field", "values", "base"),
    [
        ("t", [0.0, 0.3, 0.8, 2.0], views.ViewState(method="distance", window=0,
                                                    global_tokens=())),
        ("window", [0, 1, 3, 9, 31], views.ViewState(method="fixed", global_tokens=())),
        ("top_k", [1, 2, 3, 4], views.ViewState(method="kmeans", clusters=4, window=0,
                                                global_tokens=())),
    ],
)
def test_larger_hyperparameter_never_lowers_recall(prepared, field, values, base):
    recalls, sparsities = [], []
    for value in values:
        scores = views.score(prepared, views.predict_layers(prepared, base.with_(**{field:
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
    state = views.ViewState(method="quantization", bins=4, window=0, global_tokens=("first",))
    preds = views.predict_layers(prepared, state)
    assert preds[0].dtype == torch.bool and preds[0].shape == prepared.record.layers[0].gold.shape
    assert torch.all(preds[0][:, 0, :]) and torch.all(preds[0][:, :, 0])


def test_summary_matches_metrics(prepared):
    state = views.ViewState(method="kmeans", clusters=4, top_k=1, window=3)
    preds = views.predict_layers(prepared, state)
    scores = views.score(prepared, preds)
    gold = prepared.record.layers[2].gold
    summary = views.summarize(scores, 2, 5)
    assert summary["head"].recall == pytest.approx(float(recall(preds[2], gold)[5]))
    assert summary["head"].sparsity == pytest.approx(float(sparsity(preds[2])[5]))
    assert summary["layer"].recall == pytest.approx(float(recall(preds[2], gold).mean()))
    assert summary["model"].gold_sparsity == pytest.approx(float(scores.gold_sparsity.mean()))
    frame = views.metrics_frame(scores)
    assert len(frame) == prepared.num_layers * prepared.num_heads
    row = frame[(frame["layer"] == 2) & (frame["head"] == 5)].iloc[0]
    assert row.recall == pytest.approx(summary["head"].recall)


# ---------------------------------------------------------------- diff and tables


def test_diff_codes_and_counts():
    pred = torch.tensor([[True, True], [False, False]])
    gold = torch.tensor([[True, False], [True, False]])
    codes = views.diff_codes(pred, gold)
    assert codes.tolist() == [[views.DIFF_TP, views.DIFF_FP], [views.DIFF_FN, views.DIFF_NONE]]
    assert views.diff_counts(codes) == {"TP": 1, "FN": 1, "FP": 1}
    with pytest.raises(ValueError, match="must match"):
        views.diff_codes(pred, gold[:1])


def test_edges_frame_agrees_with_the_diff(prepared):
    record = prepared.record
    pred = views.predict_layers(prepared, views.ViewState(method="fixed", window=3))[1][4]
    frame = views.edges_frame(record, 1, 4, pred)
    counts = views.diff_counts(views.diff_codes(pred, record.layers[1].gold[4]))
    assert frame["status"].value_counts().to_dict() == {k: v for k, v in counts.items() if v}
    first = frame.iloc[0]
    assert first.query_token == record.tokens[first.query]
    gold_rows = frame[frame.gold]
    assert gold_rows.gold_prob.gt(0).all() and frame[~frame.gold].gold_prob.eq(0).all()
    gold_only = views.edges_frame(record, 1, 4)
    assert set(gold_only.status) == {"gold"} and len(gold_only) == int(record.layers[1].gold[4]
                                                                       .sum())


def test_token_row_frame_and_summary(prepared):
    record = prepared.record
    preds = views.predict_layers(prepared, views.ViewState(method="fixed", window=3,
                                                           global_tokens=()))
    frame = views.token_row_frame(record, preds, 0, 3)
    assert len(frame) == record.num_heads * record.n_tokens
    summary = views.token_row_summary(frame)
    gold_row = record.layers[0].gold[:, 3, :]
    assert summary.gold_edges.tolist() == gold_row.sum(-1).tolist()
    assert summary.predicted_edges.tolist() == [3] * record.num_heads
    expected = (gold_row & preds[0][:, 3, :]).sum(-1) / gold_row.sum(-1)
    assert np.allclose(summary.recall, expected.numpy())


def test_downloads_are_valid_csv_and_json(prepared):
    state = views.ViewState(method="distance", t=0.5)
    scores = views.score(prepared, views.predict_layers(prepared, state))
    frame = pd.read_csv(__import__("io").BytesIO(views.to_csv(views.metrics_frame(scores))))
    assert list(frame.columns) == ["layer", "head", "recall", "sparsity", "gold_sparsity"]
    report = json.loads(views.to_json(views.view_report(state, scores, "m", 1.5, 17)))
    assert report["state"]["method"] == "distance"
    assert set(report["summary"]) == {"head", "layer", "model"}
    assert len(report["per_head"]) == prepared.num_layers * prepared.num_heads


# ---------------------------------------------------------------- input handling


def test_examples_and_uploads():
    names = views.list_examples()
    assert names[0] == views.DEFAULT_EXAMPLE and "long_report_512" in names
    assert views.read_example(names[0]).strip()
    with pytest.raises(TextInputError, match="unknown example"):
        views.read_example("../../etc/passwd")
    assert views.decode_upload("\ufeffhé".encode()) == "hé"
    with pytest.raises(TextInputError, match="not UTF-8"):
        views.decode_upload(b"\xff\xfe\x00bad", "x.txt")


def test_long_emoji_and_empty_text_notes(default_model):
    long_record, notes = views.extract_one(default_model, "word " * 700)
    assert long_record.n_tokens == default_model.max_length
    assert any(f"truncated to its first {default_model.max_length} tokens" in n for n in notes)
    emoji_record, notes = views.extract_one(default_model, "I love 🍕 and 🎉 so much")
    assert any("unknown to the model's vocabulary" in n and "🍕" in n for n in notes)
    assert emoji_record.n_tokens > 2
    with pytest.raises(TextInputError, match="empty"):
        views.extract_one(default_model, "   ")


def test_token_labels_are_unique(prepared):
    labels = views.token_labels(prepared.record)
    assert len(set(labels)) == len(labels)
    assert labels[2].endswith(prepared.record.tokens[2])


def test_round_up_and_distance_range(prepared):
    assert views._round_up(0.37) == 0.5 and views._round_up(3.2) == 5.0
    assert views._round_up(10.0) == 10.0
    assert prepared.t_max > 0


# ---------------------------------------------------------------- sweeps


def test_sweep_methods_depend_on_projections(projections):
    without, skipped = views.sweep_methods(None)
    assert "window" in without and "kmeans" not in without
    assert "projections" in skipped["kmeans"]
    with_proj, skipped = views.sweep_methods(projections)
    assert "distance" in with_proj
    # the grid needs B values the file does not hold
    assert "kmeans" not in with_proj and "kmeans" in skipped


def test_sweep_records_reports_progress_and_score_state(prepared, projections):
    seen = []
    frame = views.sweep_records([prepared.record], projections, ["window", "distance"],
                                on_progress=lambda f, msg: seen.append(f))
    assert set(frame.method) == {"window", "distance"}
    assert seen[0] == 0.0 and seen[-1] == 1.0
    assert 0 < frame.attrs["gold_sparsity"] < 1
    state = views.ViewState(method="distance", t=0.5, window=0, global_tokens=())
    point = views.score_state([prepared.record], projections, state)
    scores = views.score(prepared, views.predict_layers(prepared, state))
    assert point.recall == pytest.approx(float(scores.recall.mean()))
    with pytest.raises(ValueError, match="no sweep method"):
        views.sweep_records([prepared.record], None, [])


def test_describe_state(prepared):
    assert views.describe_state(views.ViewState(method="kmeans", clusters=8, top_k=2,
                                                window=3, global_tokens=("first",))) == (
        "k-means B=8 k=2 ∪ window 3 ∪ global first")
    assert views.describe_state(views.ViewState(method="fixed", window=0,
                                                global_tokens=())) == "empty graph"
    bare = views.prepare(prepared.record, None)
    assert views.describe_state(views.ViewState(method="distance", t=1.0, window=0), bare) == (
        "global first+last")


def test_fast_score_equals_metrics_score_layers(prepared):
    from sparsefinder.metrics import score_layers

    preds = views.predict_layers(prepared, views.ViewState(method="distance", t=0.6))
    fast = views.score(prepared, preds)
    slow = score_layers(preds, prepared.record.gold_masks(), causal=prepared.record.causal)
    for name in ("recall", "sparsity", "gold_sparsity"):
        assert torch.allclose(getattr(fast, name), getattr(slow, name))


def test_snap_window():
    assert [views.snap_window(w) for w in (-1, 0, 1, 2, 3, 30, 99)] == [0, 0, 1, 3, 3, 31, 31]
    assert set(views.WINDOW_CHOICES) == {0, *range(1, views.MAX_WINDOW + 1, 2)}


def test_cached_distances_give_the_distance_predictor_masks(prepared):
    from sparsefinder.predictors import Distance, GlobalTokens, Union, Window

    state = views.ViewState(method="distance", t=0.7, window=3, global_tokens=("last",))
    preds = views.predict_layers(prepared, state)
    for index, (q, k) in enumerate(prepared.projected):
        expected = Union(Distance(0.7), Window(3), GlobalTokens(first=False, last=True)).predict(
            q, k, causal=prepared.record.causal)
        assert torch.equal(preds[index], expected)


# ---------------------------------------------------------------- clusters / coreference pages


def test_head_cluster_ids_and_cluster_masks(prepared):
    from sparsefinder.clusters import head_prediction

    q_ids, k_ids = views.head_cluster_ids(prepared, 1, 3, 4, 2)
    n = prepared.n_tokens
    assert q_ids.shape == (n, 2) and k_ids.shape == (n, 2)
    gold = prepared.record.layers[1].gold[3]
    union = torch.zeros(n, n, dtype=torch.bool)
    for cluster in range(4):
        gold_c, pred_c = views.cluster_masks(q_ids, k_ids, cluster, gold)
        assert not (gold_c & ~gold).any()
        union |= pred_c
    q, k = prepared.projected[1]
    expected = head_prediction(q, k, prepared.centroids[4][1], 3, 2, prepared.record.causal)
    assert torch.equal(union, expected)  # the clusters' edges make up the k-means graph
    with pytest.raises(ValueError, match="B=5"):
        views.head_cluster_ids(prepared, 0, 0, 5, 1)


def test_kmeans_layer_mask_matches_predict_layers(prepared):
    state = views.ViewState(method="kmeans", clusters=8, top_k=2, window=0, global_tokens=())
    preds = views.predict_layers(prepared, state)
    assert torch.equal(views.kmeans_layer_mask(prepared, 2, 8, 2), preds[2])


def test_highlight_html_marks_and_escapes():
    text = "a <b> & c"
    offsets = [(0, 0), (0, 1), (2, 5), (6, 7), (8, 9), (0, 0)]
    assert (views.highlight_html(text, offsets, [2, 3])
            == "a <mark>&lt;b&gt;</mark> <mark>&amp;</mark> c")
    merged = views.highlight_html(text, [(2, 4), (4, 5)], [0, 1])
    assert merged == "a <mark>&lt;b&gt;</mark> &amp; c"
    assert views.highlight_html(text, offsets, [0, 5]) == "a &lt;b&gt; &amp; c"
    assert views.highlight_html("x\ny", [(0, 1), (2, 3)], [1]) == "x<br><mark>y</mark>"


def test_pronoun_rows_frame(record):
    from sparsefinder.coref import PairTokens

    pairs = [PairTokens(np.array([8]), np.array([7])), PairTokens(np.array([9, 10]),
                                                                  np.array([2]))]
    pred = torch.zeros(record.n_tokens, record.n_tokens, dtype=torch.bool)
    pred[8, 7] = True
    frame = views.pronoun_rows_frame(record, 0, 1, pairs, pred)
    assert len(frame) == 3 * record.n_tokens
    assert frame.groupby("query")["prob"].sum().round(4).eq(1.0).all()
    assert frame["predicted"].sum() == 1 and frame["antecedent"].sum() == 3
    gold = record.layers[0].gold[1]
    assert frame.loc[frame["query"] == 9, "gold"].tolist() == gold[9].tolist()
    assert not views.pronoun_rows_frame(record, 0, 1, pairs)["predicted"].any()


def test_parse_cluster_and_cluster_from_point():
    assert views.parse_cluster(None) is None
    assert views.parse_cluster("3") == 3 and views.parse_cluster(["1", " 2 "]) == 2
    assert views.parse_cluster("3", clusters=4) == 3
    for bad in ("4", "-1", "x", "", "inf", "nan", []):
        assert views.parse_cluster(bad, clusters=4) is None
    columns = [0, 1, 2, 3]
    assert views.cluster_from_point({"legendgroup": "2", "curve_number": 0}, columns) == 2
    assert views.cluster_from_point({"curve_number": 3, "x": "NOUN"}, columns) == 3
    assert views.cluster_from_point({"curve_number": 9}, columns) is None
    assert views.cluster_from_point({"x": "NOUN"}, columns) is None


def test_cluster_highlight_is_the_clusters_edges(prepared):
    q_ids, k_ids = views.head_cluster_ids(prepared, 1, 3, 4, 2)
    gold = prepared.record.layers[1].gold[3]
    for cluster in range(4):
        rows, edges = views.cluster_highlight(prepared, 1, 3, 4, 2, cluster)
        gold_c, pred_c = views.cluster_masks(q_ids, k_ids, cluster, gold)
        assert torch.equal(edges, pred_c)
        assert rows.shape == (prepared.record.n_tokens,) and rows.dtype == torch.bool
        assert torch.equal(rows, (q_ids == cluster).any(-1))
        assert not (edges & ~rows[:, None]).any()  # every edge starts at a cluster query
