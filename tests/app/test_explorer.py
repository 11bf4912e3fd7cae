"""Explorer page through AppTest: first screen, live sliders, head navigation, URL state."""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest
from apptest_helpers import (
    assert_clean,
    assert_head_graphs,
    figures,
    gold_sparsity,
    metric,
    new_app,
)


def test_first_screen_shows_graphs_and_metrics(with_projections):
    at = new_app().run()
    assert_clean(at)
    assert not at.error
    figure = assert_head_graphs(at)
    assert figure["layout"]["xaxis"]["tickmode"] == "array"  # integer axes, token tick text
    assert all(isinstance(v, int) for v in figure["layout"]["xaxis"]["tickvals"])
    assert any(t["type"] == "scattergl" for t in figure["data"])  # hover overlay (short text)
    assert len(figures(at)) == 2  # + the layer × head overview grid
    for scope in ("Head", "Layer", "Model"):
        for what in ("recall", "sparsity"):
            assert 0.0 <= metric(at, f"{scope} {what}") <= 1.0
        assert 0.0 <= gold_sparsity(at, scope) <= 1.0  # under the sparsity, as its delta
    assert any("Device:" in c.value and "adapter: entmax-1.5 adapter" in c.value
               for c in at.sidebar.caption)  # which weights run: the entmax-adapted ones
    assert at.query_params["example"] == "short_dialogue"


def _model_scores(at) -> tuple[float, float]:
    return metric(at, "Model recall"), metric(at, "Model sparsity")


def _sweep_slider(at, kind: str, key: str, values) -> list[tuple[float, float]]:
    """Set a slider to each value (a fragment rerun each time) and read model-level scores."""
    out = []
    for value in values:
        getattr(at, kind)(key=key).set_value(value).run()
        assert_clean(at)
        out.append(_model_scores(at))
    return out


def _assert_monotone(scores: list[tuple[float, float]]) -> None:
    """Recall never drops and sparsity never rises along the sweep, and something moved."""
    recalls = [r for r, _ in scores]
    sparsities = [s for _, s in scores]
    assert recalls == sorted(recalls), recalls
    assert sparsities == sorted(sparsities, reverse=True), sparsities
    assert recalls[-1] > recalls[0] and sparsities[-1] < sparsities[0]


# Window/global off (URL) so that each learned method is seen alone. Sidebar widgets can
# only be driven on AppTest's first run with st.navigation, so each method gets its own app.
ALONE = {"window": "0", "global": "none"}


def test_larger_t_never_lowers_recall(with_projections):
    at = new_app(method="distance", **ALONE).run()
    assert_clean(at)
    top = at.slider(key="w_t").max
    _assert_monotone(_sweep_slider(at, "slider", "w_t", [0.0, top * 0.1, top * 0.3, top]))


def test_larger_k_never_lowers_recall(with_projections):
    at = new_app(method="kmeans", B="8", **ALONE).run()
    scores = _sweep_slider(at, "slider", "w_top_k", [1, 2, 4, 8])
    _assert_monotone(scores)
    assert scores[-1] == (1.0, 0.0)  # k = B: every query and key shares every cluster


def test_larger_window_never_lowers_recall(with_projections):
    at = new_app(method="window", **ALONE).run()
    assert _model_scores(at) == (0.0, 1.0)  # nothing switched on: the empty graph
    _assert_monotone(_sweep_slider(at, "select_slider", "w_window", [1, 3, 9, 31]))


def test_global_tokens_add_edges(with_projections):
    at = new_app(method="window", **ALONE).run()
    at.checkbox(key="w_global_first").check().run()
    recall_first, sparsity_first = _model_scores(at)
    assert recall_first > 0.0 and sparsity_first < 1.0
    at.checkbox(key="w_global_last").check().run()
    recall_both, sparsity_both = _model_scores(at)
    assert recall_both >= recall_first and sparsity_both < sparsity_first


