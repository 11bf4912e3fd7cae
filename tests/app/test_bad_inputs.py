"""Bad input shows a clear message in the page, never a traceback, and keeps what was typed.

Sidebar widgets are pre-set through session state before the first run (AppTest only sees
the sidebar on the first run of an st.navigation app).
"""

from __future__ import annotations

from apptest_helpers import assert_clean, assert_head_graphs, new_app


def _pasted(text: str):
    at = new_app()
    at.session_state["w_source"] = "paste"
    at.session_state["w_paste"] = text
    return at.run()


def _messages(at) -> str:
    return " ".join(e.value for e in [*at.error, *at.warning, *at.info])


def test_empty_text_is_an_error_and_the_text_box_keeps_its_content(without_projections):
    at = _pasted("   \n ")
    assert_clean(at)
    assert any("empty" in e.value for e in at.error)
    assert not at.get("plotly_chart")
    assert at.session_state["w_paste"] == "   \n "
    at.switch_page("app_pages/pareto.py").run()  # other pages say so too, no exception
    assert_clean(at)
    assert any("empty" in e.value for e in at.error)


def test_very_long_text_is_shown_part_by_part(without_projections):
    """Nothing is cut off: a text longer than the model reads is split into overlapping
    model-sized parts; one sentence says so, the sidebar picks the part, the link keeps it."""
    at = _pasted("lorem ipsum dolor " * 400)
    assert_clean(at)
    (sentence,) = [w.value for w in at.warning if "parts that overlap" in w.value]
    assert "the model reads 512 at a time" in sentence and "part 1 of" in sentence
    assert not any("truncated" in w.value for w in at.warning)
    assert_head_graphs(at)
    picker = at.sidebar.selectbox(key="w_part")
    assert len(picker.options) >= 2
    picker.set_value(1).run()
    assert_clean(at)
    assert at.query_params["part"] == "1"
    assert any("part 2 of" in w.value for w in at.warning)
    assert_head_graphs(at)


def test_emoji_and_non_english_text_warn_about_unknown_tokens(without_projections):
    at = _pasted("Zürich était magnifique 🎉🍕 — Привет, 東京! Dzięki 😀")
    assert_clean(at)
    assert any("unknown to the model's vocabulary" in w.value for w in at.warning)
    assert_head_graphs(at)


def test_unknown_model_is_an_error_and_the_app_keeps_working(without_projections):
    at = new_app()
    at.session_state["w_model_kind"] = "custom"
    at.session_state["w_model_name"] = "no-such-org/no-such-model-xyz"
    at.run()
    assert_clean(at)
    assert any("Model not loaded" in e.value and "no-such-model-xyz" in e.value
               for e in at.error)
    assert at.session_state["w_model_name"] == "no-such-org/no-such-model-xyz"
    at.switch_page("app_pages/tokens.py").run()
    assert_clean(at)


def test_projections_for_another_model_disable_learned_methods(tmp_path, monkeypatch):
    from apptest_helpers import random_projections

    from app import shell

    wrong = random_projections("someone/other-model").save(tmp_path / "other.pt")
    monkeypatch.setattr(shell, "DEFAULT_PROJECTIONS", wrong)
    at = new_app(method="kmeans").run()
    assert_clean(at)
    text = _messages(at)
    assert "trained for model someone/other-model" in text and "Learned methods are off" in text
    assert_head_graphs(at)  # gold graphs and window/global still work


def test_custom_model_without_projections_runs_fixed_patterns(without_projections):
    from sparsefinder.models.loading import default_model_path

    at = new_app(method="distance")
    at.session_state["w_model_kind"] = "custom"
    at.session_state["w_model_name"] = str(default_model_path())
    at.run()
    assert_clean(at)
    assert not at.error
    assert "learned methods" in _messages(at).lower()
    assert_head_graphs(at)
    assert not [s for s in at.slider if s.key == "w_t"]  # no t slider without projections


def test_unreadable_projections_path_is_a_warning(tmp_path):
    from sparsefinder.models.loading import default_model_path

    at = new_app()
    at.session_state["w_model_kind"] = "custom"
    at.session_state["w_model_name"] = str(default_model_path())
    at.session_state["w_proj_path"] = str(tmp_path / "nope.pt")
    at.run()
    assert_clean(at)
    assert "Cannot read projections file" in _messages(at)


def test_a_bad_link_is_one_warning_on_every_page_until_a_change(with_projections):
    at = new_app(alpha="nan?", beta="99", layer="40", query="-3").run()
    assert_clean(at)
    fixed = [w.value for w in at.warning if "This link had" in w.value]
    assert len(fixed) == 1 and "4 settings" in fixed[0]
    assert not [w for w in at.warning if w.value.startswith(("ignored URL", "layer="))]
    at.switch_page("app_pages/pareto.py").run()  # a page switch is not a change
    assert_clean(at)
    assert len([w for w in at.warning if "This link had" in w.value]) == 1
    at.switch_page("app_pages/explorer.py").run()
    at.selectbox(key="w_head").set_value(1).run()
    assert_clean(at)
    assert not [w for w in at.warning if "This link had" in w.value]
    assert_head_graphs(at)


def test_a_three_word_text_says_why_its_target_is_out_of_reach(with_projections):
    """The default method at target 0.90 on 3 words (5 keys with [CLS] and [SEP]) keeps every
    key: sparsity 0.000, and the page says why, not a silent zero. Its link names the text,
    not the bundled example the sidebar held before."""
    at = _pasted("Cats sleep often.")
    assert_clean(at)
    assert any("keys per row" in i.value and "paste a longer text" in i.value for i in at.info)
    assert "textid" in at.query_params and "example" not in at.query_params
