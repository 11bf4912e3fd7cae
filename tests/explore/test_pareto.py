"""The Pareto page's view-model: curated curves, groups in the link, clicked point → view."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from sparsefinder.evaluation.curves import CURVES, curve_spec
from sparsefinder.explore import pareto
from sparsefinder.explore.state import ViewState, parse_view_state, to_spec, view_state_to_params


def test_default_curves_are_few_registered_and_include_the_oracle() -> None:
    assert len(pareto.DEFAULT_CURVES) <= 8
    assert set(pareto.DEFAULT_CURVES) <= set(CURVES)
    assert "distance:budget" in pareto.DEFAULT_CURVES and "topk" in pareto.DEFAULT_CURVES
    assert pareto.curve_label("topk") == "Top-k by exact scores (reference)"
    assert pareto.curve_label("distance") == "Distance (t)"


def test_groups_cover_every_curve_and_add_to_the_default() -> None:
    assert {c for g in pareto.PAGE_GROUPS.values() for c in g} >= set(CURVES)
    available = list(CURVES)
    default = pareto.chosen_curves(available)
    assert default == [c for c in CURVES if c in pareto.DEFAULT_CURVES]
    with_block = pareto.chosen_curves(available, ["block"])
    assert set(with_block) == set(default) | set(pareto.PAGE_GROUPS["block"])
    assert pareto.chosen_curves(["window", "quest"], ["baselines"]) == ["window"]


def test_parse_groups_keeps_known_names_and_reports_the_rest() -> None:
    assert pareto.parse_groups(None) == ([], [])
    groups, problems = pareto.parse_groups("block, baselines,nope")
    assert groups == ["baselines", "block"]
    assert len(problems) == 1 and "nope" in problems[0] and "long-context" in problems[0]


def test_not_swept_is_one_line_with_the_command() -> None:
    assert pareto.not_swept_line({}) is None
    line = pareto.not_swept_line({"sparsebert-dams": "learned from training graphs (…)",
                                  "kmeans": "no centroids for B=20"})
    assert line is not None and "\n" not in line
    assert line.startswith("2 methods not swept here (need train graphs or other projections)")
    assert "`sparsefinder sweep --methods sparsebert-dams,kmeans --out DIR`" in line
    every = pareto.not_swept_line({c: "needs learned projections" for c in CURVES})
    assert "(need learned projections)" in every
    assert "`sparsefinder sweep --methods all --out DIR`" in every
    grouped = pareto.not_swept_line({c: "needs learned projections"
                                     for c in ("quest", "hashattention", "block-keys",
                                               "block")})
    assert "--methods long-context,block --out DIR" in grouped


def test_display_table_shows_a_dash_for_missing_values() -> None:
    frame = pd.DataFrame({"method": ["a", "b"], "recall@0.9": [0.91234, math.nan],
                          "note": [None, "x"]})
    shown = pareto.display_table(frame)
    assert shown["recall@0.9"].tolist() == ["0.912", "–"]
    assert shown["note"].tolist() == ["–", "x"]
    assert shown["method"].tolist() == ["a", "b"]


def _showable() -> list[tuple[str, dict]]:
    out = []
    for name, curve in CURVES.items():
        for spec in curve.specs:
            try:
                pareto.explorer_changes(name, spec.param_dict)
            except pareto.NotInExplorer:
                continue
            out.append((name, spec.param_dict))
    return out


@pytest.mark.parametrize("curve,params", _showable())
def test_a_clicked_point_becomes_the_same_predictor_in_the_explorer(curve, params) -> None:
    """Every point the mapping accepts, applied to a view state, stands for the sweep's own
    predictor: the same spec (window curve: the same built Window), and it survives the
    link (URL parameters) unchanged."""
    state = ViewState(global_tokens=("first",), window=9).with_(
        **pareto.explorer_changes(curve, params))
    want = curve_spec(curve, params)
    got = to_spec(state)
    if want.method == "window":
        # the app pins the family's own size to 0 and sets its window instead (a window of 0
        # builds nothing)
        assert got.method == "window" and got.param_dict == {"window": 0}
        assert got.build(None, 0) == want.build(None, 0)
    else:
        assert got == want
    reread, problems = parse_view_state(view_state_to_params(state))
    assert problems == [] and reread == state


def test_the_mapping_reaches_the_sliders_of_each_offered_family() -> None:
    showable = {c for c, _ in _showable()}
    assert {"distance", "distance+window", "distance:budget", "quantization", "kmeans",
            "kmeans+window", "kmeans-top2", "window", "rowfrac:budget", "kmeans-routed:budget",
            "quest", "hashattention", "longformer", "bigbird", "reformer", "routing", "topk",
            "topp", "rowfrac", "block"} <= showable
    assert pareto.explorer_changes("distance", {"threshold": 1.5})["t"] == 1.5
    calibrated = pareto.explorer_changes("distance:budget", {"target_sparsity": 0.8})
    assert calibrated["target_sparsity"] == 0.8
    assert pareto.explorer_changes("kmeans", {"n_clusters": 6, "top_k": 1})["clusters"] == 6
    assert pareto.explorer_changes("longformer", {"n_global": 4})["extra"] == (
        ("longformer.n_global", 4),)


@pytest.mark.parametrize("curve,params,why", [
    ("sparsebert-dams", {"target_sparsity": 0.9}, "offers sparsebert not at all"),
    ("distance-nodiag", {"threshold": 1.0}, "offers distance only in its plain form, not with "
                                             "diag=False"),
    ("kmeans-routed-top", {"n_clusters": 128, "n_routes": 4}, "not with mode=top"),
    ("topk", {"k": 256}, "k goes up to 128"),
    ("kmeans:budget", {"target_sparsity": 0.9}, "offers kmeans only as none"),
    ("quantization", {"bins": 32}, "bins goes up to 16"),
    ("window", {"window": 101}, "window goes up to 31"),
])
def test_points_the_explorer_cannot_show_say_why(curve, params, why) -> None:
    with pytest.raises(pareto.NotInExplorer, match=why):
        pareto.explorer_changes(curve, params)
