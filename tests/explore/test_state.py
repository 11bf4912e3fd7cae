"""sparsefinder.explore: URL view state (no Streamlit)."""

from __future__ import annotations

import pytest

from sparsefinder.explore import app_methods, texts
from sparsefinder.explore import clusters as exclusters
from sparsefinder.explore import state as urlstate

#: The raw (uncalibrated) distance family: ViewState defaults to its calibrated form.
RAW_DISTANCE = {"method": "distance", "calibration": "none"}


def test_view_state_round_trips_through_query_params():
    state = urlstate.ViewState(**RAW_DISTANCE, t=0.123456789, bins=6, clusters=8, top_k=2,
                               window=5, global_tokens=("last",), layer=3, head=7, query=4,
                               example="science_news", model="/models/my-entmax-bert",
                               alpha=2.0, overview="sparsity", hamming=7)
    params = urlstate.view_state_to_params(state)
    assert all(isinstance(v, str) for v in params.values())
    parsed, problems = urlstate.parse_view_state(params)
    assert problems == []
    assert parsed == state  # every field, floats exactly


def test_a_custom_text_link_does_not_carry_the_example():
    """A pasted text's link names it by ``textid``; the bundled example the sidebar held
    before is not what the link opens, so it is left out (and the state reads back)."""
    state = urlstate.ViewState(text_id=texts.text_id("pasted"), bins=6, layer=2)
    params = urlstate.view_state_to_params(state)
    assert "example" not in params and params["textid"] == state.text_id
    parsed, problems = urlstate.parse_view_state(params)
    assert problems == [] and parsed == state
    assert urlstate.view_state_to_params(state.with_(text_id=None))["example"] == state.example


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


# Boundary values of every URL parameter: (name, at the lowest, at the highest accepted, just
# outside each end). None = unbounded above (the text/model bounds are clamp()'s job).
BOUNDS = [
    ("beta", "bins", 1, urlstate.MAX_BINS),
    ("window", "window", 0, urlstate.MAX_WINDOW),
    ("k", "top_k", 1, None),
    ("B", "clusters", 1, None),
    ("layer", "layer", 0, None),
    ("head", "head", 0, None),
    ("query", "query", 0, None),
    ("hd", "hamming", 0, urlstate.HASH_BITS),
]


def test_integer_params_at_and_just_outside_their_bounds():
    default = urlstate.ViewState()
    for key, field, low, high in BOUNDS:
        state, problems = urlstate.parse_view_state({key: str(low)})
        assert problems == [] and getattr(state, field) == low, key
        state, problems = urlstate.parse_view_state({key: str(low - 1)})
        assert getattr(state, field) == getattr(default, field), key
        assert problems == [f"ignored URL parameter {key}={str(low - 1)!r}: {low - 1} is outside "
                            f"[{low}, {high if high is not None else '∞'}]"]
        if high is not None:
            state, problems = urlstate.parse_view_state({key: str(high)})
            assert problems == [] and getattr(state, field) == high, key
            state, problems = urlstate.parse_view_state({key: str(high + 1)})
            assert getattr(state, field) == getattr(default, field) and len(problems) == 1


def test_infinite_and_nan_values_never_raise():
    """int(float('inf')) raises OverflowError: a hand-edited URL must not crash the app."""
    default = urlstate.ViewState()
    for key, field, _, _ in BOUNDS:
        for bad in ("inf", "-inf", "nan", "1e400", ""):
            state, problems = urlstate.parse_view_state({key: bad})
            assert getattr(state, field) == getattr(default, field), (key, bad)
            assert len(problems) == 1 and problems[0].startswith(f"ignored URL parameter {key}=")


def test_threshold_at_zero_negative_zero_and_non_finite():
    for text in ("0", "0.0", "-0", "-0.0"):
        state, problems = urlstate.parse_view_state({"t": text})
        assert problems == [] and state.t == 0.0, text
    for bad in ("inf", "-inf", "nan", "-1e-9", "1e400", "x"):
        state, problems = urlstate.parse_view_state({"t": bad})
        assert state.t is None and len(problems) == 1, bad
    _, problems = urlstate.parse_view_state({"t": "nan"})
    assert problems == ["ignored URL parameter t='nan': expected a finite number >= 0"]


