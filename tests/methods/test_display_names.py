"""One display name per method: the app's menu, the Pareto legends, the sweep CSVs' ``label``
column, the CLI's ``--methods`` help and the link warnings all read
:func:`sparsefinder.methods.registry.display_name`."""

from __future__ import annotations

import argparse

import pandas as pd
import pytest

import sparsefinder.catalog  # noqa: F401  (registers the built-in families)
from sparsefinder.commands import sweep as sweep_command
from sparsefinder.evaluation.curves import CURVES, curve_display_name, with_labels
from sparsefinder.explore import app_methods, pareto
from sparsefinder.explore.state import parse_view_state
from sparsefinder.methods.registry import (
    CALIBRATION_LABELS,
    METHODS,
    display_name,
    method_ids,
)


def _help() -> str:
    parser = argparse.ArgumentParser(prog="sparsefinder")
    sweep_command.add_parser(parser.add_subparsers())
    (sweep,) = parser._subparsers._group_actions[0].choices.values()
    return sweep.format_help()


HELP_LINES = {line.split("—", 1)[0].strip(): line.split("—", 1)[1].strip()
              for line in _help().splitlines() if "—" in line and line.startswith("  ")}


def test_no_two_methods_share_a_display_name():
    names = [display_name(m) for m in method_ids()]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("method", method_ids())
def test_every_family_calibration_has_one_name_built_from_its_family(method):
    family, _, calibration = method.partition(":")
    name = display_name(method)
    assert name.startswith(METHODS[family].label)
    if calibration:
        assert name == f"{display_name(family)}, {CALIBRATION_LABELS[calibration]}"
    else:
        assert name == METHODS[family].label


@pytest.mark.parametrize("method", [m for m in method_ids() if m in CURVES])
def test_legend_csv_and_cli_help_agree_with_the_menu(method):
    family, _, calibration = method.partition(":")
    name = display_name(method)
    assert pareto.curve_label(method) == name  # the Pareto legends
    frame = with_labels(pd.DataFrame({"method": [method]}))
    assert frame["label"].tolist() == [name]  # the sweep CSVs
    assert HELP_LINES[method] == name  # `sparsefinder sweep --help`
    if family in app_methods.APP_CALIBRATIONS:  # the app's menu + calibration radio
        assert app_methods.menu_label(family).endswith(f" · {display_name(family)}")
        if calibration:
            assert f"{display_name(family)}, {app_methods.calibration_label(calibration)}" \
                == name


def test_every_curve_is_listed_in_the_cli_help_under_its_display_name():
    assert set(HELP_LINES) == set(CURVES)
    assert all(HELP_LINES[c] == curve_display_name(c) for c in CURVES)
    assert curve_display_name("distance+window") == "Distance (t) + window 3"
    assert len(set(HELP_LINES.values())) == len(CURVES)  # no two curves read the same


def test_link_warnings_name_the_method_and_its_id():
    _, problems = parse_view_state({"method": "quest", "calibration": "budget"})
    assert f"{display_name('quest')} (`quest`)" in problems[0]
    _, problems = parse_view_state({"method": "distance-budget"})
    assert f"{display_name('distance:budget')} (`distance:budget`)" in problems[0]


def test_an_unknown_method_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown method 'magic'; choose from: .*distance"):
        display_name("magic")
