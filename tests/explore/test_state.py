"""sparsefinder.explore: URL view state (no Streamlit)."""

from __future__ import annotations

import pytest

from sparsefinder.explore import clusters as exclusters
from sparsefinder.explore import state as urlstate
from sparsefinder.explore import texts


def test_view_state_round_trips_through_query_params():
    state = urlstate.ViewState(method="distance", t=0.123456789, bins=6, clusters=8, top_k=2,
                               window=5, global_tokens=("last",), layer=3, head=7, query=4,
                               example="science_news", model="/models/my-entmax-bert",
                               alpha=2.0, text_id=texts.text_id("pasted"),
                               overview="sparsity")
    params = urlstate.view_state_to_params(state)
    assert all(isinstance(v, str) for v in params.values())
    parsed, problems = urlstate.parse_view_state(params)
    assert problems == []
    assert parsed == state  # every field, floats exactly


@pytest.mark.parametrize(("key", "value", "field", "expected"), [
    ("alpha", "1", "alpha", 1.0), ("alpha", "4", "alpha", 4.0), ("alpha", "1.5", "alpha", 1.5),
    ("overview", "sparsity", "overview", "sparsity"), ("model", "bert-base-uncased", "model",
                                                       "bert-base-uncased"),
])
def test_edge_values_are_accepted(key, value, field, expected):
    state, problems = urlstate.parse_view_state({key: value})
    assert problems == [] and getattr(state, field) == expected


@pytest.mark.parametrize(("key", "value"), [
    ("alpha", "0.999"), ("alpha", "4.01"), ("alpha", "nan"), ("alpha", "inf"), ("alpha", "x"),
    ("overview", "f1"), ("textid", "xyz"), ("textid", "0123456789abcdeF"),
    ("model", ""), ("model", "a" * 301), ("model", "bad\nname"),
])
def test_bad_new_fields_fall_back_with_a_message(key, value):
    state, problems = urlstate.parse_view_state({key: value})
    assert len(problems) == 1 and f"{key}=" in problems[0]
    assert state == urlstate.ViewState()


def test_bad_query_params_fall_back_to_defaults_with_a_message():
    params = {"method": "magic", "t": "-1", "beta": "x", "window": "999", "layer": "2",
              "global": "first,middle", "example": "nope", "k": ["1", "3"]}
    state, problems = urlstate.parse_view_state(params)
    default = urlstate.ViewState()
    assert state.method == default.method and state.t is None and state.bins == default.bins
    assert state.window == default.window and state.global_tokens == default.global_tokens
    assert state.example == default.example
    assert state.layer == 2 and state.top_k == 3  # good values kept; last of a list wins
    named = " ".join(problems)
    for key in ("method", "t=", "beta", "window", "global", "example"):
        assert key in named


def test_global_none_round_trips():
    state = urlstate.ViewState(global_tokens=())
    assert urlstate.view_state_to_params(state)["global"] == "none"
    assert urlstate.parse_view_state({"global": "none"})[0].global_tokens == ()


def test_snap_window():
    assert [urlstate.snap_window(w) for w in (-1, 0, 1, 2, 3, 30, 99)] == [0, 0, 1, 3, 3, 31, 31]
    assert set(urlstate.WINDOW_CHOICES) == {0, *range(1, urlstate.MAX_WINDOW + 1, 2)}


def test_parse_cluster_and_cluster_from_point():
    assert urlstate.parse_cluster(None) is None
    assert urlstate.parse_cluster("3") == 3 and urlstate.parse_cluster(["1", " 2 "]) == 2
    assert urlstate.parse_cluster("3", clusters=4) == 3
    for bad in ("4", "-1", "x", "", "inf", "nan", []):
        assert urlstate.parse_cluster(bad, clusters=4) is None
    columns = [0, 1, 2, 3]
    assert exclusters.cluster_from_point({"legendgroup": "2", "curve_number": 0}, columns) == 2
    assert exclusters.cluster_from_point({"curve_number": 3, "x": "NOUN"}, columns) == 3
    assert exclusters.cluster_from_point({"curve_number": 9}, columns) is None
    assert exclusters.cluster_from_point({"x": "NOUN"}, columns) is None
