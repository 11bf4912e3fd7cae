"""Calibrated target-sparsity settings fitted on train graphs and shipped as a table."""

from __future__ import annotations

import pytest
import torch
from tolerances import bound

from sparsefinder.bundle import bundle
from sparsefinder.calibration.curves import DEFAULT_FLOOR, DEFAULT_FLOOR_SHARE
from sparsefinder.calibration.table import CalibrationError, CalibrationTable, file_digest
from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.methods.spec import PredictorSpec, RecordInputs, predict_record
from sparsefinder.metrics.scorer import Scorer
from sparsefinder.predictors.row_fraction import RowFraction
from sparsefinder.predictors.threshold_distance import ThresholdDistance
from sparsefinder.projections.heads import HeadProjections

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

HEADS, D, LAYERS = 2, 6, 2


def _record(gen: torch.Generator, n: int) -> AttentionRecord:
    layers = []
    for _ in range(LAYERS):
        q, k = torch.randn(HEADS, n, D, generator=gen), torch.randn(HEADS, n, D, generator=gen)
        scores = q @ k.transpose(-1, -2)
        gold = scores >= scores.topk(4, dim=-1).values[..., -1:]
        layers.append(LayerGraph(q, k, gold, torch.ones(int(gold.sum())) / 4, D**-0.5))
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=False, layers=layers)


@pytest.fixture(scope="module")
def fitted():
    gen = torch.Generator().manual_seed(0)
    train = [_record(gen, n) for n in range(20, 50, 3)]
    eye = torch.eye(D).expand(LAYERS, HEADS, D, D).clone()
    projections = HeadProjections(weight=eye, bias=torch.zeros(LAYERS, HEADS, D),
                                  model_id="synthetic", alpha=1.5)
    table = CalibrationTable.fit(train, projections, "digest", targets=[0.5, 0.8, 0.9])
    return table, projections, gen


def test_table_meets_its_targets_on_train_and_builds_the_predictors(fitted):
    table, projections, _ = fitted
    for method in ("distance", "rowfrac"):
        assert table.params[method].shape == (3, LAYERS, HEADS)
        for i, target in enumerate(table.targets):  # the budget is met on train, macro
            assert float(table.train_sparsity[method][i].mean()) == pytest.approx(target,
                                                                                 abs=0.02)
    assert isinstance(table.predictor("distance:budget", 0.9, 1), ThresholdDistance)
    assert isinstance(table.predictor("rowfrac", 0.8, 0), RowFraction)
    with pytest.raises(ValueError, match="not calibrated"):
        table.predictor("rowfrac-budget", 0.85, 0)
    with pytest.raises(ValueError, match="no 'quantization'"):
        table.predictor("quantization", 0.9, 0)
    with pytest.raises(ValueError, match="holds calibration 'budget' only"):
        table.predictor("distance:equal", 0.9, 0)


def test_a_table_saved_with_the_old_method_names_reads_under_the_families(fitted, tmp_path):
    """Files written before calibration was a parameter keyed methods ``distance-budget``."""
    table = fitted[0]
    path = table.save(tmp_path / "calibration.pt")
    payload = torch.load(path, weights_only=False)
    for key in ("params", "train_sparsity", "train_recall", "grids"):  # (no floor back then)
        payload[key] = {f"{name}-budget": value for name, value in payload[key].items()
                        if name != "distance-floor"}
    torch.save(payload, path)
    loaded = CalibrationTable.load(path)
    assert set(loaded.params) == {"distance", "rowfrac", "window"}
    assert set(table.params) == {"distance", "distance-floor", "rowfrac", "window"}
    assert torch.equal(loaded.params["distance"], table.params["distance"])
    assert loaded.has("distance-budget") and loaded.has("distance:budget")
    assert not loaded.has("distance") and not loaded.has("quantization:budget")
    assert loaded.methods() == ["distance:budget", "rowfrac:budget", "window:budget"]


