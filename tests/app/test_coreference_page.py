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
    at.select_slider(key="w_coref_B").set_value(2).run()
    assert_clean(at)
    assert at.query_params.get("B") != "2"  # the page's own B, not the Explorer's


def test_opens_on_the_demo_setting_and_keeps_the_explorers_alone(with_projections):
    at = _open(B="4", k="1")
    assert at.select_slider(key="w_coref_B").value == 8  # nearest to 12 these projections hold
    assert at.slider(key="w_coref_k").value == 2
    assert at.query_params["B"] == "4" and at.query_params["k"] == "1"


def test_coreference_on_the_text_in_the_sidebar(with_projections):
    at = new_app(method="fixed").run()
    at.radio(key="w_source").set_value("paste").run()
    text = "The pilots thanked the mechanic because he had fixed their engine overnight."
    at.text_area(key="w_paste").input(text).run()
    at.switch_page("app_pages/coreference.py").run()
    at.radio(key="w_coref_source").set_value("own").run()
    assert_clean(at)
    chosen = at.multiselect(key="w_coref_pairs").value
    he, their = text.index(" he ") + 1, text.index("their")
    assert chosen == [f"he@{he} → mechanic@23", f"their@{their} → pilots@4"]
    ranking = _ranking(at)
    assert ranking["n_pairs"].iloc[0] == len(chosen)
    assert 0.0 <= metric(at, "Head sparsity (your text)") <= 1.0
    at.multiselect(key="w_coref_pairs").set_value([]).run()
    assert any("No pair chosen" in i.value for i in at.info)
    at.selectbox(key="w_coref_pronoun").set_value(6).run()  # "he"
    at.selectbox(key="w_coref_antecedent").set_value(1).run()  # "pilots"
    at.button(key="w_coref_add").click().run()
    assert_clean(at)
    assert _ranking(at)["n_pairs"].iloc[0] == 1


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


def test_bundled_stories_with_two_candidates_per_pronoun(with_projections):
    """Regression: spaCy proposes two antecedents per pronoun and the page pre-selects them,
    which crashed the pronoun figure (a reshape into one row per pair). Each pronoun token is
    now one row, with all its candidates outlined."""
    for example in ("short_dialogue", "coreference_story"):
        at = new_app(method="fixed", example=example).run()
        at.switch_page("app_pages/coreference.py").run()
        at.radio(key="w_coref_source").set_value("own").run()
        assert_clean(at)
        chosen = at.multiselect(key="w_coref_pairs").value
        pronouns = [label.split(" → ")[0] for label in chosen]
        assert len(set(pronouns)) < len(pronouns)  # some pronoun has 2+ antecedents
        rows = figures(at)[0]
        assert len(rows["data"][0]["y"]) == len(set(pronouns))  # one-piece pronouns here
        outlined = len(rows["data"][2]["x"])
        assert outlined >= len(chosen)  # every chosen antecedent (all its pieces) outlined
