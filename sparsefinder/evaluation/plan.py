"""One sweep plan: every grid point fitted once, built once, or skipped with its reason.

The sweeps over records (:func:`sparsefinder.evaluation.sweep.sweep`), over shards
(:mod:`sparsefinder.evaluation.sharded_sweep`) and through the restricted model
(:mod:`sparsefinder.evaluation.accuracy_sweep`) all start from :func:`plan_sweep`: a curve
learned from training graphs is fitted once on ``train_records``, each of its specs is built
once for every layer, and a point that cannot be built here raises
:class:`~sparsefinder.methods.registry.MethodUnavailable`, recorded in ``skipped`` with the
reason instead of being scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sparsefinder.data.records import AttentionRecord
from sparsefinder.evaluation.curves import CURVES
from sparsefinder.methods.registry import MethodUnavailable
from sparsefinder.methods.spec import PredictorSpec
from sparsefinder.predictors.base import Predictor
from sparsefinder.projections.heads import HeadProjections


@dataclass(frozen=True)
class PlannedPoint:
    """One buildable grid point: its curve, its spec, what its fit learned, its predictors."""

    curve: str
    spec: PredictorSpec
    fitted: Any
    predictors: list[Predictor | None]


@dataclass
class SweepPlan:
    points: list[PlannedPoint] = field(default_factory=list)
    #: ``"curve {params}: reason"`` of every point that cannot be built here
    skipped: list[str] = field(default_factory=list)
    #: curves left out because they are learned from training graphs and none were given
    untrained: list[str] = field(default_factory=list)

    @property
    def specs(self) -> list[PredictorSpec]:
        return [point.spec for point in self.points]


def plan_sweep(
    names: Sequence[str],
    projections: HeadProjections | None,
    num_layers: int,
    train_records: Sequence[AttentionRecord] | None = None,
) -> SweepPlan:
    """Fit each curve once and build each of its points once (``names``: curve names)."""
    plan = SweepPlan()
    for name in names:
        curve = CURVES[name]
        if curve.needs_training and not train_records:
            plan.untrained.append(name)
            continue
        fitted = curve.specs[0].fit(train_records) if curve.needs_training else None
        for spec in curve.specs:
            try:
                predictors = spec.build_layers(projections, num_layers, fitted)
            except MethodUnavailable as error:  # e.g. no centroids stored for this B
                plan.skipped.append(f"{name} {spec.params_json()}: {error}")
                continue
            plan.points.append(PlannedPoint(name, spec, fitted, predictors))
    return plan
