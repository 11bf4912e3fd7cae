"""Links reproduce the view (model, α, text, method, selection) and typed text is never lost."""

from __future__ import annotations

from apptest_helpers import assert_clean, gold_sparsity, metric, new_app

from sparsefinder.explore import texts

PASTED = "The engineer told the manager that she would fix the bug before lunch."


def _params(at) -> dict[str, str]:
    return {k: at.query_params[k] for k in at.query_params}


def test_every_field_round_trips_through_the_link(with_projections):
    at = new_app(alpha="2", method="quantization", beta="3", window="5", layer="4", head="7",
                 query="3", example="science_news", overview="sparsity",
                 **{"global": "last"}).run()
    assert_clean(at)
    assert at.number_input(key="w_alpha").value == 2.0
    params = _params(at)
    for key, value in {"alpha": "2.0", "method": "quantization", "beta": "3", "window": "5",
                       "layer": "4", "head": "7", "query": "3", "example": "science_news",
                       "overview": "sparsity", "global": "last", "model": "default"}.items():
        assert params[key] == value, key
    shown = (metric(at, "Model recall"), gold_sparsity(at, "Model"))
    again = new_app(**params).run()  # a second visitor opens the same link
    assert_clean(again)
    assert (metric(again, "Model recall"), gold_sparsity(again, "Model")) == shown
    assert _params(again) == params


def test_alpha_changes_the_graphs_and_the_link(with_projections):
    at = new_app(method="window", window="3").run()
    sparse = gold_sparsity(at, "Model")
    at.number_input(key="w_alpha").set_value(2.0).run()
    assert_clean(at)
    assert at.query_params["alpha"] == "2.0"
    assert gold_sparsity(at, "Model") > sparse  # sparsemax is sparser than entmax15
    at.number_input(key="w_alpha").set_value(1.5).run()
    assert gold_sparsity(at, "Model") == sparse  # one model copy, α set per run


def test_pasted_text_survives_mode_switches_and_travels_in_the_link(with_projections):
    at = new_app().run()
    at.radio(key="w_source").set_value("paste").run()
    at.text_area(key="w_paste").input(PASTED).run()
    assert_clean(at)
    shown = gold_sparsity(at, "Model")
    assert at.query_params["textid"] == texts.text_id(PASTED)
    assert texts.decode_text(at.query_params["text"]) == PASTED
    at.radio(key="w_source").set_value("example").run()
    assert "textid" not in at.query_params and "text" not in at.query_params
    at.radio(key="w_source").set_value("paste").run()
    assert at.text_area(key="w_paste").value == PASTED  # not replaced by the example
    link = _params(at)
    reopened = new_app(**link).run()  # a reload, or someone else opening the link
    assert_clean(reopened)
    assert reopened.radio(key="w_source").value == "paste"
    assert reopened.text_area(key="w_paste").value == PASTED
    assert gold_sparsity(reopened, "Model") == shown  # the same text's graphs


def test_a_long_text_is_named_by_hash_and_an_unknown_one_is_refused(with_projections):
    at = new_app(textid="0123456789abcdef").run()
    assert_clean(at)
    assert any("not available here" in e.value for e in at.error)
    assert not any("Gold" in str(c) for c in at.get("plotly_chart"))
    damaged = new_app(textid=texts.text_id(PASTED), text=texts.encode_text(PASTED)[:-4]).run()
    assert_clean(damaged)
    assert any("damaged" in e.value for e in damaged.error)


BAD_LINK = {"alpha": "abc", "method": "magic", "window": "-4", "beta": "0", "pages": "999",
            "hd": "99", "overview": "nope", "layer": "99", "head": "50", "query": "9999"}


def _fix_warnings(at) -> list[str]:
    return [w.value for w in at.warning if "This link had" in w.value]


def test_a_bad_link_is_one_warning_that_clears_after_a_change(with_projections):
    at = new_app(**BAD_LINK).run()
    assert_clean(at)
    (warning,) = _fix_warnings(at)  # one box, not one per parameter
    assert "10 settings" in warning
    for name, value in BAD_LINK.items():
        if name not in ("layer", "head", "query"):
            assert f"{name}={value!r}" in warning, name
    for name in ("layer=99", "head=50", "query=9999"):  # out of this text's range
        assert name in warning
    assert sum("This link had" in w.value or "URL parameter" in w.value
               or "beyond this text" in w.value for w in at.warning) == 1
    at.run()  # a rerun without a change (a page switch, a click elsewhere) keeps it
    assert len(_fix_warnings(at)) == 1
    at.select_slider(key="w_window").set_value(7).run()  # the user changes something
    assert_clean(at)
    assert not _fix_warnings(at)
    at.number_input(key="w_alpha").set_value(2.0).run()
    assert not _fix_warnings(at)


def test_a_sidebar_change_clears_the_link_warning(with_projections):
    at = new_app(layer="99", window="-4").run()
    assert "2 settings" in _fix_warnings(at)[0]
    at.number_input(key="w_alpha").set_value(2.0).run()
    assert_clean(at)
    assert not _fix_warnings(at)


def test_an_old_fixed_link_opens_the_same_view_with_one_note(with_projections):
    """``method=fixed`` (window and global tokens only) is the window family with its own
    size 0 now: the old link shows the same graphs, and one note gives the new spelling."""
    new = new_app(method="window", window="3", **{"global": "first"}).run()
    old = new_app(method="fixed", window="3", **{"global": "first"}).run()
    assert_clean(new)
    (warning,) = _fix_warnings(old)
    assert "method='fixed' is an old name" in warning and "method=window" in warning
    assert old.query_params["method"] == "window"
    assert (metric(old, "Model recall"), gold_sparsity(old, "Model")) == (
        metric(new, "Model recall"), gold_sparsity(new, "Model"))
    assert _params(old) == _params(new)
