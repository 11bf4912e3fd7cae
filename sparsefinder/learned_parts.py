"""One resolver of the learned parts a method is built from.

A method's parameters are not all it needs: calibrated forms read a calibration table (and
the projections it was fitted for), HashAttention its learned codes, learned block
Sparsefinder its block projections, the raw learned families the projections. Each family
declares which (``Method.needs``); a :class:`LearnedParts` holds what is at hand for one model
and :meth:`LearnedParts.for_method` hands a spec's ``build`` the typed bundle
(:class:`~sparsefinder.methods.parts.Parts`) of what it declared, with no family name looked
at. :func:`calibration_for` is the one rule of which calibration table a model reads (the
library's and the app's). (A sweep with training records fits the parts instead:
``PredictorSpec.fit``.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparsefinder.bundle import bundle
from sparsefinder.calibration.table import CalibrationTable
from sparsefinder.files import SparsefinderFileError
from sparsefinder.methods.parts import Parts
from sparsefinder.methods.registry import (
    Variant,
    alias_params,
    get_method,
    method_id,
    resolve_method,
)
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

    def for_method(self, method: str | PredictorSpec) -> Parts:
        """The parts ``method``'s ``build`` takes (a spec or a written method such as
        ``distance:budget``), cut to what its family declared; a part not held is None
        (building a method that needs one then says what is missing)."""
        written, variant = method_variant(method)
        held = Parts(projections=self.projections,
                     hash_codes=self.hash_codes.maps if self.hash_codes else None,
                     block_projections=self.block_projections)
        if variant.fits == "calibration" and self.calibration is not None \
                and self.calibration.has(written):  # the table's settings, its projections
            held = Parts(projections=self.calibration_projections or self.projections,
                         calibration=self.calibration.fitted_for(written))
        return held.only(variant.needs)

    def fitted(self, method: str | PredictorSpec) -> Any:
        """The held part that stands for what ``method``'s ``fit`` returns (the field its family
        declared its fit makes), or None: for callers that pass ``(projections, fitted)``."""
        return getattr(self.for_method(method), method_variant(method)[1].fits, None)

    def build_layers(self, spec: PredictorSpec, num_layers: int) -> list[Predictor | None]:
        """The spec's per-layer predictors, built with the parts it takes."""
        return spec.build_layers(self.for_method(spec), num_layers)

    @classmethod
    def bundled(cls, model_id: str, projections: HeadProjections | None = None,
                calibration_path: Any = None) -> LearnedParts:
        """The parts the bundle holds for ``model_id`` (for another model: its prepared
        bundle's, else none), with the calibration table from ``calibration_path`` (default:
        the bundle's) and its own projections."""
        table, own = calibration_for(model_id, calibration_path)
        try:
            blocks = bundled_block_projections_by_size(model_id)
        except (SparsefinderFileError, OSError, ValueError):
            blocks = None
        return cls(projections=projections, calibration=table, calibration_projections=own,
                   hash_codes=bundled_hash_codes(model_id), block_projections=blocks or None)


def method_variant(method: str | PredictorSpec) -> tuple[str, Variant]:
    """``method`` as written (``distance:budget``) and the variant its parameters pick (an old
    form's name, ``block-learned``, picks the form it names)."""
    if isinstance(method, PredictorSpec):
        return method.method_id, method.variant
    family, calibration = resolve_method(str(method), warn=False)
    variant = get_method(family).variant(calibration, alias_params(str(method)))
    return method_id(family, calibration), variant


def calibration_for(model_id: str, path: str | Path | None = None,
                    projections_digest: str | None = None
                    ) -> tuple[CalibrationTable | None, HeadProjections | None]:
    """The calibration table ``model_id`` reads and the projections it was fitted for:
    ``path``'s (default: the bundle's, for another model its prepared bundle's), when it was
    fitted for this model. A table naming no projections file serves only the projections with
    ``projections_digest`` (then ``(table, None)``: the caller's own projections). ``(None,
    None)`` otherwise: the calibrated forms are off."""
    from sparsefinder.model_bundles import prepared_file

    if path is None:
        path = bundle().path("calibration")
        if model_id != bundle().model_id:
            path = prepared_file(model_id, "calibration") or path  # `sparsefinder prepare`
    if not Path(path).is_file():
        return None, None
    try:
        table = CalibrationTable.load(path)
        if table.model_id != model_id:
            return None, None
        if table.projections_file:
            return table, table.own_projections(path)
        if projections_digest is not None and table.projections_sha256 == projections_digest:
            return table, None
    except (SparsefinderFileError, OSError, ValueError):
        pass
    return None, None
