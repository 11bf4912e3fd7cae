"""Learned space page through AppTest, on the bundled default text and projections."""

from __future__ import annotations

import pytest
from apptest_helpers import assert_clean, figures, metric, new_app

PAGE = "app_pages/learned_space.py"


def _open(**params):
    at = new_app(**params).run()
    at.switch_page(PAGE).run()
    assert_clean(at)
    return at


def _traces(figure: dict, prefix: str) -> list[dict]:
    return [t for t in figure["data"] if str(t.get("name", "")).startswith(prefix)]


def _count(figure: dict, prefix: str) -> int:
    return sum(len(t["x"]) for t in _traces(figure, prefix))


def test_default_setting_draws_the_space_the_row_and_the_threshold():
    at = _open(layer="2", head="3", query="5")
    assert not at.error
    assert at.title[0].value == "Learned space"
    space, row = figures(at)
    gold = metric(at, "Gold keys of the row")
    missed = metric(at, "Missed gold keys")
    # the markers are the metrics' keys: every gold key once, missed ones in red
    assert _count(space, "TP") + _count(space, "FN") == gold
    assert _count(space, "FN") == missed == _count(row, "FN")
    n_keys = sum(len(t["x"]) for t in space["data"]
                 if t.get("customdata") and t["customdata"][0][0] == "k")
    assert n_keys == len(at.selectbox(key="w_query").options)
    # the calibrated distance draws its threshold, a line on the row; the bundled projections
    # decide off the PCA plane (every key inside its circle), so the left chart opens around
    # the query, where the circle of radius t is the decision itself
    assert any(a["text"].startswith("t = ") for a in row["layout"]["annotations"])
    assert any(m.value.startswith("**Around the query**") for m in at.markdown)
    assert _traces(space, "t = ") and "exact" in space["layout"]["xaxis"]["title"]["text"]
    at.button_group(key="w_ls_view").set_value("plane").run()  # the PCA plane on request
    assert_clean(at)
    space, _ = figures(at)
    assert any(s["type"] == "circle" for s in space["layout"]["shapes"])
    assert "PC 1" in space["layout"]["xaxis"]["title"]["text"]  # r > 2: PCA
    assert any("PCA of this head's keys" in m.value for m in at.markdown)


@pytest.mark.parametrize(("method", "drawn"), [("kmeans", "the query's clusters"),
                                               ("quantization", None)])
def test_kmeans_and_quantization_draw_their_decision(method, drawn):
    at = _open(method=method, layer="1", head="0", query="4")
    charts = figures(at)
    if method == "kmeans":
        assert len(charts) == 2
        assert _traces(charts[0], drawn)
    else:
        assert len(charts) == 3  # space, row, and the bins per dimension
        bands = charts[2]
        assert len(bands["layout"]["yaxis"]["tickvals"]) == 4  # r = 4 strips
        assert bands["layout"]["shapes"]  # the query's bin intervals
    assert not any(a["text"].startswith("t = ") for a in charts[1]["layout"]["annotations"])


def test_the_query_picker_is_the_shared_selection():
    at = _open(layer="0", head="1", query="3")
    at.selectbox(key="w_query").set_value(7).run()
    assert_clean(at)
    assert at.query_params["query"] == "7"
    space = figures(at)[0]
    assert _traces(space, "selected query")[0]["customdata"] == [["q", 7]]
    at.switch_page("app_pages/explorer.py").run()
    assert_clean(at)
    assert at.query_params["query"] == "7" and at.query_params["head"] == "1"


def test_without_projections_the_page_says_why(without_projections):
    at = _open(method="window")
    assert not figures(at)
    assert any("needs learned projections" in i.value for i in at.info)


def test_a_pair_picked_here_is_ringed_in_the_explorer():
    at = _open(layer="0", head="1", query="3")
    at.session_state["_pair"] = (0, 1, 3, 6)  # what a click on key 6 stores
    at.run()
    assert any("Picked pair" in m.value for m in at.markdown)
    at.switch_page("app_pages/explorer.py").run()
    assert_clean(at)
    head = next(f for f in figures(at) if any(t.get("name") == "picked pair" for t in f["data"]))
    rings = [t for t in head["data"] if t.get("name") == "picked pair"]
    assert len(rings) == 3 and all(t["x"] == [6] and t["y"] == [3] for t in rings)
    assert any("picked on Learned space" in c.value for c in at.caption)
    at.selectbox(key="w_head").set_value(2).run()  # another head: no ring
    assert not any(t.get("name") == "picked pair" for f in figures(at) for t in f["data"])
