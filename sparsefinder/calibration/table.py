"""Calibrated settings fitted once on TRAIN graphs and shipped as a small file.

The calibrated predictors (:mod:`sparsefinder.calibration.estimators`) turn a *target
sparsity* into per-head parameters — a squared-distance threshold (``distance:budget``; with a
per-row floor of the ``m`` nearest keys, ``floor=m``, fitted with the floor's
density included) or a per-row keep fraction (``rowfrac:budget``), the heads sharing the
sparsity budget so that the mean recall is highest. Fitting needs the train split's gold
graphs, which an interactive app does not want to extract. So ``sparsefinder calibrate``
fits them for a grid of targets and writes a :class:`CalibrationTable` beside the
projections it was fitted for (a few KB); the app drives the calibrated methods from the
table, and a sweep with train records fits them itself (the same estimators, the same
numbers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sparsefinder.calibration.curves import (
    DEFAULT_FLOOR,
    DEFAULT_FLOOR_SHARE,
    FLOOR_FORM,
    SPARSITY_TARGETS,
)
from sparsefinder.calibration.estimators import CalibratedDistance, CalibratedRowFraction
from sparsefinder.calibration.floor import CalibratedFlooredDistance
from sparsefinder.calibration.grid import head_grid, layer_predictor, measure_grid
from sparsefinder.calibration.samples import DistanceSamples
from sparsefinder.data.records import AttentionRecord
from sparsefinder.files import (
    FileFormat,
    SparsefinderFileError,
    file_sha256,
    load_payload,
    save_payload,
)
from sparsefinder.methods.registry import METHODS, MethodUnavailable
from sparsefinder.predictors.row_floor import RowFloor
from sparsefinder.predictors.row_fraction import RowFraction
from sparsefinder.predictors.threshold_distance import ThresholdDistance
from sparsefinder.projections.heads import HeadProjections

FORMAT = "sparsefinder-calibration"
#: Families a table holds under ``calibration="budget"``, and the estimator of each.
ESTIMATORS = {"distance": CalibratedDistance, "rowfrac": CalibratedRowFraction}
#: The key of the floored distance (``distance:budget`` with a ``floor``) in a table, at ONE
#: floor (``metadata["floor"]``) and ONE
#: length cap (``metadata["floor_share"]``; tables written before the cap lack it: uncapped).
FLOOR_METHOD = FLOOR_FORM
#: Families whose per-head raw settings a table holds (:mod:`.grid`): those that do not read
#: the projections, so they hold whatever projections the table is fitted for.
GRID_METHODS = ("kmeans-routed", "window")
def old_keys() -> dict[str, str]:
    """Keys of tables written before calibration was a parameter (``distance-budget`` …):
    the old names of the families' budget calibrations."""
    return {old: family for old, (family, calibration) in METHODS.aliases().items()
            if calibration == "budget"}


def table_key(method: str) -> str:
    """The key of a family in a table: ``distance``, ``distance:budget`` and the old
    ``distance-budget`` all name ``distance`` (a table holds the budget calibration only)."""
    family, _, calibration = method.partition(":")
    if calibration and calibration != "budget":
        raise ValueError(f"a calibration table holds calibration 'budget' only, got {method!r}")
    return old_keys().get(family, family)


class CalibrationError(SparsefinderFileError):
    """A calibration file cannot be used; the message says why and how to make a new one."""


