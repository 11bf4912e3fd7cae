"""tools/accuracy_levels.py: the calibrated curves cut to the levels read, floors added."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sparsefinder.evaluation.curves import CURVES, GROUPS

TOOL = Path(__file__).resolve().parents[2] / "tools" / "accuracy_levels.py"
spec = importlib.util.spec_from_file_location("accuracy_levels", TOOL)
accuracy_levels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(accuracy_levels)


@pytest.fixture
def restored():
    curves, groups = dict(CURVES), dict(GROUPS)
    yield
    CURVES.clear()
    CURVES.update(curves)
    GROUPS.clear()
    GROUPS.update(groups)


def test_narrow_cuts_calibrated_grids_and_adds_floors(restored) -> None:
    raw = CURVES["distance"].specs
    floor = {s.param_dict["floor"] for s in CURVES["distance-floor:budget"].specs}
    assert accuracy_levels.narrow([0.75, 0.9], [2]) == ["distance-floor:budget@m2"]
    for name in ("distance:budget", "rowfrac:budget", "distance-floor:budget"):
        specs = CURVES[name].specs
        assert [s.param_dict["target_sparsity"] for s in specs] == [0.75, 0.9]
        assert all(s.calibration == "budget" for s in specs)
    # the sweep's own floor curve keeps its floor; raw curves are untouched
    assert {s.param_dict["floor"] for s in CURVES["distance-floor:budget"].specs} == floor
    assert CURVES["distance"].specs == raw
    assert [s.param_dict for s in CURVES["distance-floor:budget@m2"].specs] == [
        {"floor": 2, "target_sparsity": 0.75}, {"floor": 2, "target_sparsity": 0.9}]
    assert GROUPS["floors"] == ["distance-floor:budget@m2"]


def test_a_capped_floor_curve(restored) -> None:
    assert accuracy_levels.narrow([0.9], [(8, 1.0)]) == ["distance-floor:budget@m8c1"]
    assert [s.param_dict for s in CURVES["distance-floor:budget@m8c1"].specs] == [
        {"floor": 8, "floor_share": 1.0, "target_sparsity": 0.9}]