def test_method_select_in_sidebar_switches_sliders(with_projections):
    """The menu lists families; calibration is a control of the family, not a menu entry."""
    at = new_app(method="distance", calibration="budget").run()
    assert at.sidebar.selectbox(key="w_method").value == "distance"
    assert at.sidebar.radio(key="w_calibration").value == "budget"
    assert at.select_slider(key="w_target").value == 0.9
    assert (at.query_params["method"], at.query_params["calibration"]) == ("distance", "budget")
    at.sidebar.radio(key="w_calibration").set_value("none").run()
    assert_clean(at)
    assert at.slider(key="w_t").value > 0
    assert (at.query_params["method"], at.query_params["calibration"]) == ("distance", "none")
    at.sidebar.selectbox(key="w_method").set_value("quantization").run()
    assert_clean(at)
    # β opens where its sparsity is nearest the gold graphs' (a move either way is farther)
    opened = at.slider(key="w_bins").value
    gold = gold_sparsity(at, "Model")
    gaps = {}
    for bins in (opened - 1, opened + 1, opened):
        if 1 <= bins <= 16:
            at.slider(key="w_bins").set_value(bins).run()
            gaps[bins] = abs(metric(at, "Model sparsity") - gold)
    assert gaps[opened] <= min(gaps.values()) + 0.02  # chosen on a subsample of the tokens
    assert gaps[opened] < 0.3  # not the near-full graph β = 4 drew
    assert "w_calibration" not in [r.key for r in at.sidebar.radio]
    assert at.query_params["calibration"] == "none"
    at.sidebar.selectbox(key="w_method").set_value("rowfrac").run()
    assert_clean(at)  # a family opens with its own default calibration
    assert at.select_slider(key="w_target").value == 0.9
    assert at.query_params["calibration"] == "budget"
    at.sidebar.selectbox(key="w_method").set_value("kmeans-routed").run()
    assert_clean(at)  # routed k-means comes calibrated only: a caption says so
    assert any("Calibration: per head" in c.value for c in at.sidebar.caption)


def test_larger_hamming_distance_never_lowers_recall(with_projections):
    """HashAttention from the bundled codes (learned on TRAIN graphs of the default model):
    a larger Hamming radius keeps a superset of keys; the whole radius keeps every key."""
    at = new_app(method="hashattention", hd="0", **ALONE).run()
    assert_clean(at)
    assert at.query_params["method"] == "hashattention"
    scores = _sweep_slider(at, "slider", "w_hamming", [0, 2, 5, 16])
    _assert_monotone(scores)
    assert scores[-1] == (1.0, 0.0)
    assert at.query_params["hd"] == "16"


def test_quantization_slider_changes_scores(with_projections):
    at = new_app(method="quantization", window="0", **{"global": "none"}).run()
    before = _model_scores(at)
    at.slider(key="w_bins").set_value(1).run()
    after = _model_scores(at)
    assert after == (1.0, 0.0)  # one bin: every pair shares it
    assert before != after


def test_head_navigation_and_url_state(with_projections):
    at = new_app(layer="2", head="11", method="distance", t="0.3", window="5").run()
    assert_clean(at)
    assert (at.selectbox(key="w_layer").value, at.selectbox(key="w_head").value) == (2, 11)
    assert at.slider(key="w_t").value == 0.3 and at.select_slider(key="w_window").value == 5
    at.button(key="w_next").click().run()  # wraps into the next layer
    assert (at.selectbox(key="w_layer").value, at.selectbox(key="w_head").value) == (3, 0)
    assert at.query_params["layer"] == "3" and at.query_params["head"] == "0"
    at.button(key="w_prev").click().run()
    assert at.query_params["head"] == "11"
    layer_recall = metric(at, "Layer recall")
    at.selectbox(key="w_head").set_value(0).run()
    assert at.query_params["head"] == "0"
    assert metric(at, "Layer recall") == layer_recall  # a head switch changes no prediction
    # the numbers shown are the library's for the same setting (layer 2, head 0)
    expected = _library_scores(with_projections, "distance", t=0.3, window=5)
    assert metric(at, "Head recall") == round(float(expected.recall[2, 0]), 3)
    assert metric(at, "Head sparsity") == round(float(expected.sparsity[2, 0]), 3)
    assert metric(at, "Layer recall") == round(float(expected.recall[2].mean()), 3)


def test_extra_metrics_read_out_and_overview_colour(with_projections):
    """Precision, exact rows, mass recall and block recall (issue 10) are read out per scope
    and colour the overview grid, with the library's numbers for the same setting."""
    at = new_app(layer="2", head="0", method="distance", t="0.3", window="5",
                 overview="exact_fraction").run()
    assert_clean(at)
    assert at.radio(key="w_colour_by").value == "exact_fraction"
    expected = _library_scores(with_projections, "distance", t=0.3, window=5)
    read_outs = [c.value for c in at.caption if c.value.startswith("precision ")]
    assert len(read_outs) == 3  # head, layer, model
    head, layer, _ = read_outs
    assert f"exact rows {float(expected.exact_fraction[2, 0]):.3f}" in head
    assert f"mass recall {float(expected.mass_recall[2, 0]):.3f}" in head
    assert f"block recall 16 {float(expected.block_recall16[2].mean()):.3f}" in layer
    (grid,) = [f for f in figures(at) if f["data"][0].get("marker", {}).get("colorbar")]
    assert grid["data"][0]["marker"]["colorbar"]["title"]["text"] == "exact rows"  # in words
    colours = grid["data"][0]["marker"]["color"]
    if isinstance(colours, dict):  # plotly's typed-array encoding
        colours = np.frombuffer(base64.b64decode(colours["bdata"]), colours["dtype"]).tolist()
    assert colours == pytest.approx(expected.exact_fraction.flatten().tolist())
    at.radio(key="w_colour_by").set_value("precision").run()
    assert at.query_params["overview"] == "precision"