#: The calibration payload; files written before it had a version read as version 1.
CALIBRATION_FILE = FileFormat(
    FORMAT, "calibration file", "calibration",
    "`sparsefinder calibrate --projections FILE --out calibration.pt`", CalibrationError,
    unversioned=1)


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (names the projections a table was fitted for)."""
    return file_sha256(path)


@dataclass
class CalibrationTable:
    """Per-head parameters of each family under ``calibration="budget"`` at each target.

    ``params[family]`` is float32 (targets, layers, heads): squared thresholds for
    ``distance`` and :data:`FLOOR_METHOD` (``distance`` with ``metadata["floor"]`` keys per row,
    capped by the row's length with ``metadata["floor_share"]``, None or absent: uncapped),
    keep fractions for ``rowfrac``, indices into ``grids[family]`` (the raw settings) for
    the :data:`GRID_METHODS`; ``train_sparsity`` and ``train_recall`` the train estimates,
    same shapes. ``projections_file`` names the projections file (next to the table) it was
    fitted for, so an app can load them whatever its own projections.
    """

    model_id: str
    projections_sha256: str
    targets: list[float]
    params: dict[str, Tensor]
    train_sparsity: dict[str, Tensor] = field(default_factory=dict)
    train_recall: dict[str, Tensor] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    grids: dict[str, list[dict]] = field(default_factory=dict)
    projections_file: str = ""

    @classmethod
    def fit(cls, records: Sequence[AttentionRecord], projections: HeadProjections,
            projections_sha256: str, targets: Sequence[float] = SPARSITY_TARGETS,
            samples_per_text: int = 1024, seed: int = 0,
            grid_methods: Sequence[str] = GRID_METHODS,
            floor: int | None = DEFAULT_FLOOR, codebooks: Any = None,
            floor_share: float | None = DEFAULT_FLOOR_SHARE) -> CalibrationTable:
        """Fit every method of :data:`ESTIMATORS`, the floored distance with ``floor`` keys per
        row capped by ``floor_share`` (the floor None: not fitted; the share None: no cap) and
        ``grid_methods`` at every target on TRAIN records (``codebooks``: the key codebooks
        routed k-means is measured with, when they are not yet where the library looks them
        up: a bundle being prepared)."""
        # one draw serves every estimator: the floored one also reads each pair's rank in
        # its row, which does not change the pairs the others read
        samples = DistanceSamples.from_records(records, projections, samples_per_text, seed,
                                               rank_fractions=True, row_ranks=floor is not None)
        estimators = {method: [estimator(target_sparsity=float(t), allocation="budget")
                               for t in targets] for method, estimator in ESTIMATORS.items()}
        if floor is not None:
            estimators[FLOOR_METHOD] = [
                CalibratedFlooredDistance(float(t), int(floor), "budget", floor_share)
                for t in targets]
        params, sparsity, recall = {}, {}, {}
        for method, unfitted in estimators.items():
            fitted = [estimator.fit(samples) for estimator in unfitted]
            attr = "fractions_" if method == "rowfrac" else "sq_thresholds_"
            params[method] = torch.stack([getattr(f, attr).float() for f in fitted])
            sparsity[method] = torch.stack([f.train_sparsity_.float() for f in fitted])
            recall[method] = torch.stack([f.train_recall_.float() for f in fitted])
        grids = {}
        for method in grid_methods:
            try:
                table = measure_grid(records, projections, method, head_grid(method),
                                     codebooks=codebooks if method == "kmeans-routed" else None)
            except MethodUnavailable:  # e.g. no key codebooks for this model: not in the table
                continue
            choices = torch.stack([table.choose(float(t)) for t in targets])  # (T, L, H)
            params[method] = choices.float()
            picked = [table.recall.gather(-1, c[..., None])[..., 0] for c in choices]
            recall[method] = torch.stack(picked).float()
            sparsity[method] = torch.stack([1.0 - table.density.gather(-1, c[..., None])[..., 0]
                                            for c in choices]).float()
            grids[method] = table.grid
        return cls(model_id=projections.model_id, projections_sha256=projections_sha256,
                   targets=[float(t) for t in targets], params=params,
                   train_sparsity=sparsity, train_recall=recall,
                   metadata={"n_texts": len(records), "samples_per_text": samples_per_text,
                             "seed": seed, "allocation": "budget",
                             **({"floor": int(floor), "floor_share": _share(floor_share)}
                                if floor is not None else {})},
                   grids=grids)

    def index(self, target: float) -> int:
        """Position of ``target`` in the table (it must be one of :attr:`targets`)."""
        for i, t in enumerate(self.targets):
            if math.isclose(t, float(target), abs_tol=1e-9):
                return i
        raise ValueError(f"target sparsity {target} is not calibrated; choose one of "
                         f"{self.targets}")

    def predictor(self, method: str, target: float, layer: int, projections: Any = None) -> Any:
        """The predictor of ``method`` (a family, see :func:`table_key`) at ``target`` for one
        layer (``projections``: what a per-head raw setting is built with, e.g. the model id
        for routed k-means)."""
        method = table_key(method)
        if method not in self.params:
            raise ValueError(f"no {method!r} in this calibration table ({list(self.params)})")
        values = self.params[method][self.index(target), layer]
        if method in self.grids:
            return layer_predictor(method, self.grids[method], values.long(), projections, layer)
        if method == FLOOR_METHOD:
            share = self.floor_share
            row_share = None if share is None else share * (1.0 - float(target))
            return RowFloor(ThresholdDistance(values), int(self.metadata["floor"]), row_share)
        return ThresholdDistance(values) if method == "distance" else RowFraction(values)

    @property
    def floor_share(self) -> float | None:
        """The length cap of the table's floored distance (None: uncapped, also for the tables
        written before the cap was recorded)."""
        return _share(self.metadata.get("floor_share"))

    def has(self, method: str) -> bool:
        """Whether the table holds ``method``, a calibrated form (``distance:budget`` or the
        old ``distance-budget``); a raw family (``distance``) is not held."""
        if not method.endswith(":budget") and method not in old_keys():
            return False
        return table_key(method) in self.params

    def methods(self) -> list[str]:
        """The calibrated forms the table holds, as written: ``distance:budget``, …"""
        return [f"{family}:budget" for family in self.params]

    def fitted_for(self, method: str) -> Callable[[dict, Any, int], Any]:
        """The ``fitted`` factory of one calibrated method (what a sweep's ``fit`` returns)."""

        def build(params: dict, projections: Any, layer: int) -> Any:
            held_as = table_key(method)
            if held_as == "distance" and params.get("floor"):  # distance with a floor
                held_as = FLOOR_METHOD
                if FLOOR_METHOD not in self.params:
                    raise MethodUnavailable("this calibration table holds no floored distance; "
                                            "remake it with `sparsefinder calibrate`")
            if held_as == FLOOR_METHOD:  # the table holds one floor and one cap
                held, share = int(self.metadata["floor"]), self.floor_share
                asked = _share(params.get("floor_share"))  # left out: uncapped
                if int(params.get("floor", held)) != held or not _same_share(asked, share):
                    raise MethodUnavailable(
                        f"the calibration table holds {FLOOR_METHOD}:budget with floor={held} "
                        f"and floor_share={share}; other settings need train graphs (a sweep "
                        "with --train-passages)")
            return self.predictor(held_as, float(params["target_sparsity"]), layer, projections)

        return build

    def save(self, path: str | Path) -> Path:
        """Write the table (atomically, through :func:`sparsefinder.files.save_payload`)."""
        return save_payload(path, {
            **CALIBRATION_FILE.header(), "model_id": self.model_id,
            "projections_sha256": self.projections_sha256, "targets": self.targets,
            "params": self.params, "train_sparsity": self.train_sparsity,
            "train_recall": self.train_recall, "metadata": self.metadata,
            "grids": self.grids, "projections_file": self.projections_file})

    @classmethod
    def load(cls, path: str | Path, projections_sha256: str | None = None) -> CalibrationTable:
        """Read a table; refuse one fitted for other projections (``projections_sha256``)."""
        command = f"`sparsefinder calibrate --projections FILE --out {Path(path).name}`"
        remake = f"make one with {command}"
        payload = load_payload(path, CALIBRATION_FILE, command=command)
        if projections_sha256 is not None and payload["projections_sha256"] != projections_sha256:
            raise CalibrationError(f"{Path(path).name} was fitted for other projections; "
                                   f"{remake}")
        return cls(model_id=payload["model_id"],
                   projections_sha256=payload["projections_sha256"],
                   targets=list(payload["targets"]), params=_renamed(payload["params"]),
                   train_sparsity=_renamed(payload.get("train_sparsity")),
                   train_recall=_renamed(payload.get("train_recall")),
                   metadata=dict(payload.get("metadata") or {}),
                   grids=_renamed(payload.get("grids")),
                   projections_file=str(payload.get("projections_file") or ""))

    def own_projections(self, table_path: str | Path) -> HeadProjections:
        """The projections this table was fitted for: ``projections_file`` next to the table,
        checked against :attr:`projections_sha256`."""
        if not self.projections_file:
            raise CalibrationError("this calibration table does not name its projections file; "
                                   "remake it with `sparsefinder calibrate`")
        path = Path(table_path).with_name(self.projections_file)
        if not path.is_file() or file_digest(path) != self.projections_sha256:
            raise CalibrationError(f"{self.projections_file} (next to {Path(table_path).name}) "
                                   "is missing or not the file the table was fitted for; remake "
                                   "it with `make assets`")
        return HeadProjections.load(path, expected_model_id=self.model_id)


def _share(value: Any) -> float | None:
    """A floor share as a float (None: no cap)."""
    return None if value is None else float(value)


def _same_share(a: float | None, b: float | None) -> bool:
    """Whether two floor shares are the same cap (None only equals None)."""
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _renamed(table: dict | None) -> dict:
    """A saved per-method dict with the keys of older files (``distance-budget``) renamed to
    their family (``distance``)."""
    old = old_keys()
    return {old.get(key, key): value for key, value in (table or {}).items()}