def test_list_values_and_whitespace():
    state, problems = urlstate.parse_view_state({"beta": [], "window": [" 5 "], "k": " 2"})
    assert state.window == 5 and state.top_k == 2 and state.bins == urlstate.ViewState().bins
    assert problems == ["ignored URL parameter beta='': could not convert string to float: ''"]
    assert urlstate.parse_view_state({"method": "distance"})[0].method == "distance"


def test_calibration_is_a_parameter_of_the_method_in_links():
    default = urlstate.ViewState()
    assert (default.method, default.calibration, default.method_id) == (
        "distance-floor", "budget", "distance-floor:budget")
    assert urlstate.view_state_to_params(default)["calibration"] == "budget"
    state, problems = urlstate.parse_view_state({"method": "distance", "calibration": "budget"})
    assert state.method_id == "distance:budget" and not problems
    # a link naming a method but no calibration (older links) meant the raw parameters
    state, problems = urlstate.parse_view_state({"method": "distance", "t": "0.5"})
    assert state.method_id == "distance" and state.t == 0.5 and not problems
    # the old names are read as family + calibration, with a note saying so
    state, problems = urlstate.parse_view_state({"method": "rowfrac-budget", "target": "0.8"})
    assert (state.method_id, state.target_sparsity) == ("rowfrac:budget", 0.8)
    assert problems == ["URL parameter method='rowfrac-budget' is an old name: read as "
                        "Nearest keys (row fraction), per head, sparsity budget across heads "
                        "(`rowfrac:budget`), method=rowfrac&calibration=budget"]
    # a calibration the app does not offer for that family
    state, problems = urlstate.parse_view_state({"method": "quest", "calibration": "budget"})
    assert state.method_id == "quest"
    assert problems == ["ignored URL parameter calibration='budget': the app offers Quest "
                        "pages (min/max key bounds) (`quest`) with calibration none"]
    state, problems = urlstate.parse_view_state({"calibration": "magic"})
    assert state == default and "expected one of none, equal, budget, recall" in problems[0]
    # a family switch gives the family's own default calibration
    assert default.with_(method="quantization").method_id == "quantization"
    assert default.with_(method="rowfrac", calibration="none").method_id == "rowfrac"
    assert default.with_(method="kmeans-routed", calibration="none").method_id == (
        "kmeans-routed:budget")
    assert urlstate.to_spec(default).method_id == "distance-floor:budget"
    # the calibrated family's other declared settings at their defaults (the table's floor)
    # (and the optional floor_share, whose default is a cap, not None: the length rule)
    assert urlstate.to_spec(default).param_dict == {"target_sparsity": 0.9, "floor": 12,
                                                    "floor_share": 1.0}
    assert urlstate.to_spec(default.with_(method="distance")).param_dict == {
        "target_sparsity": 0.9}
    assert urlstate.parse_view_state({}, urlstate.ViewState(window=7))[0].window == 7


def test_view_state_to_params_formats_floats_and_leaves_none_out():
    params = urlstate.view_state_to_params(urlstate.ViewState(t=1.23456, clusters=None))
    assert params["t"] == "1.23456" and "B" not in params  # repr: reads back exactly
    # window and global tokens are off by default: a calibrated target is the sparsity shown
    assert params["global"] == "none" and params["window"] == "0"
    coref = {"coref", "probe", "pairs", "coref_B", "coref_k", "coref_rank", "coref_head"}
    assert set(params) == set(urlstate.PARAM_NAMES.values()) - {"B", "beta", "textid", "pages",
                                                                 *coref}
    assert "calibration" in params


def test_to_spec_for_every_app_method():
    state = urlstate.ViewState(t=None, bins=5, clusters=6, top_k=2, window=3,
                               global_tokens=("first",))
    distance = urlstate.to_spec(state.with_(t=1.5), "distance")
    assert distance.params == (("threshold", 1.5),) and distance.window == 3
    assert distance.global_tokens == ("first",)
    assert urlstate.to_spec(state, "quantization").params == (("bins", 5),)
    assert urlstate.to_spec(state, "kmeans").params == (("n_clusters", 6), ("top_k", 2))
    assert urlstate.to_spec(state.with_(method="quantization")).method == "quantization"
    # window is pinned to 0: the state's own window (3) is the window
    assert urlstate.to_spec(state, "window").params == (("window", 0),)
    assert urlstate.to_spec(state.with_(hamming=5), "hashattention").params == (
        ("max_distance", 5),)
    # a value the text sets (live.clamp) is not guessed here
    for field, method, name in (("clusters", "kmeans", "n_clusters"), ("t", "distance",
                                                                       "threshold")):
        with pytest.raises(ValueError, match=f"needs a value of {name}; clamp the state first$"):
            urlstate.to_spec(state.with_(**{field: None}), method)