def test_the_floored_distance_is_the_sweeps_fit_and_holds_one_floor(fitted):
    """``distance-floor:budget`` in a table: the thresholds a sweep's own fit gives on the same
    train records (floor DEFAULT_FLOOR capped by DEFAULT_FLOOR_SHARE), as a RowFloor; other
    floors and caps refused."""
    from sparsefinder.calibration.floor import CalibratedFlooredDistance
    from sparsefinder.calibration.samples import DistanceSamples
    from sparsefinder.methods.registry import MethodUnavailable
    from sparsefinder.predictors.row_floor import RowFloor

    table, projections, gen = fitted
    again = torch.Generator().manual_seed(0)  # the fixture's train records, drawn again
    train = [_record(again, n) for n in range(20, 50, 3)]
    assert table.metadata["floor"] == DEFAULT_FLOOR and table.has("distance-floor:budget")
    assert table.floor_share == DEFAULT_FLOOR_SHARE == 1.0
    samples = DistanceSamples.from_records(train, projections, 1024, 0, row_ranks=True)
    for i, target in enumerate(table.targets):
        own = CalibratedFlooredDistance(target, DEFAULT_FLOOR, "budget",
                                        DEFAULT_FLOOR_SHARE).fit(samples)
        assert torch.equal(table.params["distance-floor"][i], own.sq_thresholds_.float())
    held = {"target_sparsity": 0.8, "floor": DEFAULT_FLOOR, "floor_share": DEFAULT_FLOOR_SHARE}
    built = table.fitted_for("distance-floor:budget")(held, projections, 1)
    assert isinstance(built, RowFloor) and built.floor == DEFAULT_FLOOR
    assert built.row_share == pytest.approx(DEFAULT_FLOOR_SHARE * (1 - 0.8))
    assert torch.equal(built.base.sq_thresholds, table.params["distance-floor"][1, 1])
    record = _record(gen, 30)
    q, k = record.layers[1].queries, record.layers[1].keys
    # every row its floor, capped by its length: min(12, max(1, ⌊0.2 · 30⌋)) = 6 keys
    assert (built.predict(q, k).sum(-1) >= 6).all()
    for other in ({"target_sparsity": 0.8, "floor": 3},
                  {"target_sparsity": 0.8, "floor": DEFAULT_FLOOR},  # uncapped
                  {"target_sparsity": 0.8, "floor": DEFAULT_FLOOR, "floor_share": 0.5}):
        with pytest.raises(MethodUnavailable, match=f"floor={DEFAULT_FLOOR}"):
            table.fitted_for("distance-floor:budget")(other, projections, 0)
    none = CalibrationTable.fit(train[:3], projections, "digest", targets=[0.9], floor=None,
                                grid_methods=())
    assert "distance-floor" not in none.params and "floor" not in none.metadata


def test_distance_with_a_floor_reads_the_tables_floored_thresholds(fitted):
    """``distance:budget`` given ``floor`` (and its cap) builds what ``distance-floor:budget``
    builds from the same table; without a floor (left out or 0) the plain thresholds."""
    from sparsefinder.methods.registry import MethodUnavailable
    from sparsefinder.predictors.row_floor import RowFloor

    table, projections, _ = fitted
    held = {"target_sparsity": 0.8, "floor": DEFAULT_FLOOR, "floor_share": DEFAULT_FLOOR_SHARE}
    floored = table.fitted_for("distance:budget")(held, projections, 1)
    old = table.fitted_for("distance-floor:budget")(held, projections, 1)
    assert isinstance(floored, RowFloor) and floored.floor == old.floor
    assert floored.row_share == old.row_share
    assert torch.equal(floored.base.sq_thresholds, old.base.sq_thresholds)
    for plain in ({"target_sparsity": 0.8}, {"target_sparsity": 0.8, "floor": 0}):
        built = table.fitted_for("distance:budget")(plain, projections, 1)
        assert not isinstance(built, RowFloor)
        assert torch.equal(built.sq_thresholds, table.params["distance"][1, 1])
    with pytest.raises(MethodUnavailable, match="floor="):
        table.fitted_for("distance:budget")({"target_sparsity": 0.8, "floor": 3}, projections, 0)
    bare = CalibrationTable(table.model_id, "digest", table.targets,
                            {"distance": table.params["distance"]})
    with pytest.raises(MethodUnavailable, match="no floored distance"):
        bare.fitted_for("distance:budget")(held, projections, 0)


