"""Sweep entries for the calibrated distance predictors.

Each grid point is a TARGET (sparsity or recall), not a raw threshold, so the points of a
curve sit where they are asked to, whatever the projections' scale (an augmented low-rank
space has distances in the tens, the paper's in units of the margin). Thresholds are fitted
on the sweep's TRAIN records (``sweep(train_records=...)``, ``sparsefinder sweep
--train-passages N``), once per projections object: the train pairs are sampled and projected
once and every target re-uses the samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sparsefinder.calibration.estimators import CalibratedDistance, CalibratedRowFraction
from sparsefinder.calibration.floor import floored_fitter
from sparsefinder.calibration.grid import head_grid_fitter
from sparsefinder.calibration.samples import DistanceSamples
from sparsefinder.data.records import AttentionRecord
from sparsefinder.methods.registry import METHODS, method_id

#: Target sparsities: coarse below 0.75, every 0.01 from 0.75 to 0.99.
SPARSITY_TARGETS = [0.5, 0.6, 0.7] + [round(0.75 + 0.01 * i, 2) for i in range(25)]
RECALL_TARGETS = [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99]
#: A finer raw-threshold grid than the paper's for ``distance``: 0.05 … 5.0 in steps of 0.05.
DISTANCE_FINE_GRID = [round(0.05 * i, 2) for i in range(1, 101)]
#: Keys per row of the floored distance curves and the floor's default, and the curves'
#: cap on the floor (``floor_share`` c: row i keeps at most
#: ``min(m, max(1, ⌊c · (1 − target) · allowed_i⌋))`` floor keys; None: no cap, m keys in every
#: row). Chosen on TRAIN texts (``tools/choose_floor.py --lengths``: thresholds fitted on 100
#: train passages, the restricted model scored on the next 40, split into a short and a long
#: half): the setting with the best mean output cosine among those whose short AND long halves
#: both reach every target 0.75 / 0.90 / 0.95 was m = 12, c = 1; the uncapped m = 5 stops
#: short of 0.95 on short texts, its 5 keys being 5/n of every row (docs/results/quality.md).
DEFAULT_FLOOR = 12
DEFAULT_FLOOR_SHARE: float | None = 1.0
#: ``distance`` with the default floor, as it was named when it was a family of its own: an
#: alias, the names of its calibrated sweep curves (``distance-floor:budget``, so their CSVs
#: read as before) and the key of its thresholds in a calibration table
FLOOR_FORM = "distance-floor"
#: the app's first method: the floored distance under a sparsity budget (its curve's name)
FLOOR_CURVE = f"{FLOOR_FORM}:budget"
#: what a floored calibration is given besides the target
FLOOR_PARAMS = ("floor", "floor_share")

Params = dict[str, Any]


def calibrated_fitter(
    allocation: str, by: str, estimator: type = CalibratedDistance
) -> Callable[[Sequence[AttentionRecord]], Callable]:
    """``fit(train_records) -> factory(params, projections, layer)`` for the sweep registry;
    ``by`` is the grid key ("target_sparsity" or "target_recall"), ``estimator`` the
    calibrated class (:class:`CalibratedDistance` or :class:`CalibratedRowFraction`)."""
    rank_fractions = estimator is CalibratedRowFraction

    def fit(train_records: Sequence[AttentionRecord]) -> Callable:
        cache: dict[int, tuple[Any, DistanceSamples, dict[float, Any]]] = {}

        def build(p: Params, projections: Any, layer: int) -> Any:
            if projections is None:
                raise ValueError("calibrated distance needs learned projections; pass projections=")
            entry = cache.get(id(projections))
            if entry is None or entry[0] is not projections:
                samples = DistanceSamples.from_records(train_records, projections,
                                                       rank_fractions=rank_fractions)
                entry = (projections, samples, {})
                cache[id(projections)] = entry
            target = float(p[by])
            fitted = entry[2].get(target)
            if fitted is None:
                fitted = estimator(**{by: target}, allocation=allocation).fit(entry[1])
                entry[2][target] = fitted
            return fitted.for_layer(layer)

        return build

    return fit


@dataclass(frozen=True)
class CalibratedCurve:
    """A family under one calibration: its grid of targets and its ``fit``; ``old_name`` is
    the method name it had before calibration became a parameter (kept as an alias)."""

    family: str
    calibration: str
    grid: list[Params]
    fit: Callable[[Sequence[AttentionRecord]], Callable]
    old_name: str = ""  # "": a family without a name of the time before
    target: str = "target_sparsity"  # the parameter the calibration is given
    extra: tuple[str, ...] = ()  # the family's parameters given with the target, not fitted


def floor_or_plain(plain: Callable, floored: Callable) -> Callable:
    """``fit`` of a distance calibration that also takes a per-row ``floor`` (left out or 0:
    none): the floored fitter (thresholds fitted with the floor's density included) when the
    point asks for a floor, the plain one otherwise; each fits lazily, on its first build."""

    def fit(train_records: Sequence[AttentionRecord]) -> Callable:
        builds: dict[bool, Callable] = {}

        def build(p: Params, projections: Any, layer: int) -> Any:
            with_floor = bool(p.get("floor"))
            if with_floor not in builds:
                builds[with_floor] = (floored if with_floor else plain)(train_records)
            return builds[with_floor](p, projections, layer)

        return build

    return fit


def _sparsity_grid(**fixed: Any) -> list[Params]:
    return [{"target_sparsity": s, **fixed} for s in SPARSITY_TARGETS]


def floor_grid() -> list[Params]:
    """The floored distance curves' grid: every target with the default floor (and its
    cap, when there is one)."""
    share = {} if DEFAULT_FLOOR_SHARE is None else {"floor_share": DEFAULT_FLOOR_SHARE}
    return _sparsity_grid(floor=DEFAULT_FLOOR, **share)


def calibrated_methods() -> list[CalibratedCurve]:
    """Every calibrated family: the catalog registers each calibration of a family, and the
    sweep curves sweep each grid."""
    return [
        # a floor given (``floor`` > 0): thresholds fitted with the floor's density included,
        # so the target still holds
        *(CalibratedCurve("distance", allocation, _sparsity_grid(),
                          floor_or_plain(calibrated_fitter(allocation, "target_sparsity"),
                                         floored_fitter(allocation)), old, extra=FLOOR_PARAMS)
          for allocation, old in (("equal", "distance-calibrated"),
                                  ("budget", "distance-budget"))),
        CalibratedCurve("distance", "recall", [{"target_recall": r} for r in RECALL_TARGETS],
                        calibrated_fitter("equal", "target_recall"),
                        "distance-calibrated-recall", target="target_recall"),
        CalibratedCurve("rowfrac", "equal", _sparsity_grid(),
                        calibrated_fitter("equal", "target_sparsity", CalibratedRowFraction),
                        "rowfrac-calibrated"),
        CalibratedCurve("rowfrac", "budget", _sparsity_grid(),
                        calibrated_fitter("budget", "target_sparsity", CalibratedRowFraction),
                        "rowfrac-budget"),
    ]


def head_grid_curve(family: str, grid: Sequence[Params]) -> CalibratedCurve:
    """The per-head ("budget") calibration of a family that declares a raw ``head_grid``
    (B/k, β, window, key budget; :mod:`.grid`): one raw setting per head for a target."""
    return CalibratedCurve(family, "budget", _sparsity_grid(), head_grid_fitter(family, grid),
                           f"{family}-budget")


def calibrated_grids() -> dict[str, list[Params]]:
    """``family:calibration`` → grid of targets of every calibrated family (sweep curves),
    read from the registered families."""
    return {method_id(name, c.name): list(c.grid) for name, method in METHODS.items()
            for c in method.calibrations if c.grid}


def fitted_build(params: Params, context: Any) -> Any:
    """``Method.build`` of a calibrated method: the fitted factory (``context.parts.calibration``,
    what :func:`calibrated_fitter` returned or a table's settings) for these params,
    projections and layer."""
    factory = context.parts.calibration
    if factory is None:
        raise ValueError("calibrated methods are fitted on training graphs; pass train_records=")
    return factory(params, context.projections, context.layer)
