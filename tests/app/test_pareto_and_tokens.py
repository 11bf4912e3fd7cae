"""Pareto and Token view pages through AppTest (switching pages via st.navigation)."""

from __future__ import annotations

import base64
import json

import numpy as np
from apptest_helpers import assert_clean, figures, metric, new_app

from sparsefinder.explore.pareto import curve_label


def _values(data) -> list[float]:
    """A plotly JSON array: a list, or a typed array ``{"dtype", "bdata"}`` (base64)."""
    if isinstance(data, dict):
        return np.frombuffer(base64.b64decode(data["bdata"]), dtype=data["dtype"]).tolist()
    return list(data)


def _star(figure: dict) -> tuple[float, float]:
    (star,) = [t for t in figure["data"] if t.get("name") == "your setting"]
    return _values(star["x"])[0], _values(star["y"])[0]


def _grid_point(figure: dict, curve: str, params: dict) -> tuple[float, float]:
    (points,) = [t for t in figure["data"] if t.get("name") == f"{curve} (all)"]
    index = points["customdata"].index([json.dumps(params, sort_keys=True), curve])
    return _values(points["x"])[index], _values(points["y"])[index]


def _curves(figure: dict) -> list:
    return [(t["name"], _values(t["x"]), _values(t["y"])) for t in figure["data"]
            if t.get("name") != "your setting"]


def test_pareto_star_is_the_sweeps_point_and_moves_alone(with_projections):
    """The star (the live setting) sits exactly on the sweep's point for the same setting, on
    the text and on the validation corpus; a slider moves it and leaves the curves as they
    were (no re-sweep)."""
    at = new_app(method="distance", t="0.5", window="0", **{"global": "none"}).run()
    at.session_state["w_val_passages"] = 4
    at.switch_page("app_pages/pareto.py").run()
    assert_clean(at)
    (text_figure,) = figures(at)
    assert any("Not computed yet" in c.value for c in at.caption)
    assert _star(text_figure) == _grid_point(text_figure, "distance", {"threshold": 0.5})
    at.button(key="w_val_run").click().run()
    assert_clean(at)
    text_figure, corpus_figure = figures(at)
    assert _star(corpus_figure) == _grid_point(corpus_figure, "distance", {"threshold": 0.5})
    at.slider(key="w_t").set_value(1.0).run()
    assert_clean(at)
    moved_text, moved_corpus = figures(at)
    assert _star(moved_text) == _grid_point(moved_text, "distance", {"threshold": 1.0})
    assert _star(moved_corpus) == _grid_point(moved_corpus, "distance", {"threshold": 1.0})
    assert _star(moved_text) != _star(text_figure)
    assert _curves(moved_text) == _curves(text_figure)
    assert _curves(moved_corpus) == _curves(corpus_figure)


def test_pareto_without_projections_sweeps_window_only(without_projections):
    at = new_app().run()
    at.switch_page("app_pages/pareto.py").run()
    assert_clean(at)
    assert len(at.get("plotly_chart")) == 1
    (line,) = [c for c in at.caption if "not swept here" in c.value]
    assert "need learned projections" in line.value
    assert "`sparsefinder sweep --methods" in line.value
    assert len(line.value) < 300
    assert "needs learned projections" in line.proto.help  # each reason, on hover


def test_token_view_follows_query_and_sliders(with_projections):
    at = new_app(method="window", window="3", **{"global": "none"}).run()
    at.switch_page("app_pages/tokens.py").run()
    assert_clean(at)
    assert len(at.get("plotly_chart")) == 1
    assert metric(at, "Predicted keys per head") == 3.0  # window 3 around query 1
    at.button(key="w_qprev").click().run()  # query 0: [CLS], only 2 window keys
    assert metric(at, "Predicted keys per head") == 2.0
    assert at.query_params["query"] == "0"
    at.select_slider(key="w_window").set_value(9).run()
    assert metric(at, "Predicted keys per head") == 5.0
    before = metric(at, "Row recall (mean over heads)")
    at.selectbox(key="w_query").set_value(10).run()
    assert at.query_params["query"] == "10"
    assert metric(at, "Predicted keys per head") == 9.0
    assert 0.0 <= before <= 1.0