def test_a_table_fitted_at_another_floor_builds_predictors_with_that_floor(fitted, tmp_path):
    """A table fitted with ``floor=2`` (not DEFAULT_FLOOR) holds thresholds fitted with 2 floor
    keys a row, and every way of building its ``distance-floor:budget`` predictor — the table's
    own, a sweep's (no floor given, or the table's), the saved and reloaded table's — floors
    each row at 2 keys, not at the default's 5; asking for the default floor is refused."""
    from sparsefinder.calibration.floor import CalibratedFlooredDistance
    from sparsefinder.calibration.samples import DistanceSamples
    from sparsefinder.methods.registry import MethodUnavailable
    from sparsefinder.predictors.row_floor import RowFloor

    _, projections, _ = fitted
    floor, target = 2, 0.9
    assert floor != DEFAULT_FLOOR
    again = torch.Generator().manual_seed(0)  # the fixture's train records, drawn again
    train = [_record(again, n) for n in range(20, 50, 3)]
    table = CalibrationTable.fit(train, projections, "digest", targets=[target], floor=floor,
                                 grid_methods=(), floor_share=None)  # uncapped
    assert table.metadata["floor"] == floor and table.floor_share is None
    samples = DistanceSamples.from_records(train, projections, 1024, 0, row_ranks=True)
    own = CalibratedFlooredDistance(target, floor, "budget").fit(samples).sq_thresholds_.float()
    default = CalibratedFlooredDistance(target, DEFAULT_FLOOR, "budget").fit(samples)
    assert torch.equal(table.params["distance-floor"][0], own)  # fitted with ITS floor
    assert not torch.equal(own, default.sq_thresholds_.float())
    record = _record(torch.Generator().manual_seed(7), 40)
    q, k = record.layers[1].queries, record.layers[1].keys
    expected = RowFloor(ThresholdDistance(own[1]), floor).predict(q, k)
    with_default = RowFloor(ThresholdDistance(own[1]), DEFAULT_FLOOR).predict(q, k)
    assert not torch.equal(expected, with_default)  # the check below can tell them apart
    assert (expected.sum(-1) < DEFAULT_FLOOR).any() and (expected.sum(-1) >= floor).all()
    reloaded = CalibrationTable.load(table.save(tmp_path / "calibration.pt"))
    build = table.fitted_for("distance-floor:budget")
    for built in (table.predictor("distance-floor:budget", target, 1),
                  build({"target_sparsity": target}, projections, 1),
                  build({"target_sparsity": target, "floor": floor}, projections, 1),
                  reloaded.predictor("distance-floor:budget", target, 1)):
        assert isinstance(built, RowFloor) and built.floor == floor
        assert torch.equal(built.predict(q, k), expected)
    with pytest.raises(MethodUnavailable, match=f"floor={floor}"):
        build({"target_sparsity": target, "floor": DEFAULT_FLOOR}, projections, 1)


def test_an_old_table_without_the_cap_loads_as_the_uncapped_floor(fitted, tmp_path):
    """Tables written before the cap was recorded have no ``floor_share``: they load, and their
    ``distance-floor:budget`` is the uncapped floor they were fitted with (each row its
    ``floor`` nearest keys); asking them for a cap is refused."""
    from sparsefinder.methods.registry import MethodUnavailable
    from sparsefinder.predictors.row_floor import RowFloor

    table, projections, gen = fitted
    again = torch.Generator().manual_seed(0)
    train = [_record(again, n) for n in range(20, 50, 3)]
    old = CalibrationTable.fit(train, projections, "digest", targets=[0.9], floor=5,
                               grid_methods=(), floor_share=None)
    del old.metadata["floor_share"]  # as written before the field
    loaded = CalibrationTable.load(old.save(tmp_path / "old.pt"))
    assert "floor_share" not in loaded.metadata and loaded.floor_share is None
    build = loaded.fitted_for("distance-floor:budget")
    for built in (loaded.predictor("distance-floor:budget", 0.9, 1),
                  build({"target_sparsity": 0.9, "floor": 5}, projections, 1)):
        assert isinstance(built, RowFloor) and built.row_share is None and built.floor == 5
    record = _record(gen, 24)
    q, k = record.layers[1].queries, record.layers[1].keys
    assert (built.predict(q, k).sum(-1) >= 5).all()  # uncapped: 5 keys even at 0.9 of 24
    with pytest.raises(MethodUnavailable, match="floor_share=None"):
        build({"target_sparsity": 0.9, "floor": 5, "floor_share": 1.0}, projections, 1)


