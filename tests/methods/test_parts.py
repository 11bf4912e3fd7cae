"""sparsefinder.methods.parts: a build sees only the learned parts its family declared."""

from __future__ import annotations

import pytest

from sparsefinder.methods.parts import NEEDS, Parts
from sparsefinder.methods.registry import METHODS, Method, Param
from sparsefinder.methods.spec import PredictorSpec


def test_every_builtin_family_declares_what_it_needs():
    for name, method in METHODS.items():
        assert method.needs is not None, name
        assert set(method.needs) <= set(NEEDS) and method.fits in NEEDS, name
        if method.fit is not None:  # its fit makes one of the parts its build reads
            assert method.fits in method.needs, name
        for calibration in method.calibrations:
            assert "calibration" in calibration.needs, (name, calibration.name)


def test_an_undeclared_part_is_refused():
    with pytest.raises(ValueError, match="needs and fits must be among"):
        Method("toy", "Toy", (), lambda p, c: None, needs=("weights",))


def test_the_build_gets_the_declared_parts_only():
    seen = {}

    def build(params, context):
        seen["parts"] = context.parts
        return None

    toy = Method("toy", "Toy", (Param("x", int, 1),), build, needs=("hash_codes",),
                 fits="hash_codes")
    METHODS.add(toy, replace=True)
    try:
        spec = PredictorSpec.of("toy", {"x": 1})
        spec.build(Parts(projections=object(), hash_codes="codes", fitted="other"), 0)
        assert seen["parts"] == Parts(hash_codes="codes")
        # the pair (projections, what fit returned) lands in the field the family's fit makes
        assert spec.parts(None, "fit result") == Parts(hash_codes="fit result")
        spec.build(None, 0, "fit result")
        assert seen["parts"] == Parts(hash_codes="fit result")
    finally:
        METHODS.remove("toy")


def test_a_family_declaring_nothing_gets_every_part_at_hand():
    assert Parts(projections=1, fitted=2).only(None) == Parts(projections=1, fitted=2)
    assert Parts(projections=1, fitted=2).only(()) == Parts()