def test_pareto_accuracy_axis_on_this_text(with_projections):
    at = new_app(method="window", window="3", example="short_dialogue").run()
    at.switch_page("app_pages/pareto.py").run()
    at.toggle(key="w_pareto_accuracy").set_value(True).run()
    assert_clean(at)
    assert any("Not computed yet" in c.value for c in at.caption)
    at.button(key="w_accuracy_run").click().run()
    assert_clean(at)
    (accuracy,) = [f for f in figures(at) if "Sparsity–accuracy" in
                   str(f["layout"].get("title", {}).get("text", ""))]
    names = {t.get("name") for t in accuracy["data"]}
    assert {curve_label(c) for c in ("window", "distance", "longformer", "bigbird")} <= names
    full = [t for t in accuracy["data"] if t.get("marker", {}).get("symbol") == "diamond"]
    assert full and full[0]["name"] == "full α-entmax"  # the star is only ever your setting
    recall = next(f for f in figures(at) if f is not accuracy and "recall" in
                  str(f["layout"].get("title", {}).get("text", "")))
    for method in ("window", "distance", "bigbird"):  # one colour per method on both charts
        colours = {t["line"]["color"] for f in (recall, accuracy) for t in f["data"]
                   if t.get("legendgroup") == method and t.get("mode") == "lines+markers"}
        assert len(colours) == 1, (method, colours)


def test_token_view_shows_the_column_too(with_projections):
    at = new_app(method="window", window="3", query="5", **{"global": "none"}).run()
    at.switch_page("app_pages/tokens.py").run()
    at.radio(key="w_direction").set_value("column").run()
    assert_clean(at)
    (figure,) = figures(at)
    assert "queries attending to key 5" in figure["layout"]["title"]["text"]
    assert metric(at, "Predicted keys per head") == 3.0  # the window is symmetric


def test_pareto_text_sweep_has_the_calibrated_curves_and_the_default_star_on_one():
    """Bundled assets (no fixture): the text sweep includes the calibration table's curves
    (the app has no train graphs to fit them) and the first screen's method,
    distance-floor:budget at 0.90 (without window and global tokens), is a point of its
    curve."""
    at = new_app(window="0", curves="calibrated", **{"global": "none"}).run()
    at.switch_page("app_pages/pareto.py").run()
    assert_clean(at)
    (text_figure,) = figures(at)
    names = {t.get("name") for t in text_figure["data"]}
    for curve in ("distance-floor:budget", "distance:budget", "rowfrac:budget",
                  "kmeans-routed:budget", "window:budget"):
        assert f"{curve} (all)" in names
    assert not any("distance" in c.value for c in at.caption if "not swept" in c.value)
    assert _star(text_figure) == _grid_point(text_figure, "distance-floor:budget",
                                             {"target_sparsity": 0.9, "floor": 12,
                                              "floor_share": 1.0})


def test_the_accuracy_axis_draws_the_current_method_and_its_star():
    """Bundled assets: on the app's first method (distance-floor:budget), the accuracy axis
    adds that method's own calibrated curve (read from the bundled table) and marks the current
    setting with the star on both panels, at the accuracy the Explorer reports for it."""
    at = new_app(example="short_dialogue", window="0", **{"global": "none"}).run()
    at.switch_page("app_pages/pareto.py").run()
    at.toggle(key="w_pareto_accuracy").set_value(True).run()
    assert any("Distance (t) ∪ nearest keys per row" in c.value for c in at.caption
               if "Not computed yet" in c.value)
    at.button(key="w_accuracy_run").click().run()
    assert_clean(at)
    (accuracy,) = [f for f in figures(at) if "Sparsity–accuracy" in
                   str(f["layout"].get("title", {}).get("text", ""))]
    own = [t for t in accuracy["data"] if t.get("legendgroup") == "distance-floor:budget"
           and t.get("mode") == "lines+markers"]
    assert own and own[0]["name"] == curve_label("distance-floor:budget")
    stars = [t for t in accuracy["data"] if t.get("marker", {}).get("symbol") == "star"]
    assert len(stars) == 2 and all(t["name"] == "your setting" for t in stars)
    for star in stars:
        assert 0.0 < star["y"][0] <= 1.0 + 1e-9 and 0.0 < star["x"][0] < 1.0


def _drawn(figure: dict) -> list[str]:
    return [t["meta"] for t in figure["data"] if t.get("mode") == "lines+markers"]


