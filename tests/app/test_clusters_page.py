"""Clusters page through AppTest: POS × cluster bars, cluster tokens, highlight, per-tag recall."""

from __future__ import annotations

from apptest_helpers import assert_clean, assert_head_graphs, figures, new_app


def _breakdown(at) -> dict:
    charts = [f for f in figures(at) if f["layout"].get("barmode") == "stack"]
    assert charts, "no stacked POS × cluster chart"
    return charts[0]


def _open(**params):
    at = new_app(**params).run()
    at.switch_page("app_pages/clusters.py").run()
    assert_clean(at)
    return at


def test_clusters_page_renders_and_follows_b_and_side(with_projections):
    at = _open(B="4", k="1", layer="1", head="2")
    assert not at.error
    before = _breakdown(at)
    assert len([t for t in before["data"] if t["type"] == "bar"]) == 4  # one trace a cluster
    assert len(figures(at)) == 3  # breakdown, cluster edges, per-tag recall
    assert any("<mark>" in m.value for m in at.markdown)
    assert len(at.dataframe) >= 2
    at.select_slider(key="w_clusters").set_value(8).run()
    assert_clean(at)
    assert len([t for t in _breakdown(at)["data"] if t["type"] == "bar"]) == 8
    assert at.query_params["B"] == "8"
    queries = _breakdown(at)
    at.radio(key="w_cl_side").set_value("keys").run()
    assert_clean(at)
    keys = _breakdown(at)
    assert "keys" in keys["layout"]["title"]["text"]
    assert keys["data"] != queries["data"]


def test_selecting_a_cluster_changes_the_highlight(with_projections):
    at = _open(B="4", k="1")
    options = at.selectbox(key="w_cl_cluster").options
    marks = []
    for option in range(len(options)):
        at.selectbox(key="w_cl_cluster").set_value(option).run()
        assert_clean(at)
        marks.append(next(m.value for m in at.markdown if "border-radius" in m.value))
    assert len(set(marks)) > 1


def test_validation_corpus_on_request(with_projections):
    at = _open(B="4")
    at.radio(key="w_cl_corpus").set_value("validation").run()
    assert_clean(at)
    assert any("not computed yet" in c.value for c in at.caption)
    at.number_input(key="w_cl_passages").set_value(4).run()
    at.button(key="w_cl_run").click().run()
    assert_clean(at)
    assert any("validation texts" in c.value for c in at.caption)
    assert "validation" in _breakdown(at)["layout"]["title"]["text"]


def test_missing_projections_is_an_info_not_an_exception(without_projections):
    at = _open()
    assert any("needs learned projections" in i.value for i in at.info)
    assert not at.get("plotly_chart")


def test_selected_cluster_is_shared_and_highlighted_in_the_explorer(with_projections):
    at = _open(method="kmeans", B="4", k="1", window="0", **{"global": "none"})
    other = (at.selectbox(key="w_cl_cluster").value + 1) % 4
    at.selectbox(key="w_cl_cluster").set_value(other).run()
    assert_clean(at)
    assert at.session_state["_cluster"] == other
    assert at.query_params["cluster"] == str(other)
    at.switch_page("app_pages/explorer.py").run()
    assert_clean(at)
    assert any(f"highlighting cluster {other}" in c.value for c in at.caption)
    figure = assert_head_graphs(at)
    assert sum(t.get("name") == f"cluster {other}" for t in figure["data"]) == 6
    at.button(key="w_clear_cluster").click().run()
    assert_clean(at)
    assert not any("highlighting cluster" in c.value for c in at.caption)
    assert at.session_state["_cluster"] is None
    assert "cluster" not in at.query_params


def test_cluster_from_the_url_outside_kmeans_is_a_caption(with_projections):
    at = new_app(method="window", cluster="1").run()
    at.switch_page("app_pages/explorer.py").run()
    assert_clean(at)
    assert any("choose the k-means" in c.value for c in at.caption)
    assert not any(t.get("name") == "cluster 1" for t in assert_head_graphs(at)["data"])


def _pick_and_show(at, cluster: int):
    at.switch_page("app_pages/clusters.py").run()
    box = at.selectbox(key="w_cl_cluster")
    if box.value == cluster:  # the cluster the page opened on: a pick is a change
        box.set_value((cluster + 1) % len(box.options)).run()
    at.selectbox(key="w_cl_cluster").set_value(cluster).run()
    at.switch_page("app_pages/explorer.py").run()
    assert_clean(at)
    assert any(f"highlighting cluster {cluster}" in c.value for c in at.caption)


def _assert_cleared(at, cluster: int):
    assert_clean(at)
    assert not any("highlighting cluster" in c.value for c in at.caption)
    assert at.session_state["_cluster"] is None and "cluster" not in at.query_params
    figure = assert_head_graphs(at)
    assert not any(t.get("name") == f"cluster {cluster}" for t in figure["data"])


def test_the_picked_cluster_is_cleared_when_the_head_layer_or_text_changes(with_projections):
    at = new_app(method="kmeans", B="4", k="1", layer="1", head="2").run()
    _pick_and_show(at, 3)
    at.selectbox(key="w_head").set_value(3).run()
    _assert_cleared(at, 3)
    _pick_and_show(at, 1)
    at.selectbox(key="w_layer").set_value(0).run()
    _assert_cleared(at, 1)
    _pick_and_show(at, 2)
    other = next(e for e in at.selectbox(key="w_example").options
                 if e != at.selectbox(key="w_example").value)
    at.selectbox(key="w_example").set_value(other).run()
    _assert_cleared(at, 2)


def test_the_clusters_page_opens_on_a_cluster_with_keys(with_projections):
    at = _open(B="8", k="1", layer="0", head="0")
    chosen = at.selectbox(key="w_cl_cluster").value
    at.radio(key="w_cl_side").set_value("keys").run()  # the key groups of this head
    members = next(d.value for d in at.dataframe if "members" in d.value.columns)
    assert chosen in members["cluster"].tolist()  # the cluster holds keys
    assert at.selectbox(key="w_cl_cluster").value == chosen
