"""Coreference page through AppTest: probe choice, head ranking, pronoun rows, k-means recall."""

from __future__ import annotations

from apptest_helpers import assert_clean, figures, metric, new_app


def _open(**params):
    at = new_app(**params).run()
    at.switch_page("app_pages/coreference.py").run()
    assert_clean(at)
    return at


def _ranking(at):
    return at.dataframe[0].value  # the ranking is the first table of the page


def test_coreference_page_renders_and_follows_the_probe(with_projections):
    at = _open(B="4")
    assert not at.error
    assert len(figures(at)) == 2  # pronoun rows, paper reference beside ours
    assert any(m.label == "Paper recall" for m in at.metric)
    first = _ranking(at)
    recall = metric(at, "Head sparsity (p01)")
    assert 0.0 <= recall <= 1.0
    options = at.selectbox(key="w_probe").options
    at.selectbox(key="w_probe").set_value(options[1]).run()
    assert_clean(at)
    second = _ranking(at)
    assert not first.equals(second)
    assert not any("(p01)" in m.label for m in at.metric)
    at.select_slider(key="w_clusters").set_value(2).run()
    assert_clean(at)


def test_ranking_over_all_probes(with_projections):
    at = _open(B="4")
    at.radio(key="w_coref_scope").set_value("all").run()
    assert_clean(at)
    ranking = _ranking(at)
    assert ranking["n_pairs"].iloc[0] > 40
    assert 0.0 <= metric(at, "Head sparsity (all probes)") <= 1.0


def test_missing_projections_is_an_info_not_an_exception(without_projections):
    at = _open()
    assert any("needs learned projections" in i.value for i in at.info)
    assert len(figures(at)) == 1  # the gold pronoun rows are still drawn
    assert len(_ranking(at)) == 10