def test_parse_cluster_bounds():
    assert urlstate.parse_cluster("0", clusters=4) == 0
    assert urlstate.parse_cluster("1", clusters=1) is None
    assert urlstate.parse_cluster("0", clusters=1) == 0
    assert urlstate.parse_cluster("999") == 999  # no B given: no upper bound
    assert urlstate.parse_cluster(" 1 ", clusters=2) == 1
    assert app_methods.method_label("distance") == "Distance (t)"


def test_problem_messages_name_what_is_expected():
    _, problems = urlstate.parse_view_state({"method": "magic", "example": "nope",
                                             "global": "first,middle"})
    assert problems == [
        "ignored URL parameter method='magic': expected one of distance-floor, distance, "
        "quantization, kmeans, rowfrac, kmeans-routed, quest, hashattention, block, window, "
        "longformer, bigbird, reformer, routing, topk, topp",
        "ignored URL parameter global='first,middle': expected a comma list of "
        "('first', 'last') or 'none'",
        "ignored URL parameter example='nope': expected a bundled example name",
    ]
    state, problems = urlstate.parse_view_state({"global": " last , first ,none"})
    assert problems == [] and state.global_tokens == ("first", "last")
    assert urlstate.parse_view_state({"global": "last"})[0].global_tokens == ("last",)


def test_fixes_message_lists_every_fix_in_one_message():
    assert urlstate.fixes_message([]) is None
    _, problems = urlstate.parse_view_state({"alpha": "x", "beta": "0", "window": "-1"})
    message = urlstate.fixes_message(problems)
    assert message.startswith("This link had 3 settings")
    assert [line for line in message.splitlines() if line.startswith("- ")] == [
        f"- {p}" for p in problems]
    assert "1 setting that" in urlstate.fixes_message(problems[:1])
    later = urlstate.fixes_message(problems[:1], link=False)  # not from a link
    assert later.startswith("1 setting did not fit this text and model") and "link" not in later


def test_generated_controls_read_and_write_their_declared_url_keys():
    """Every family's values come from its Param declarations: range-checked, kept per
    family (or in the state field its control names, under the Param's key), and under keys
    that no other field uses."""
    fixed_keys = set(urlstate.PARAM_NAMES.values())
    for family, offered in app_methods.APP_CALIBRATIONS.items():
        for param, control in app_methods.controls(family) if "none" in offered else ():
            if control.field:
                assert urlstate.PARAM_NAMES[control.field] == param.url, (family, param.url)
                continue
            assert param.url not in fixed_keys, (family, param.url)
            assert param.high is not None or param.app_high is not None, (family, param.name)
    state, problems = urlstate.parse_view_state({"method": "longformer", "n_global": "4"})
    assert not problems and state.extra == (("longformer.n_global", 4),)
    assert urlstate.to_spec(state).param_dict == {"n_global": 4}
    assert urlstate.view_state_to_params(state)["n_global"] == "4"
    state, problems = urlstate.parse_view_state({"method": "longformer", "n_global": "999"})
    assert problems == ["ignored URL parameter n_global='999' of Longformer (`longformer`): "
                        "n_global must be at most 32 here"] and state.extra == ()
    _, problems = urlstate.parse_view_state({"method": "topp", "p": "0"})
    assert problems == ["ignored URL parameter p='0' of Top-p of exact entmax (reference) "
                        "(`topp`): p "
                        "must be a number in (0, 1], got '0'"]
    # a family keeps its own values: routing's n_clusters is not another family's
    routing = state.with_(method="routing", extra=app_methods.with_extra(
        state, "routing", "n_clusters", 6))
    assert urlstate.to_spec(routing).param_dict == {"n_clusters": 6}
    assert urlstate.to_spec(routing.with_(method="longformer")).param_dict == {"n_global": 2}