def test_bad_url_parameters_are_reported_not_raised(with_projections):
    at = new_app(method="magic", layer="99", window="-4").run()
    assert_clean(at)
    warnings = " ".join(w.value for w in at.warning)
    assert "method='magic'" in warnings and "window='-4'" in warnings
    assert at.selectbox(key="w_layer").value == 5  # clamped to the last layer


def _library_scores(projections_file, method: str, **values):
    """Scores of the default example computed with the library alone (no app)."""
    from sparsefinder.explore import inputs, live
    from sparsefinder.explore import prepared as prep
    from sparsefinder.explore.state import ViewState
    from sparsefinder.models.loading import load_model
    from sparsefinder.projections.heads import HeadProjections

    loaded = load_model("default")
    record, _ = inputs.extract_one(loaded, inputs.read_example(inputs.DEFAULT_EXAMPLE))
    prepared = prep.prepare(record, HeadProjections.load(projections_file))
    state = ViewState(method=method, **{"calibration": "none", **values})
    return live.score(prepared, live.predict_layers(prepared, state))


def test_model_view_compare_and_token_range(with_projections):
    at = new_app(method="window", window="3", example="long_report_512", overview="sparsity",
                 layer="1", head="2").run()
    assert_clean(at)
    assert at.radio(key="w_colour_by").value == "sparsity"
    at.toggle(key="w_model_view_on").set_value(True).run()
    assert_clean(at)
    mosaics = [f for f in figures(at) if f["data"] and f["data"][0].get("type") == "image"
               and len(f["data"]) == 2 and len(f["data"][1]["x"]) == 72]
    assert len(mosaics) == 1 and "sparsity" in mosaics[0]["data"][1]["text"][0]
    at.selectbox(key="w_compare").set_value((4, 5)).run()
    titles = [a["text"] for f in figures(at) for a in f["layout"].get("annotations", [])]
    assert any("L1H2" in t for t in titles) and any("L4H5" in t for t in titles)
    at.slider(key="w_token_range").set_value((10, 40)).run()
    assert_clean(at)
    head = assert_head_graphs(at)
    assert any("tokens 10–39" in a["text"] for a in head["layout"]["annotations"])
    ticks = head["layout"]["xaxis"]["ticktext"]
    assert len(ticks) == 30  # every token of the window is labelled
    (gold_hover,) = [t for t in head["data"] if t.get("name") == "gold"]
    probability = re.compile(r" p=[01]\.\d{3}$")
    assert gold_hover["text"] and all(probability.search(t) for t in gold_hover["text"])
    assert gold_hover["text"][0].startswith("q1")  # absolute positions inside the window
    at.radio(key="w_colour_by").set_value("recall").run()
    assert at.query_params["overview"] == "recall"


def test_output_accuracy_of_the_setting(with_projections):
    at = new_app(method="window", window="0", **{"global": "none"}).run()
    at.toggle(key="w_accuracy_on").set_value(True).run()
    assert_clean(at)
    # nothing switched on: every row is repaired to its diagonal, the output moves a lot
    empty = metric(at, "Output cosine")
    assert metric(at, "Rows repaired") == 1.0
    assert any("Accuracy of this setting" in c.value for c in at.caption)
    at.select_slider(key="w_window").set_value(31).run()
    wide = metric(at, "Output cosine")
    assert metric(at, "Rows repaired") == 0.0 and wide > empty
    assert -1.0 <= empty <= 1.0 and wide <= 1.0
    at.button(key="w_task_run").click().run()
    assert_clean(at)
    assert 0.0 <= metric(at, "Retrieval top-1 agreement") <= 1.0
    assert any("Task measure on" in c.value for c in at.caption)


