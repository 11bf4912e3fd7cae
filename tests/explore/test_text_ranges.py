"""The sliders' text-dependent ranges and first values, named by the catalog's controls."""

from __future__ import annotations

from dataclasses import fields

import pytest

from sparsefinder.explore import app_methods, live, text_ranges
from sparsefinder.explore import prepared as prep
from sparsefinder.explore import state as urlstate
from sparsefinder.explore.availability import available_methods
from sparsefinder.methods.grids import AppHint, Control
from sparsefinder.methods.registry import METHODS, Method, Param, register_method, unregister_method
from sparsefinder.methods.spec import PredictorSpec
from sparsefinder.predictors import Window


def test_every_declared_control_names_a_field_and_hooks_that_exist():
    state_fields = {f.name for f in fields(urlstate.ViewState)}
    seen = set()
    for family in app_methods.APP_CALIBRATIONS:
        for param, control in app_methods.controls(family):
            assert not control.range or control.range in text_ranges.RANGES, (family, param)
            assert not control.default or control.default in text_ranges.DEFAULTS
            if control.field:  # its link key is the Param's own
                assert control.field in state_fields and control.field not in seen
                assert urlstate.PARAM_NAMES[control.field] == param.url
                seen.add(control.field)
    assert seen == {"t", "bins", "clusters", "top_k", "pages", "hamming"}
    assert set(app_methods.METHODS["distance"].app.params) <= {
        p.name for p in METHODS["distance"].params}


def test_the_text_hooks_give_the_texts_ranges_and_first_values(prepared):
    fitted = live.clamp(urlstate.ViewState(method="kmeans", calibration="none"), prepared)[0]
    assert fitted.t == prepared.t_default and fitted.bins == prepared.bins_default
    assert fitted.clusters == 8 and fitted.pages >= 1  # the declared B, held by the projections
    controls = {c.field: (p, c) for _, p, c in app_methods.field_controls()}
    t = text_ranges.text_range(prepared, fitted, *controls["t"])
    assert (t.low, t.high, t.step, t.format) == (0.0, prepared.t_max, prepared.t_max / 200,
                                                 "%.3f")
    assert text_ranges.text_range(prepared, fitted, *controls["clusters"]).options == (2, 4, 8)
    for clusters, high in ((2, 2), (8, 8)):
        span = text_ranges.text_range(prepared, fitted.with_(clusters=clusters),
                                      *controls["top_k"])
        assert (span.low, span.high) == (1, high)
    assert text_ranges.text_range(prepared, fitted, *controls["bins"]).high == urlstate.MAX_BINS
    # out of the text's range: the nearest value in it
    fixed = live.clamp(fitted.with_(t=1e9, clusters=5, top_k=7), prepared)[0]
    assert (fixed.t, fixed.clusters, fixed.top_k) == (prepared.t_max, 4, 4)


#: a toy family with a slider whose range is the text's (its number of tokens)
SPAN = Param("span", int, 5, low=0, high=4096, label="span", url="span")
TOY = Method("toy-span", "Window of the text's span (toy)", (SPAN,),
             lambda p, c: Window(int(p["span"])), inputs="shape", needs=(),
             app=AppHint("Fixed patterns", params={"span": Control(
                 label="Span (tokens)", range="toy_tokens", default="toy_half")}))


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(text_ranges.RANGES, "toy_tokens", lambda prepared, state, param:
                        text_ranges.TextRange(0, prepared.n_tokens))
    monkeypatch.setitem(text_ranges.DEFAULTS, "toy_half",
                        lambda prepared, param: prepared.n_tokens // 2)
    register_method(TOY)
    try:
        yield TOY
    finally:
        unregister_method(TOY.name)


def test_new_family_with_a_text_dependent_slider_needs_its_entry_and_its_hook(toy, prepared):
    """No edit of the state, the sliders or the clamp: the catalog entry names the hook."""
    n = prepared.n_tokens
    assert app_methods.controls("toy-span") == ((SPAN, TOY.app.params["span"]),)
    opened, _ = live.clamp(urlstate.ViewState(method="toy-span", calibration="none"), prepared)
    assert opened.extra == (("toy-span.span", n // 2),)  # the hook's first value
    assert urlstate.to_spec(opened) == PredictorSpec.of("toy-span", {"span": n // 2})
    link = urlstate.view_state_to_params(opened)
    assert link["span"] == str(n // 2) and urlstate.parse_view_state(link) == (opened, [])
    far = opened.with_(extra=app_methods.with_extra(opened, "toy-span", "span", n + 100))
    assert live.clamp(far, prepared)[0].extra == (("toy-span.span", n),)  # the text's end
    fresh = prep.prepare(prepared.record, prepared.projections)  # (a text keeps its list)
    assert "toy-span" in available_methods(fresh)
