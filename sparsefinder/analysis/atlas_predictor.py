"""The predictor the head atlas scores per head: chosen in ONE place.

By default it is the app's default setting (``explore.state.ViewState``:
``distance:budget`` with a ``floor``, the calibrated distance with each row's 12 nearest keys
(capped by the row's length), at target
sparsity 0.90, without window or global tokens, so the target is the sparsity),
built from the bundled calibration table with the projections file
that table names (the bundle's best, r = 8 lowrank-logistic), through
:class:`~sparsefinder.methods.spec.PredictorSpec` like every other number of the project.
Changing the method means changing :func:`default_spec` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from sparsefinder.bundle import bundle
from sparsefinder.calibration.curves import DEFAULT_FLOOR, DEFAULT_FLOOR_SHARE
from sparsefinder.calibration.table import CalibrationError, CalibrationTable
from sparsefinder.data.records import AttentionRecord
from sparsefinder.methods.spec import PredictorSpec, RecordInputs, predict_record
from sparsefinder.metrics.scorer import Scorer
from sparsefinder.projections.heads import HeadProjections, ProjectionsError

#: The app's default setting (a test keeps it equal to ``to_spec(ViewState())``).
ATLAS_METHOD = "distance:budget"
ATLAS_TARGET = 0.9
ATLAS_WINDOW = 0
ATLAS_GLOBAL: tuple[str, ...] = ()


def default_spec(target: float = ATLAS_TARGET) -> PredictorSpec:
    """The setting the atlas scores: the app's default setting at ``target`` sparsity."""
    share = {} if DEFAULT_FLOOR_SHARE is None else {"floor_share": DEFAULT_FLOOR_SHARE}
    return PredictorSpec.of(ATLAS_METHOD, {"target_sparsity": float(target),
                                           "floor": DEFAULT_FLOOR, **share},
                            window=ATLAS_WINDOW, global_tokens=ATLAS_GLOBAL)


@dataclass
class AtlasPredictor:
    """A spec with what builds it (projections, fitted calibration) and where it came from."""

    spec: PredictorSpec
    projections: HeadProjections | None
    fitted: Any = None
    source: str = ""
    _built: dict[int, list] = field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
        return self.spec.label()

    def scores(self, record: AttentionRecord, scorer: Scorer) -> dict[str, Tensor]:
        """Recall, mass recall, exact rows and sparsity per (layer, head) of one text."""
        layers = record.num_layers
        if layers not in self._built:
            self._built[layers] = self.spec.build_layers(self.projections, layers, self.fitted)
        vectors = RecordInputs(record, self.projections)
        preds = predict_record(self.spec, self._built[layers], vectors)
        return scorer.score(preds).metrics()


def calibrated_predictor(table_path: str | Path, model_id: str,
                         spec: PredictorSpec | None = None) -> AtlasPredictor:
    """``spec`` (default :func:`default_spec`) built from a calibration table and the
    projections file it names; a clear error when the table is for another model."""
    spec = spec or default_spec()
    table = CalibrationTable.load(table_path)
    if table.model_id != model_id:
        raise ValueError(f"{Path(table_path).name} was calibrated for {table.model_id!r}, not "
                         f"{model_id!r}; make one with `sparsefinder calibrate`")
    if not table.has(spec.method_id):
        raise ValueError(f"{Path(table_path).name} holds no {spec.method_id!r} settings "
                         f"(it has {', '.join(table.methods())})")
    projections = table.own_projections(table_path)
    return AtlasPredictor(spec, projections, table.fitted_for(spec.method_id),
                          source=f"{Path(table_path).name} + {table.projections_file}")


def bundled_predictor(model_id: str) -> AtlasPredictor | None:
    """The default setting for the bundled model (None for a model the bundle does not
    calibrate: the atlas then has no predictor columns)."""
    try:
        return calibrated_predictor(bundle().path("calibration"), model_id)
    except (ValueError, CalibrationError, ProjectionsError, FileNotFoundError):
        return None
