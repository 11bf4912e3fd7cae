"""One resolver of the learned parts a method is built from.

A method's parameters are not all it needs: calibrated forms read a calibration table (and
the projections it was fitted for), HashAttention its learned codes, learned block
Sparsefinder its block projections, the raw learned families the projections. Instead of
each caller looking these up by method name, a :class:`LearnedParts` holds what is at hand
and :meth:`LearnedParts.resolve` hands a spec's ``build`` the projections and the fitted part
it takes. (A sweep with training records fits them instead: ``PredictorSpec.fit``.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparsefinder.bundle import bundle
from sparsefinder.calibration.table import CalibrationTable
from sparsefinder.files import SparsefinderFileError
from sparsefinder.methods.registry import method_id, resolve_method
from sparsefinder.methods.spec import PredictorSpec
from sparsefinder.predictors.base import Predictor
from sparsefinder.projections.blocks import bundled_block_projections_by_size
from sparsefinder.projections.hash_code_table import HashCodeTable, bundled_hash_codes
from sparsefinder.projections.heads import HeadProjections


@dataclass(frozen=True)
class LearnedParts:
    """What is at hand for building predictors of one model.

    ``projections``: the learned space of the raw families (with k-means centroids for
    k-means); ``calibration`` with ``calibration_projections``: the budget-calibrated forms
    and the projections they were fitted for; ``hash_codes``: HashAttention's codes;
    ``block_projections``: learned block projections by block size.
    """

    projections: HeadProjections | None = None
    calibration: CalibrationTable | None = None
    calibration_projections: HeadProjections | None = None
    hash_codes: HashCodeTable | None = None
    block_projections: Mapping[int, Any] | None = None

    def resolve(self, method: str | PredictorSpec) -> tuple[HeadProjections | None, Any]:
        """``(projections, fitted)`` that ``method``'s ``build`` takes (a spec or a written
        method such as ``distance:budget``); ``fitted`` is None where nothing fitted is held
        (building a method that needs one then says what is missing)."""
        written = method.method_id if isinstance(method, PredictorSpec) else str(method)
        family, calibration = resolve_method(written, warn=False)
        written = method_id(family, calibration)
        if calibration != "none":
            if self.calibration is None or not self.calibration.has(written):
                return self.projections, None
            own = self.calibration_projections or self.projections
            return own, self.calibration.fitted_for(written)
        if family == "hashattention":
            return self.projections, self.hash_codes.maps if self.hash_codes else None
        if family == "block-learned":
            return self.projections, self.block_projections
        return self.projections, None

    def build_layers(self, spec: PredictorSpec, num_layers: int) -> list[Predictor | None]:
        """The spec's per-layer predictors, built with the parts it takes."""
        projections, fitted = self.resolve(spec)
        return spec.build_layers(projections, num_layers, fitted)

    @classmethod
    def bundled(cls, model_id: str, projections: HeadProjections | None = None,
                calibration_path: Any = None) -> LearnedParts:
        """The parts the bundle holds for ``model_id`` (for another model: its prepared
        bundle's, else none), with the calibration table from ``calibration_path`` (default:
        the bundle's) and its own projections."""
        from sparsefinder.model_bundles import prepared_file

        table = own = None
        path = calibration_path or bundle().path("calibration")
        if calibration_path is None and model_id != bundle().model_id:
            path = prepared_file(model_id, "calibration") or path  # `sparsefinder prepare`
        try:
            table = CalibrationTable.load(path)
            if table.model_id == model_id:
                own = table.own_projections(path)
            else:
                table = None
        except (SparsefinderFileError, OSError, ValueError):
            table = None
        try:
            blocks = bundled_block_projections_by_size(model_id)
        except (SparsefinderFileError, OSError, ValueError):
            blocks = None
        return cls(projections=projections, calibration=table, calibration_projections=own,
                   hash_codes=bundled_hash_codes(model_id), block_projections=blocks or None)