def test_coreference_fields_read_and_write_the_link_and_defaults_stay_out():
    linked = {"coref": "own", "probe": "p07", "pairs": "14-10, 85-62,14-10", "coref_B": "8",
              "coref_k": "3", "coref_rank": "all", "coref_head": "l3h1"}
    state, problems = urlstate.parse_view_state(linked)
    assert problems == []
    assert (state.coref_text, state.coref_probe, state.coref_B, state.coref_k) == (
        "own", "p07", 8, 3)
    assert (state.coref_scope, state.coref_head) == ("all", (3, 1))
    assert state.coref_pairs == ((14, 10), (85, 62))  # a repeated pair counts once
    params = urlstate.view_state_to_params(state)
    assert params["pairs"] == "14-10,85-62" and params["coref"] == "own"
    assert params["coref_head"] == "L3H1" and params["coref_rank"] == "all"
    assert urlstate.parse_view_state(params)[0] == state  # the link reproduces the state
    none = urlstate.parse_view_state({"pairs": "none"})[0]  # every pair removed
    assert none.coref_pairs == () and urlstate.view_state_to_params(none)["pairs"] == "none"
    # "probes" is the default text: the link leaves it (and every other default) out
    state = urlstate.parse_view_state({"coref": "probes", "coref_rank": "probe"})[0]
    assert state.coref_text is None and state.coref_scope is None
    assert not {"coref", "probe", "pairs", "coref_B", "coref_k", "coref_rank", "coref_head"} & set(
        urlstate.view_state_to_params(state))


def test_bad_coreference_fields_fall_back_with_a_message_each():
    state, problems = urlstate.parse_view_state(
        {"coref": "mine", "probe": "p 1", "pairs": "3-3,x", "coref_B": "0", "coref_k": "9",
         "coref_rank": "every", "coref_head": "3.1"})
    assert state == urlstate.ViewState()
    assert problems == [
        "ignored URL parameter coref='mine': expected one of probes, own",
        "ignored URL parameter probe='p 1': expected a probe id such as p01",
        "ignored URL parameter pairs='3-3,x': expected pronoun-antecedent word indices such "
        "as 6-1,12-4 (two different words each), or none",
        "ignored URL parameter coref_B='0': 0 is outside [1, ∞]",
        "ignored URL parameter coref_k='9': 9 is outside [1, 8]",
        "ignored URL parameter coref_rank='every': expected one of probe, all",
        "ignored URL parameter coref_head='3.1': expected a head as L<layer>H<head>, such as "
        "L3H1",
    ]


def test_the_apps_ranges_are_the_catalogs():
    """Every bound the app's link and sliders use is a family's declared one."""
    from sparsefinder.methods.registry import METHODS

    declared = {f"{family}.{p.name}": p for family in ("quantization", "kmeans", "quest",
                                                        "hashattention", "window")
                for p in METHODS[family].params}
    for key, low, high in (("quantization.bins", 1, urlstate.MAX_BINS),
                           ("kmeans.top_k", 1, urlstate.MAX_TOP_K),
                           ("quest.pages", 0, urlstate.MAX_PAGES),
                           ("hashattention.max_distance", 0, urlstate.HASH_BITS),
                           ("window.window", 0, urlstate.MAX_WINDOW)):
        assert (declared[key].low, declared[key].app_high) == (low, high), key


def test_quest_pages_bounds_and_spec():
    default = urlstate.ViewState()
    # the catalog's range: 0 pages (the empty graph) up to the slider's useful region
    for text, expected in (("0", 0), (str(urlstate.MAX_PAGES), urlstate.MAX_PAGES)):
        state, problems = urlstate.parse_view_state({"pages": text})
        assert problems == [] and state.pages == expected
    for bad, shown in (("-1", -1), (str(urlstate.MAX_PAGES + 1), urlstate.MAX_PAGES + 1)):
        state, problems = urlstate.parse_view_state({"pages": bad})
        assert state.pages == default.pages
        assert problems == [f"ignored URL parameter pages={bad!r}: {shown} is outside "
                            f"[0, {urlstate.MAX_PAGES}]"]
    quest = urlstate.ViewState(method="quest", pages=3)
    assert urlstate.to_spec(quest).param_dict == {"page_size": urlstate.QUEST_PAGE, "pages": 3}
    assert urlstate.to_spec(quest.with_(method="distance"), "quest").params == (
        ("page_size", urlstate.QUEST_PAGE), ("pages", 3))
    with pytest.raises(ValueError, match="^Quest pages .* needs a value of pages; clamp the "):
        urlstate.to_spec(quest.with_(pages=None))