def test_pareto_draws_the_curated_curves_and_adds_groups_from_the_link(with_projections):
    """By default at most 8 curves, the top-k oracle marked as a dashed bound; a group picked
    in the multiselect adds its curves and goes into the link, which brings them back."""
    at = new_app(method="window", window="3").run()
    at.switch_page("app_pages/pareto.py").run()
    assert_clean(at)
    (figure,) = figures(at)
    drawn = _drawn(figure)
    assert len(drawn) <= 8 and {"distance", "window", "topk"} <= set(drawn)
    (oracle,) = [t for t in figure["data"] if t.get("meta") == "topk"]
    assert oracle["name"] == "Top-k by exact scores (reference)"
    assert oracle["line"]["dash"] == "dash"
    assert figure["layout"]["legend"]["x"] > 1  # outside the plot: never over the points
    assert "curves" not in at.query_params
    at.multiselect(key="w_groups").set_value(["baselines"]).run()
    assert_clean(at)
    assert at.query_params["curves"] == "baselines"
    (wider,) = figures(at)
    assert {"reformer", "routing", "bigbird"} <= set(_drawn(wider))
    linked = new_app(method="window", window="3", curves="baselines,nope").run()
    linked.switch_page("app_pages/pareto.py").run()
    assert linked.multiselect(key="w_groups").value == ["baselines"]
    assert set(_drawn(figures(linked)[0])) == set(_drawn(wider))


def test_pareto_tables_show_a_dash_for_missing_values(with_projections):
    at = new_app(method="window", window="3").run()
    at.switch_page("app_pages/pareto.py").run()
    (table,) = [d.value for d in at.dataframe]
    cells = table.drop(columns="method").to_numpy().ravel().tolist()
    assert all(isinstance(c, str) for c in cells), cells  # no None / NaN cell
    assert "–" in cells  # some frontier never reaches 0.95 on this text
    assert "Top-k by exact scores (reference)" in table["method"].tolist()


def test_a_clicked_point_loads_into_the_view_or_says_why_not(with_projections):
    """The chart's click (its callback stores the point's curve and params) sets the sliders
    and the link to that setting; a curve the Explorer has no sliders for is said in one
    line and changes nothing."""
    at = new_app(method="window", window="3", **{"global": "none"}).run()
    at.switch_page("app_pages/pareto.py").run()
    at.session_state["_pareto_click"] = ("distance+window", {"threshold": 1.0})
    at.run()
    assert_clean(at)
    assert at.query_params["method"] == "distance" and at.query_params["t"] == "1.0"
    assert at.query_params["window"] == "3" and at.query_params["calibration"] == "none"
    assert any("Loaded from the Distance (t) + window 3 curve" in c.value for c in at.caption)
    assert at.slider(key="w_t").value == 1.0
    (figure,) = figures(at)
    assert _star(figure) == _grid_point(figure, "distance+window", {"threshold": 1.0})
    at.session_state["_pareto_click"] = ("longformer", {"n_global": 4})
    at.run()  # a baseline opens too: its generated slider and link key
    assert_clean(at)
    assert at.query_params["method"] == "longformer" and at.query_params["n_global"] == "4"
    at.session_state["_pareto_click"] = ("window", {"window": 101})
    at.run()
    (line,) = [c.value for c in at.caption if "not in the Explorer" in c.value]
    assert "window goes up to 31" in line
    assert at.query_params["method"] == "longformer"
    at.session_state["_pareto_click"] = ("distance", {"threshold": 1.5})
    at.run()
    at.button(key="w_pareto_open").click().run()
    assert_clean(at)
    assert "Explorer" in [t.value for t in at.title]
    assert at.query_params["t"] == "1.5" and at.query_params["window"] == "0"


def _head_view_data(at) -> dict:
    (view,) = at.get("bidi_component")
    return json.loads(view.proto.json)


def test_the_head_view_draws_the_selected_token_and_follows_the_page(with_projections):
    """The head view gets the page's token as its selection (drawn and highlighted on load,
    in the browser): a query on the left for the row, the key on the right for the column;
    another token picked on the page moves it. (Its clicks: tests/app/test_browser.py.)"""
    at = new_app(method="window", window="3", query="5", **{"global": "none"}).run()
    at.switch_page("app_pages/tokens.py").run()
    assert_clean(at)
    data = _head_view_data(at)
    assert data["selected"] == {"side": "query", "index": 5 - data["start"]}
    assert at.selectbox(key="w_query").format_func(5).endswith(data["tokens"][5 - data["start"]])
    at.selectbox(key="w_query").set_value(12).run()
    data = _head_view_data(at)
    assert data["selected"] == {"side": "query", "index": 12 - data["start"]}
    at.radio(key="w_direction").set_value("column").run()
    assert _head_view_data(at)["selected"]["side"] == "key"
