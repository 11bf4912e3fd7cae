"""Thresholds calibrated with a per-row floor: the target sparsity holds with the floor."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from sparsefinder.attention.masks import layer_allowed
from sparsefinder.calibration.estimators import CalibratedDistance
from sparsefinder.calibration.floor import CalibratedFlooredDistance, floored_fitter
from sparsefinder.calibration.samples import RANK_CAP, DistanceSamples, _capped_ranks
from sparsefinder.data.records import AttentionRecord
from sparsefinder.methods.spec import PredictorSpec, RecordInputs, predict_record
from sparsefinder.metrics.measures import recall
from sparsefinder.predictors.row_floor import RowFloor
from sparsefinder.predictors.threshold_distance import ThresholdDistance
from tests.calibration.test_estimators import _identity, _record, _records


@pytest.fixture(scope="module")
def train() -> list[AttentionRecord]:
    return _records(0, 40)


@pytest.fixture(scope="module")
def samples(train) -> DistanceSamples:
    return DistanceSamples.from_records(train, _identity(), samples_per_text=512,
                                        row_ranks=True)


def _macro(predictor_of, records: list[AttentionRecord]) -> tuple[float, float, float]:
    """Macro sparsity and recall (each text and head weighing the same), and the smallest
    number of keys any row kept, of per-layer predictors over ``records``."""
    projections = _identity()
    sparsities, recalls, fewest = [], [], None
    for record in records:
        for layer, ((q, k), graph) in enumerate(zip(projections.project_record(record),
                                                    record.layers, strict=True)):
            n, m = graph.gold.shape[1:]
            allowed = layer_allowed(n, m, causal=record.causal,
                                    sliding_window=graph.sliding_window)
            mask = predictor_of(layer).predict(q, k, causal=record.causal,
                                               sliding_window=graph.sliding_window)
            total = n * m if allowed is None else int(allowed.sum())
            sparsities.append(1 - mask.sum((1, 2)).double() / total)
            recalls.append(recall(mask, graph.gold).double())
            kept = int(mask.sum(-1).min())
            fewest = kept if fewest is None else min(fewest, kept)
    return (float(torch.stack(sparsities).mean()), float(torch.stack(recalls).mean()),
            fewest)


def test_ranks_count_the_nearer_allowed_keys() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 30, 3, generator=gen), torch.randn(2, 30, 3, generator=gen)
    for window in (None, 6):
        mask = layer_allowed(30, 30, causal=True, sliding_window=window)
        flat = mask.reshape(-1).nonzero()[:, 0][torch.randint(0, int(mask.sum()), (2, 50),
                                                              generator=gen)]
        got = _capped_ranks(q, k, mask, flat)
        dist = torch.cdist(q.double(), k.double()).masked_fill(~mask, torch.inf)
        own = dist.reshape(2, -1).gather(1, flat)
        rows = dist.gather(1, (flat // 30)[..., None].expand(-1, -1, 30))
        assert torch.equal(got.long(), (rows < own[..., None]).sum(-1).clamp(max=RANK_CAP))


@pytest.mark.parametrize(("target", "allocation", "floor"),
                         [(0.75, "budget", 1), (0.85, "budget", 3), (0.85, "equal", 3)])
def test_sparsity_on_train_lands_at_the_target_with_the_floor(
        samples, train, floor, allocation, target) -> None:
    model = CalibratedFlooredDistance(target, floor, allocation).fit(samples)
    assert abs(float(model.train_sparsity_.mean()) - target) < 0.005
    measured, _, fewest = _macro(model.for_layer, train)
    assert abs(measured - target) < 0.01
    assert fewest >= 1  # every row of every head kept at least min(floor, allowed) >= 1
    # the same thresholds without the floor's density would overshoot the budget
    plain = CalibratedDistance(target_sparsity=target, allocation=allocation).fit(samples)
    with_floor_plain, _, _ = _macro(
        lambda layer: type(model.for_layer(layer))(plain.for_layer(layer), floor), train)
    assert with_floor_plain < target - 0.002


def test_causal_and_local_rows_keep_their_floor() -> None:
    train = _records(2, 20, causal=True)
    for record in train[:10]:
        for graph in record.layers:
            graph.sliding_window = 12  # a local layer
    samples = DistanceSamples.from_records(train, _identity(), 512, row_ranks=True)
    model = CalibratedFlooredDistance(0.75, 2).fit(samples)
    assert abs(float(model.train_sparsity_.mean()) - 0.75) < 0.005
    measured, _, _ = _macro(model.for_layer, train)
    assert abs(measured - 0.75) < 0.015
    for record in train:
        projections = _identity()
        for layer, ((q, k), graph) in enumerate(zip(projections.project_record(record),
                                                    record.layers, strict=True)):
            n = q.shape[1]
            mask = model.for_layer(layer).predict(q, k, causal=True,
                                                  sliding_window=graph.sliding_window)
            allowed = layer_allowed(n, n, causal=True, sliding_window=graph.sliding_window)
            assert (mask.sum(-1) >= allowed.sum(-1).clamp(max=2)).all()
            assert not (mask & ~allowed).any()


def test_a_floor_denser_than_the_target_keeps_only_the_floor(samples) -> None:
    model = CalibratedFlooredDistance(0.99, 8).fit(samples)
    assert torch.allclose(model.train_sparsity_, model.floor_sparsity_)
    assert float(model.train_sparsity_.mean()) < 0.99


def test_the_sweep_factory_builds_a_spec_from_train_records(train) -> None:
    spec = PredictorSpec.of("distance-floor:budget", {"target_sparsity": 0.8, "floor": 2})
    assert spec.needs_training
    fitted = spec.fit(train)
    predictors = spec.build_layers(_identity(), 2, fitted)
    masks = predict_record(spec, predictors, RecordInputs(train[0], _identity()))
    assert all((mask.sum(-1) >= 2).all() for mask in masks)
    assert floored_fitter("budget")(train)({"target_sparsity": 0.8, "floor": 2}, _identity(),
                                           1).floor == 2


def test_distance_with_a_floor_is_the_floored_family(train) -> None:
    """``distance`` given ``floor`` m: the masks of ``distance-floor`` (raw and calibrated, the
    thresholds fitted with the floor's density); a floor of 0 or none: plain ``distance``."""
    inputs = RecordInputs(train[0], _identity())

    def masks(method: str, params: dict) -> list[torch.Tensor]:
        spec = PredictorSpec.of(method, params)
        fitted = spec.fit(train) if spec.needs_training else None
        return predict_record(spec, spec.build_layers(_identity(), 2, fitted), inputs)

    pairs = [("distance-floor:budget", "distance:budget",
              {"target_sparsity": 0.8, "floor": 3, "floor_share": 0.5}),
             ("distance-floor", "distance", {"threshold": 0.5, "floor": 3})]
    for old, new, params in pairs:
        assert all(torch.equal(a, b)
                   for a, b in zip(masks(old, params), masks(new, params), strict=True))
    for plain in ({"target_sparsity": 0.8}, {"target_sparsity": 0.8, "floor": 0}):
        got = masks("distance:budget", plain)
        assert all(torch.equal(a, b) for a, b in
                   zip(got, masks("distance:budget", {"target_sparsity": 0.8}), strict=True))
    no_floor = masks("distance", {"threshold": 0.5, "floor": 0})
    assert all(torch.equal(a, b) for a, b in
               zip(no_floor, masks("distance", {"threshold": 0.5}), strict=True))
    floored = masks("distance:budget", {"target_sparsity": 0.8, "floor": 3})
    assert all((mask.sum(-1) >= 3).all() for mask in floored)


def test_errors(samples) -> None:
    with pytest.raises(ValueError, match="target_sparsity"):
        CalibratedFlooredDistance(1.0).fit(samples)
    with pytest.raises(ValueError, match="floor must be an integer"):
        CalibratedFlooredDistance(0.9, RANK_CAP + 1).fit(samples)
    with pytest.raises(ValueError, match="allocation"):
        CalibratedFlooredDistance(0.9, 2, "both").fit(samples)
    plain = DistanceSamples(samples.pairs, samples.gold, samples.n_texts)
    with pytest.raises(TypeError, match="row_ranks=True"):
        CalibratedFlooredDistance(0.9, 2).fit(plain)
    with pytest.raises(ValueError, match="not fitted"):
        CalibratedFlooredDistance(0.9, 2).for_layer(0)


def test_the_curves_and_the_floor_parameter_default_to_the_floor_chosen_on_train() -> None:
    from sparsefinder.calibration.curves import (
        DEFAULT_FLOOR,
        DEFAULT_FLOOR_SHARE,
        calibrated_grids,
    )
    from sparsefinder.evaluation.curves import CURVES
    from sparsefinder.methods.registry import alias_params, get_method

    # the floor chosen on train for every length (tools/choose_floor.py --lengths)
    assert (DEFAULT_FLOOR, DEFAULT_FLOOR_SHARE) == (12, 1.0)
    for name in ("distance-floor:budget", "distance-floor:equal"):  # the curves' old names
        specs = CURVES[name].specs
        assert {s.method_id for s in specs} == {name.replace("-floor", "")}
        assert {s.param_dict["floor"] for s in specs} == {DEFAULT_FLOOR}
        assert {s.param_dict.get("floor_share") for s in specs} == {DEFAULT_FLOOR_SHARE}
        assert "floor" not in calibrated_grids()[name.replace("-floor", "")][0]
    # the old family's name: distance with the default floor
    assert alias_params("distance-floor") == {"floor": DEFAULT_FLOOR}
    method = get_method("distance")
    for calibration in ("none", "budget", "equal"):
        params = {p.name: p for p in method.variant(calibration).params}
        assert params["floor"].optional and params["floor"].default is None  # none: no floor
        assert (params["floor"].low, params["floor"].url) == (0, "floor")
        if calibration == "none":  # a raw threshold has no target to take a share of
            assert "floor_share" not in params
        else:
            share = params["floor_share"]
            assert share.optional and share.default is None  # left out: uncapped
            assert (share.kind, share.low, share.high, share.low_open) == (float, 0, 1, True)
            assert share.url == "floor_share" and share.label


def _short(seed: int, count: int, low: int = 16, high: int = 28,
           causal: bool = False) -> list[AttentionRecord]:
    """Texts of ``low``–``high`` tokens: five keys per row are a fifth of a row or more."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=gen).tolist()
    return [_record(gen, n, causal) for n in lengths]


def _fitted(spec: PredictorSpec, train: list[AttentionRecord]):
    """``layer → predictor`` of a calibrated spec fitted on ``train``."""
    fitted = spec.fit(train)
    predictors = spec.build_layers(_identity(), train[0].num_layers, fitted)
    return predictors.__getitem__


def test_a_capped_floor_reaches_its_target_on_short_texts() -> None:
    """Five keys per row alone are denser than target 0.9 allows on texts of 16–28 tokens;
    capped at half the keys the target leaves each row, the calibrated curve lands on its
    target, on the calibration texts and on other short texts."""
    train, held_out = _short(3, 30), _short(4, 30)
    target = 0.9
    plain = _fitted(PredictorSpec.of("distance-floor:budget",
                                     {"target_sparsity": target, "floor": 5}), train)
    capped = _fitted(PredictorSpec.of("distance-floor:budget", {
        "target_sparsity": target, "floor": 5, "floor_share": 0.5}), train)
    for texts in (train, held_out):
        measured, _, _ = _macro(plain, texts)
        assert measured < target - 0.05  # the floor alone costs more than the target allows
        measured, _, fewest = _macro(capped, texts)
        assert abs(measured - target) < 0.01
        assert fewest >= 1
    samples = DistanceSamples.from_records(train, _identity(), 512, row_ranks=True)
    model = CalibratedFlooredDistance(target, 5, "budget", 0.5).fit(samples)
    assert abs(float(model.train_sparsity_.mean()) - target) < 0.005
    assert (model.floor_sparsity_ > target).all()  # the capped floor leaves the threshold room


@pytest.mark.parametrize("causal", [False, True])
def test_the_calibrated_floor_keeps_the_formulas_count_per_row(causal) -> None:
    """Through the sweep's spec: each row keeps at least ``min(m, max(1, ⌊c (1 − t) a⌋))``
    keys (a: the keys the row may see; causal rows i + 1, local rows their window), and the
    thresholds keeping nothing, exactly that many."""
    train = _short(5, 12, 20, 40, causal=causal)
    for record in train[:6]:
        for graph in record.layers:
            graph.sliding_window = 9  # local layers
    target, floor, share = 0.8, 6, 0.5
    spec = PredictorSpec.of("distance-floor:budget", {"target_sparsity": target,
                                                      "floor": floor, "floor_share": share})
    predictors = _fitted(spec, train)
    for record in train:
        for layer, ((q, k), graph) in enumerate(zip(_identity().project_record(record),
                                                    record.layers, strict=True)):
            n = q.shape[1]
            allowed = layer_allowed(n, n, causal=causal, sliding_window=graph.sliding_window)
            per_row = (torch.full((n,), n) if allowed is None else allowed.sum(-1)).tolist()
            exact = Fraction(str(share)) * (1 - Fraction(str(target)))  # no float rounding
            want = torch.tensor([min(floor, max(1, math.floor(exact * a))) for a in per_row])
            predictor = predictors(layer)
            assert predictor.row_share == pytest.approx(share * (1 - target))
            mask = predictor.predict(q, k, causal=causal, sliding_window=graph.sliding_window)
            assert (mask.sum(-1) >= want).all()
            floor_only = RowFloor(ThresholdDistance(torch.full((q.shape[0],), -1.0)), floor,
                                  predictor.row_share)
            alone = floor_only.predict(q, k, causal=causal, sliding_window=graph.sliding_window)
            assert torch.equal(alone.sum(-1), want.expand(q.shape[0], -1))
            if allowed is not None:
                assert not (mask & ~allowed).any()


def test_without_a_floor_share_the_masks_are_the_uncapped_ones(train) -> None:
    """``floor_share`` left out or None: the same spec, the same thresholds and the same
    masks as the uncapped floor."""
    absent = PredictorSpec.of("distance-floor:budget", {"target_sparsity": 0.8, "floor": 3})
    none = PredictorSpec.of("distance-floor:budget", {"target_sparsity": 0.8, "floor": 3,
                                                      "floor_share": None})
    assert absent == none and absent.key == none.key
    assert absent.params_json() == '{"floor": 3, "target_sparsity": 0.8}'
    samples = DistanceSamples.from_records(train, _identity(), row_ranks=True)
    reference = CalibratedFlooredDistance(0.8, 3, "budget").fit(samples)
    fitted = absent.fit(train)
    for layer in range(2):
        predictor = absent.build(_identity(), layer, fitted)
        assert predictor.row_share is None
        assert torch.equal(predictor.base.sq_thresholds, reference.sq_thresholds_[layer])
        for record in train[:5]:
            q, k = _identity().project_record(record)[layer]
            assert torch.equal(predictor.predict(q, k),
                               RowFloor(ThresholdDistance(reference.sq_thresholds_[layer]),
                                        3).predict(q, k))


def test_floor_share_errors(samples) -> None:
    with pytest.raises(ValueError, match="floor_share"):
        CalibratedFlooredDistance(0.9, 2, floor_share=0.0).fit(samples)
    with pytest.raises(ValueError, match="floor_share"):
        CalibratedFlooredDistance(0.9, 2, floor_share=1.5).fit(samples)
    with pytest.raises(ValueError, match="floor_share"):
        PredictorSpec.of("distance-floor:budget", {"target_sparsity": 0.9, "floor": 2,
                                                   "floor_share": 2.0})
    with pytest.raises(ValueError, match="unknown"):  # the raw family has no target to share
        PredictorSpec.of("distance-floor", {"threshold": 1.0, "floor": 2, "floor_share": 0.5})
    ranked = DistanceSamples(samples.pairs, samples.gold, samples.n_texts,
                             pair_rank=samples.pair_rank, gold_rank=samples.gold_rank)
    with pytest.raises(TypeError, match="row length"):
        CalibratedFlooredDistance(0.9, 2, floor_share=0.5).fit(ranked)


# the floor chosen on train by tools/choose_floor.py --lengths (docs/results/quality.md, "A
# floor that fits the length"): m = 12 keys, capped at the keys the target leaves the row
# (c = 1); the default of the curves, the catalog and the calibration table
LENGTH_RULE = {"floor": 12, "floor_share": 1.0}


@pytest.fixture(scope="module")
def by_length() -> dict[str, tuple[list[AttentionRecord], list[AttentionRecord]]]:
    """(train, held-out) texts of 20–28 tokens and of 120–160 tokens."""
    return {"short": (_short(5, 10, 20, 28), _short(7, 8, 20, 28)),
            "long": (_short(6, 5, 120, 160), _short(8, 4, 120, 160))}


@pytest.mark.parametrize("target", [0.75, 0.9, 0.95])
@pytest.mark.parametrize("length", ["short", "long"])
def test_the_length_rule_reaches_each_level_on_short_and_long_texts(by_length, length,
                                                                    target) -> None:
    """The capped floor alone never takes more than the target leaves a row, on any length,
    so the calibrated curve lands on its target on held-out short (20–28 tokens) and long
    (120–160) texts; the uncapped five-key floor alone is already denser than 0.9 and 0.95
    allow on the short ones (the curve cannot reach those levels there)."""
    train, held_out = by_length[length]
    rule = _fitted(PredictorSpec.of("distance-floor:budget",
                                    {"target_sparsity": target, **LENGTH_RULE}), train)
    measured, _, fewest = _macro(rule, held_out)
    assert abs(measured - target) < 0.01, measured
    assert fewest >= 1
    alone = RowFloor(None, LENGTH_RULE["floor"], row_share=LENGTH_RULE["floor_share"]
                     * (1.0 - target))
    assert _macro(lambda layer: alone, held_out)[0] >= target
    if length == "short" and target >= 0.9:
        plain = RowFloor(None, 5)
        assert _macro(lambda layer: plain, held_out)[0] < target - 0.05


@pytest.mark.parametrize("target", [0.75, 0.9, 0.95])
@pytest.mark.parametrize("length", ["short", "long"])
def test_the_default_path_reaches_each_level_on_short_and_long_texts(by_length, length,
                                                                     target) -> None:
    """The default method as the app runs it (``distance-floor:budget`` at its declared
    defaults, from a calibration table fitted with the table's defaults) is the length rule,
    and lands on each level on held-out short and long texts."""
    from sparsefinder.calibration.table import CalibrationTable
    from sparsefinder.explore.state import ViewState, to_spec

    train, held_out = by_length[length]
    table = CalibrationTable.fit(train, _identity(), "digest", targets=[target],
                                 samples_per_text=512, grid_methods=())
    assert (table.metadata["floor"], table.floor_share) == tuple(LENGTH_RULE.values())
    spec = to_spec(ViewState(target_sparsity=target), "distance-floor:budget")
    assert spec.param_dict == {"target_sparsity": target, **LENGTH_RULE}
    predictors = spec.build_layers(_identity(), train[0].num_layers,
                                   table.fitted_for("distance-floor:budget"))
    measured, _, fewest = _macro(predictors.__getitem__, held_out)
    assert abs(measured - target) < 0.01, measured
    assert fewest >= 1
