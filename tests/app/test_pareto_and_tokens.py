"""Pareto and Token view pages through AppTest (switching pages via st.navigation)."""

from __future__ import annotations

from apptest_helpers import assert_clean, metric, new_app


def test_pareto_page_sweeps_the_text_and_on_request_the_validation_corpus(with_projections):
    at = new_app(method="distance").run()
    at.session_state["w_val_passages"] = 4
    at.switch_page("app_pages/pareto.py").run()
    assert_clean(at)
    assert len(at.get("plotly_chart")) == 1
    assert any("Not computed yet" in c.value for c in at.caption)
    at.button(key="w_val_run").click().run()
    assert_clean(at)
    assert len(at.get("plotly_chart")) == 2
    # moving a slider moves the current-setting star, without recomputing the sweeps
    at.slider(key="w_t").set_value(0.0).run()
    assert_clean(at)
    assert len(at.get("plotly_chart")) == 2


def test_pareto_without_projections_sweeps_window_only(without_projections):
    at = new_app().run()
    at.switch_page("app_pages/pareto.py").run()
    assert_clean(at)
    assert len(at.get("plotly_chart")) == 1
    assert any("needs learned projections" in c.value for c in at.caption)


def test_token_view_follows_query_and_sliders(with_projections):
    at = new_app(method="fixed", window="3", **{"global": "none"}).run()
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