def test_held_out_sparsity_lands_near_the_target(fitted):
    table, projections, gen = fitted
    held_out = [_record(gen, n) for n in range(21, 51, 5)]
    spec = PredictorSpec.of("rowfrac", {"target_sparsity": 0.9}, calibration="budget")
    predictors = spec.build_layers(projections, LAYERS, table.fitted_for("rowfrac"))
    sparsity = [float(Scorer(r).score(predict_record(spec, predictors,
                                                     RecordInputs(r, projections))).sparsity.mean())
                for r in held_out]
    assert sum(sparsity) / len(sparsity) == pytest.approx(0.9, abs=0.03)


def test_save_load_and_refusals(fitted, tmp_path):
    table, _, _ = fitted
    path = table.save(tmp_path / "calibration.pt")
    loaded = CalibrationTable.load(path, projections_sha256="digest")
    assert loaded.targets == table.targets
    assert torch.equal(loaded.params["rowfrac"], table.params["rowfrac"])
    with pytest.raises(CalibrationError, match="other projections"):
        CalibrationTable.load(path, projections_sha256="another")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(CalibrationError, match="not a readable calibration file"):
        CalibrationTable.load(bad)


def test_the_bundled_table_names_and_matches_its_projections():
    table = CalibrationTable.load(bundle().path("calibration"))
    assert table.projections_file == "projections-r8-lowrank-mass.pt"
    paper = bundle().path("projections.pt")
    assert table.projections_sha256 == file_digest(paper.with_name(table.projections_file))
    assert file_digest(paper) != table.projections_sha256  # not the paper file
    assert 0.9 in table.targets and set(table.params) == {
        "distance", "distance-floor", "rowfrac", "kmeans-routed", "window"}
    assert table.metadata["floor"] == DEFAULT_FLOOR
    assert table.floor_share == DEFAULT_FLOOR_SHARE
    assert table.params["rowfrac"].shape[1:] == (6, 12)
    assert table.metadata["split"] == "train"
    projections = table.own_projections(bundle().path("calibration"))
    assert projections.model_id == table.model_id and projections.weight.shape[2] >= 8


def test_per_head_grid_methods_in_the_table(fitted, tmp_path):
    from sparsefinder.predictors import Window
    from sparsefinder.predictors.per_head import PerHeadSelect

    table, projections, _ = fitted
    # routed k-means has no key codebooks for the synthetic model: left out, not an error
    assert "window" in table.params and "kmeans-routed" not in table.params
    choice = table.params["window"][table.index(0.8), 1].long()
    predictor = table.predictor("window", 0.8, 1)
    assert isinstance(predictor, PerHeadSelect)
    q = k = torch.zeros(HEADS, 9, 2)
    for head, index in enumerate(choice.tolist()):
        window = table.grids["window"][index]["window"]
        assert torch.equal(predictor.predict(q, k)[head], Window(window).predict(q, k)[head])
    # the table stores float32: one rounding of each head's value, then their mean
    assert float(table.train_sparsity["window"][table.index(0.8)].mean()) >= 0.8 - bound(
        1.0, terms=HEADS + 2)
    table.projections_file = "proj.pt"
    path = table.save(tmp_path / "calibration.pt")
    loaded = CalibrationTable.load(path)
    assert loaded.grids == table.grids and loaded.projections_file == "proj.pt"
    with pytest.raises(CalibrationError, match="proj.pt .* is missing"):
        loaded.own_projections(path)
    projections.save(tmp_path / "proj.pt")
    with pytest.raises(CalibrationError, match="not the file the table was fitted for"):
        loaded.own_projections(path)  # fitted for "digest", not this file
    loaded.projections_sha256 = file_digest(tmp_path / "proj.pt")
    assert torch.equal(loaded.own_projections(path).weight, projections.weight)
