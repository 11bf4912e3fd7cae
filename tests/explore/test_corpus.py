"""sparsefinder.explore: corpus runs and sweeps of the app (no Streamlit)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sparsefinder.evaluation import curves
from sparsefinder.evaluation import sweep as sweeps
from sparsefinder.explore import corpus as excorpus
from sparsefinder.explore import inputs, live
from sparsefinder.explore import state as urlstate
from sparsefinder.explore.availability import available_methods

#: The raw (uncalibrated) distance family: ViewState defaults to its calibrated form.
RAW_DISTANCE = {"method": "distance", "calibration": "none"}


def test_available_curves_depend_on_projections(projections):
    without, skipped = curves.available_curves(None)
    assert "window" in without and "kmeans" not in without
    assert "projections" in skipped["kmeans"]
    assert "training graphs" in skipped["sparsebert-dams"]
    with_proj, skipped = curves.available_curves(projections)
    assert "distance" in with_proj and "topk" in with_proj
    # the grid needs B values the file does not hold
    assert "kmeans" not in with_proj and "B=" in skipped["kmeans"]


def test_sweep_records_reports_progress_once_per_text(prepared, projections):
    seen = []
    records = [prepared.record, prepared.record]
    frame = excorpus.sweep_records(records, projections, ["window", "distance"],
                                   on_progress=lambda f, msg: seen.append((f, msg)))
    assert set(frame.method) == {"window", "distance"}
    assert [f for f, _ in seen] == [0.5, 1.0] and "text 2 of 2" in seen[-1][1]
    assert 0 < frame.attrs["gold_sparsity"] < 1
    with pytest.raises(ValueError, match="no sweep method"):
        excorpus.sweep_records([prepared.record], None, [])


@pytest.mark.filterwarnings("ignore:skipping .* configurations")
@pytest.mark.parametrize(("curve", "state"), [
    ("distance+window", urlstate.ViewState(**RAW_DISTANCE, t=0.75, window=3,
                                           global_tokens=())),
    ("quantization", urlstate.ViewState(method="quantization", bins=3, window=0,
                                        global_tokens=())),
    ("kmeans-top2+window", urlstate.ViewState(method="kmeans", clusters=4, top_k=2, window=3,
                                              global_tokens=())),
    ("window", urlstate.ViewState(method="window", window=5, global_tokens=())),
])
def test_pareto_star_is_the_sweeps_point_for_the_same_setting(default_model, prepared,
                                                              projections, curve, state):
    """The star (live path) and the curve's point (sweep path) agree exactly, on one text and
    on several texts."""
    spec = live.spec_for(state, prepared)
    params = json.loads(spec.params_json())
    if curve == "window":
        params = {"window": 5}
        spec = curves.curve_spec("window", params)
    frame = sweeps.sweep([prepared.record], projections, [curve])
    row = frame[frame["params"] == json.dumps(params, sort_keys=True)]
    assert len(row) == 1, f"{params} is not a grid point of {curve}"
    star = live.summarize(live.score(prepared, live.predict(prepared, spec)), 0, 0)["model"]
    assert star.recall == row["recall"].iloc[0] and star.sparsity == row["sparsity"].iloc[0]
    other, _ = inputs.extract_one(default_model, "A second, different text. " * 3)
    records = [prepared.record, other]
    corpus = sweeps.sweep(records, projections, [curve])
    point = corpus[corpus["params"] == json.dumps(params, sort_keys=True)].iloc[0]
    star = live.score_setting(records, projections, spec)
    assert (star.recall, star.sparsity) == (point["recall"], point["sparsity"])
    assert star.gold_sparsity == corpus.attrs["gold_sparsity"]


def test_text_sweep_includes_the_calibrated_curves_of_the_bundled_table(record, projections):
    """The app cannot fit calibrated methods (no train graphs at hand): their curves come from
    the bundled table, built with the table's own projections, scored like any sweep row."""
    from sparsefinder.bundle import bundle
    from sparsefinder.calibration.table import CalibrationTable
    from sparsefinder.explore import prepared as prep
    from sparsefinder.methods.spec import PredictorSpec

    table = CalibrationTable.load(bundle().path("calibration"))
    own = table.own_projections(bundle().path("calibration"))
    prepared = prep.prepare(record, projections, calibration=table, calibration_projections=own)
    assert prepared.projections_for("distance:budget") is own
    assert prepared.projections_for("distance") is projections
    assert "kmeans-routed:budget" in available_methods(prepared)
    frame = excorpus.sweep_records([record], projections, ["window"], calibration=table,
                                   calibration_projections=own)
    assert set(frame.method) == {"window", *table.methods()}
    rows = frame[frame.method == "distance:budget"]
    assert set(rows.family) == {"distance"} and set(rows.calibration) == {"budget"}
    assert len(rows) == len(table.targets)
    row = rows[rows.params == json.dumps({"target_sparsity": 0.9})].iloc[0]
    # the same numbers as the Explorer shows for that setting
    spec = PredictorSpec.of("distance", {"target_sparsity": 0.9}, calibration="budget")
    scores = live.score(prepared, live.predict(prepared, spec))
    assert row.recall == pytest.approx(float(scores.recall.mean()), abs=1e-12)
    assert row.exact_fraction == pytest.approx(float(scores.exact_fraction.mean()), abs=1e-12)


def test_sweep_records_adds_the_hash_codes_curve(prepared):
    import torch

    from sparsefinder.evaluation import curves
    from sparsefinder.explore.corpus import sweep_records
    from sparsefinder.projections.hash_code_table import HashCodeTable

    record = prepared.record
    gen = torch.Generator().manual_seed(2)
    heads, d = record.num_heads, record.layers[0].queries.shape[-1]
    codes = HashCodeTable(model_id="m", alpha=1.5, maps=[
        (torch.randn(heads, d, 16, generator=gen), torch.randn(heads, d, 16, generator=gen))
        for _ in range(record.num_layers)])
    frame = sweep_records([record], prepared.projections, ["window"], hash_codes=codes)
    rows = frame[frame.method == "hashattention"]
    assert len(rows) == len(curves.CURVES["hashattention"].specs)
    assert (rows.recall.diff().dropna() >= -1e-12).all()  # a larger radius keeps more keys
    assert (frame[frame.method == "window"].n_texts == 1).all()
    assert "precision" in rows.columns and rows.precision.notna().all()


def test_each_curve_swept_alone_gives_the_rows_of_the_whole_sweep(prepared):
    """The app sweeps a text one curve at a time (only what it draws): every curve's rows equal
    the rows a sweep of all of them gives, and the curve list is the whole sweep's."""
    from sparsefinder.bundle import bundle
    from sparsefinder.calibration.table import CalibrationTable

    record, projections = prepared.record, prepared.projections
    table = CalibrationTable.load(bundle().path("calibration"))
    own = table.own_projections(bundle().path("calibration"))
    parts = {"calibration": table, "calibration_projections": own}
    methods = ["window", "distance", "topk"]
    whole = excorpus.sweep_records([record], projections, methods, **parts)
    names = excorpus.text_curves(methods, table)
    assert names[:len(methods)] == methods and set(whole.method) <= set(names)
    for name in ["window", "distance", "distance-floor:budget", "distance:budget"]:
        alone = excorpus.sweep_curve([record], projections, name, **parts)
        expected = whole[whole.method == name].reset_index(drop=True)
        pd.testing.assert_frame_equal(alone.reset_index(drop=True), expected, rtol=0, atol=1e-12)
        assert alone.attrs["gold_sparsity"] == whole.attrs["gold_sparsity"]