@pytest.mark.parametrize(("text", "ok"), [
    ("0.5", True), ("1e-9", True), ("0.999", True), ("0", False), ("1", False), ("1.5", False),
    ("2", False), ("-0.1", False), ("inf", False), ("nan", False),
])
def test_target_is_strictly_between_zero_and_one(text, ok):
    state, problems = urlstate.parse_view_state({"target": text})
    if ok:
        assert problems == [] and state.target_sparsity == float(text)
    else:
        assert state.target_sparsity == urlstate.DEFAULT_TARGET
        assert problems == [f"ignored URL parameter target={text!r}: expected a target "
                            "sparsity: a number in (0, 1)"]


def test_model_name_length_and_characters():
    longest = "m" * urlstate.MAX_MODEL_NAME
    assert urlstate.parse_view_state({"model": longest}) == (urlstate.ViewState(model=longest), [])
    spaced = "/models/my model"  # a space (ord 32) is a printable character
    assert urlstate.parse_view_state({"model": spaced})[0].model == spaced
    _, problems = urlstate.parse_view_state({"model": "bad\tname"})
    assert problems == ["ignored URL parameter model='bad\\tname': expected a model name or path "
                        f"of 1–{urlstate.MAX_MODEL_NAME} characters"]


def test_more_problem_messages_name_what_is_expected():
    _, problems = urlstate.parse_view_state({"alpha": "5", "textid": "xyz", "overview": "f1"})
    assert problems == [
        "ignored URL parameter alpha='5': expected a number in [1, 4]",
        "ignored URL parameter textid='xyz': expected 16 hex digits (a text's name)",
        "ignored URL parameter overview='f1': expected one of "
        + ", ".join(urlstate.OVERVIEW_METRICS),
    ]
    state, problems = urlstate.parse_view_state({"method": "kmeans-routed", "calibration": "none"})
    assert state.method_id == "kmeans-routed:budget"
    assert problems[0].endswith("with calibration budget")
    state, problems = urlstate.parse_view_state({"method": "distance", "calibration": "equal"})
    assert state.method_id == "distance:budget"
    assert problems == ["ignored URL parameter calibration='equal': the app offers Distance (t) "
                        "(`distance`) with calibration budget / none"]


def test_generated_controls_with_lists_several_params_and_upper_bounds():
    # the last of a list wins; an empty list reads as ""
    state, problems = urlstate.parse_view_state({"method": "longformer",
                                                 "n_global": ["1", "5", "7"]})
    assert not problems and state.extra == (("longformer.n_global", 7),)
    state, problems = urlstate.parse_view_state({"method": "longformer", "n_global": []})
    assert state.extra == () and len(problems) == 1
    assert problems[0].startswith("ignored URL parameter n_global='' of Longformer")
    # the app's upper bound is inclusive
    state, problems = urlstate.parse_view_state({"method": "longformer", "n_global": "32"})
    assert not problems and state.extra == (("longformer.n_global", 32),)
    # an absent or a bad parameter does not stop the family's later ones
    state, problems = urlstate.parse_view_state({"method": "block", "n_blocks": "3"})
    assert not problems and state.extra == (("block.n_blocks", 3),)
    state, problems = urlstate.parse_view_state(
        {"method": "block", "block": "0", "n_blocks": "3", "n_keys": "5"})
    assert len(problems) == 1 and problems[0].startswith("ignored URL parameter block='0'")
    assert state.extra == (("block.n_blocks", 3), ("block.n_keys", 5))


def test_float_controls_and_several_global_tokens_round_trip():
    state = urlstate.ViewState(method="topp", extra=(("topp.p", 0.37),),
                               global_tokens=("first", "last"))
    params = urlstate.view_state_to_params(state)
    assert params["p"] == "0.37" and params["global"] == "first,last"
    assert urlstate.parse_view_state(params) == (state, [])
    # a calibrated generated family's link carries the target, not the raw parameters
    budget = urlstate.view_state_to_params(urlstate.ViewState(method="rowfrac",
                                                              calibration="budget"))
    assert "frac" not in budget and budget["target"] == repr(urlstate.DEFAULT_TARGET)
    assert "frac" in urlstate.view_state_to_params(urlstate.ViewState(method="rowfrac",
                                                                      calibration="none"))


def test_parse_cluster_reads_the_last_of_a_list():
    assert urlstate.parse_cluster(["1", "2", "3"]) == 3
    assert urlstate.parse_cluster(["5"]) == 5
