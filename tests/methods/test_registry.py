"""The registry: parameters declared once and checked, the catalog loaded lazily, plug-ins."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sparsefinder.methods.registry import (
    METHODS,
    Method,
    MethodUnavailable,
    Param,
    get_method,
    register_method,
    unregister_method,
)
from sparsefinder.methods.spec import PredictorSpec


def test_param_check_names_the_parameter_the_range_and_the_value():
    bins = Param("bins", int, 4, low=1)
    bins.check(3)
    bins.check(3.0)  # an integral float (a CSV or a link) is an integer
    bins.check("2")
    for bad in (0, 2.5, "x", True, float("nan"), None):
        with pytest.raises(ValueError, match=r"bins must be an integer >= 1, got"):
            bins.check(bad)
    share = Param("p", float, 0.9, low=0.0, high=1.0, low_open=True)
    share.check(1.0)
    with pytest.raises(ValueError, match=r"p must be a number in \(0, 1\], got 0"):
        share.check(0)
    Param("anything", object, 0).check("whatever")  # undeclared: a plug-in's own check
    form = Param("diag", bool, True, choices=(True, False))
    assert (form.coerce("false"), form.coerce("1"), form.coerce(False)) == (False, True, False)
    with pytest.raises(ValueError, match=r"diag must be one of True / False, got 'maybe'"):
        form.check("maybe")


def test_every_builtin_parameter_is_declared_with_a_default_inside_its_range():
    for method in METHODS.values():
        calibrated = [p for c in method.calibrations for p in (c.target, *c.extra)]
        for param in (*method.params, *calibrated):
            assert param.kind in (int, float) or param.choices, (method.name, param.name)
            param.check(param.default)
            assert param.label and param.url, (method.name, param.name)


def test_specs_are_validated_against_the_declaration():
    with pytest.raises(ValueError, match=r"method 'kmeans': top_k must be an integer >= 1"):
        PredictorSpec.of("kmeans", {"n_clusters": 4, "top_k": 0})
    with pytest.raises(ValueError, match=r"takes parameters \['threshold', 'diag', 'floor'\]; "
                                         r"missing \['threshold'\], unknown \['t'\]"):
        PredictorSpec.of("distance", {"t": 1.0})
    with pytest.raises(ValueError, match="unknown method 'nope'; choose from: distance"):
        get_method("nope")


def test_the_catalog_loads_on_first_read_and_nothing_imports_it():
    code = ("import sys; from sparsefinder.methods import registry as r; "
            "a = 'sparsefinder.catalog' in sys.modules; n = len(r.METHODS); "
            "print(a, 'sparsefinder.catalog' in sys.modules, n > 10)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "True", "True"]


def test_a_plugin_registers_with_bare_parameter_names_and_unregisters():
    plugin = Method("plugin-test", "Plug-in", ("alpha",), lambda p, c: None, inputs="shape")
    register_method(plugin)
    try:
        assert METHODS["plugin-test"].param_names == ("alpha",)
        assert PredictorSpec.of("plugin-test", {"alpha": "any"}).build(None, 0) is None
        with pytest.raises(ValueError, match="already registered"):
            register_method(plugin)
    finally:
        unregister_method("plugin-test")
    assert "plugin-test" not in METHODS


def test_a_point_that_cannot_be_built_here_is_method_unavailable():
    """k-means needs centroids for its B: a sweep skips the point with this reason."""
    import torch

    from sparsefinder.projections.heads import HeadProjections

    projections = HeadProjections(weight=torch.zeros(1, 2, 2, 4), bias=torch.zeros(1, 2, 2),
                                  model_id="synthetic", alpha=1.5)
    spec = PredictorSpec.of("kmeans", {"n_clusters": 5, "top_k": 1})
    with pytest.raises(MethodUnavailable, match="no k-means centroids for B=5"):
        spec.build(projections, 0)


def test_a_form_tagged_long_context_is_listed_with_the_long_context_methods():
    """``block`` with ``select="keys"`` (once the family ``block-keys``) is long-context by its
    form's tag, said once: the docs table, the CLI's ``--methods long-context`` and the app's
    Pareto groups all read it."""
    from sparsefinder.evaluation.curves import resolve_methods
    from sparsefinder.explore.pareto import PAGE_GROUPS
    from sparsefinder.methods.docs_table import families_table

    block = METHODS["block"]
    assert "long-context" in block.tags_for({"select": "keys", "block": 32})
    assert block.tags_for({"select": "blocks"}) == block.tags == ()
    grouped = {g.name for g in block.curves if "long-context" in g.groups}
    assert grouped == {"block-keys"}  # not the family's other forms
    assert "block-keys" in resolve_methods("long-context")
    assert "block-keys" in PAGE_GROUPS["long-context"]
    assert ("| `block` | Block Sparsefinder (block, key blocks, single keys) "
            "(`select=keys`: long-context) |") in families_table()


def test_a_plugin_form_tag_puts_its_curves_in_the_group_and_bad_tags_are_refused():
    from sparsefinder.evaluation.curves import GROUPS
    from sparsefinder.methods.registry import Form, sweep_grids

    mode = Param("mode", str, "near", choices=("near", "far"))
    far = Form("mode", "far", (mode,), lambda p, c: None, "shape", tags=("long-context",))
    plugin = Method("plugin-forms", "Plug-in with forms", (mode,), lambda p, c: None,
                    inputs="shape", forms=(far,),
                    grids=(*sweep_grids("plugin-near", [{"mode": "near"}], groups=("baselines",)),
                           *sweep_grids("plugin-far", [{}], fixed={"mode": "far"})))
    register_method(plugin)
    try:
        assert "plugin-far" in GROUPS["long-context"]
        assert "plugin-near" in GROUPS["baselines"]
        assert "plugin-near" not in GROUPS["long-context"]
    finally:
        unregister_method("plugin-forms")
    assert "plugin-far" not in GROUPS["long-context"]
    bad = Form("mode", "far", (mode,), lambda p, c: None, "shape", tags=("huge",))
    with pytest.raises(ValueError, match=r"tags must be among .*'huge'"):
        Method("plugin-bad", "Bad", (mode,), lambda p, c: None, inputs="shape", forms=(bad,))