def test_first_screen_is_the_best_method_at_its_calibrated_setting():
    """With the bundled projections and calibration (no fixture), the Explorer opens on the
    calibrated distance with each row's nearest keys, capped by length (the default method)
    at target sparsity 0.90, read with the calibration table's own (r = 8 lowrank-mass)
    projections; the target slider moves
    sparsity."""
    from sparsefinder.explore.app_methods import FLOORED

    at = new_app().run()
    assert_clean(at)
    assert at.selectbox(key="w_method").value == FLOORED
    assert (at.query_params["method"], at.query_params["floor"]) == ("distance", "12")
    assert at.select_slider(key="w_target").value == 0.9
    assert not at.warning  # nothing switched off
    sparse = metric(at, "Model sparsity")
    recall = metric(at, "Model recall")
    assert sparse >= 0.85
    at.select_slider(key="w_target").set_value(0.75).run()
    assert at.query_params["target"] == "0.75"
    assert metric(at, "Model sparsity") < sparse and metric(at, "Model recall") > recall


def test_the_menu_tells_the_floored_default_from_plain_distance():
    """The default (distance:budget with each row's 12 nearest keys) and plain distance:budget
    are two menu entries; the link says which by ``floor``, and an old link naming the
    floored family of the time before opens the default with one old-name note."""
    from sparsefinder.explore.app_methods import FLOORED, menu_label

    at = new_app().run()
    menu = at.selectbox(key="w_method")
    assert menu.options[:2] == [menu_label(FLOORED), menu_label("distance")]
    assert menu_label(FLOORED) == ("Sparsefinder · Distance (t) ∪ nearest keys per row "
                                   "(floor m)")
    floored = metric(at, "Model sparsity")
    menu.set_value("distance").run()
    assert_clean(at)
    assert at.query_params["method"] == "distance" and "floor" not in at.query_params
    assert at.query_params["calibration"] == "budget"
    at.selectbox(key="w_method").set_value(FLOORED).run()
    assert at.query_params["floor"] == "12" and metric(at, "Model sparsity") == floored
    old = new_app(method="distance-floor", calibration="budget").run()
    assert old.selectbox(key="w_method").value == FLOORED
    assert metric(old, "Model sparsity") == floored
    (note,) = [w.value for w in old.warning if "This link had" in w.value]
    assert "method='distance-floor' is an old name" in note and "floor=12" in note
    assert (old.query_params["method"], old.query_params["floor"]) == ("distance", "12")


def test_output_accuracy_of_the_calibrated_default():
    """The first screen's method (distance:budget with its floor, from the bundled table and its own
    projections) runs in the restricted forward too: the table's predictors, not a refit."""
    at = new_app().run()
    at.toggle(key="w_accuracy_on").set_value(True).run()
    assert_clean(at)
    assert 0.0 < metric(at, "Output cosine") <= 1.0
    assert 0.85 <= metric(at, "Sparsity run") <= 0.95  # the 0.90 target ∪ window ∪ global


@pytest.mark.parametrize("family", ["longformer", "bigbird", "reformer", "routing", "topk",
                                    "topp", "block", "rowfrac"])
def test_every_menu_family_opens_with_sliders_from_its_declared_parameters(with_projections,
                                                                           family):
    """Baselines and oracles open in the Explorer; their sliders come from the family's
    declared parameters (range, label) and their values are in the link."""
    from sparsefinder.explore import app_methods

    at = new_app(method=family, calibration="none").run()
    assert_clean(at)
    assert at.sidebar.selectbox(key="w_method").value == family
    params = app_methods.generic_params(family)
    assert params
    for param in params:
        slider = at.slider(key=f"w_x_{family}_{param.name}")
        assert slider.label.lower() == param.label.lower() and slider.value == param.default
        assert at.query_params[param.url] == str(param.default)
    first = params[0]
    moved = first.default + 1 if first.kind is int else round(first.default / 2, 6)
    at.slider(key=f"w_x_{family}_{first.name}").set_value(moved).run()
    assert_clean(at)
    assert float(at.query_params[first.url]) == pytest.approx(moved)
    reopened = new_app(**{k: v[0] if isinstance(v, list) else v
                          for k, v in at.query_params.items()}).run()
    assert reopened.slider(key=f"w_x_{family}_{first.name}").value == pytest.approx(moved)


def test_the_first_screen_opens_on_a_representative_head():
    """No head in the link: the head nearest the model's recall and sparsity (not L0H0, the
    weakest); a link that names a head keeps it."""
    from sparsefinder.explore import live

    at = new_app().run()
    assert_clean(at)
    scores = at.session_state["_predictions"][-1]  # (prepared, spec, masks, scores)
    layer, head = live.representative_head(scores)
    assert (at.query_params["layer"], at.query_params["head"]) == (str(layer), str(head))
    assert (layer, head) != (0, 0)
    linked = new_app(layer="0", head="0").run()
    assert (linked.query_params["layer"], linked.query_params["head"]) == ("0", "0")
