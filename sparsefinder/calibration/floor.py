"""Per-head distance thresholds calibrated WITH a per-row floor of ``m`` nearest keys.

The predictor (:class:`~sparsefinder.predictors.row_floor.RowFloor` over a
:class:`~sparsefinder.predictors.threshold_distance.ThresholdDistance`) keeps a pair when its
projected squared distance is at most ``t²_h`` OR the key is among its row's ``m`` nearest
allowed keys. The floor costs density, so a threshold fitted without it would overshoot the
budget: here the density of a candidate threshold is estimated with the floor included,

    density_h(t) = P(d ≤ t²) + P(d > t² and rank < m),

from the same uniform TRAIN pair samples as :class:`~sparsefinder.calibration.estimators.
CalibratedDistance` (:class:`DistanceSamples` drawn with ``row_ranks=True``: each sampled pair
knows how many allowed keys of its row are nearer), and the recall likewise from the sampled
gold edges. The thresholds are then chosen as there: ``"budget"`` shares the sparsity budget
across heads (highest mean recall), ``"equal"`` gives each head the target. When the floor
alone is denser than the target allows, the threshold part keeps nothing and the sparsity is
the floor's (``train_sparsity_`` says so).

``floor_share`` c caps the floor by the row's length: row ``i`` takes at most
``min(m, max(1, ⌊c · (1 − target) · allowed_i⌋))`` floor keys, a share c of the keys the target
leaves the row (:func:`~sparsefinder.predictors.row_floor.floor_counts`), so the floor stays
within the target on any text length; a sampled pair is then floored when its rank is below
its own row's count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from sparsefinder.calibration.allocation import _BUDGET_GRID, ALLOCATIONS, allocate
from sparsefinder.calibration.samples import RANK_CAP, DistanceSamples, _cdf
from sparsefinder.data.records import AttentionRecord
from sparsefinder.methods.param import TARGET_SPARSITY
from sparsefinder.predictors.row_floor import RowFloor, floor_counts
from sparsefinder.predictors.threshold_distance import ThresholdDistance


def _floored_cdf(values: Tensor, ranks: Tensor, floor: int | Tensor
                 ) -> Callable[[Tensor], Tensor]:
    """``at → P(value ≤ at or rank < floor)`` over sorted ``values`` (L, H, N); ``floor`` a
    number or each sample's own count (aligned with ``values``)."""
    floored = ranks < floor
    share = floored.double().mean(-1, keepdim=True)
    inside = torch.where(floored, values, torch.inf).sort(-1).values

    def cdf(at: Tensor) -> Tensor:
        squeeze = at.dim() == 2
        at3 = at[..., None] if squeeze else at
        out = _cdf(values, at3) + share - _cdf(inside, at3)
        return out[..., 0] if squeeze else out

    return cdf


class CalibratedFlooredDistance:
    """Per-head thresholds of a distance graph with a floor of ``floor`` keys per row, for a
    ``target_sparsity`` in (0, 1) INCLUDING the floor's density (scikit-learn style).

    ``fit(samples)`` (TRAIN :class:`DistanceSamples` with ``row_ranks=True``) learns
    ``sq_thresholds_`` (layers, heads) and the train estimates ``train_sparsity_`` /
    ``train_recall_`` / ``floor_sparsity_`` (the floor alone) (layers, heads).
    ``floor_share`` in (0, 1] caps each row's floor at that share of the keys the target
    leaves it (None: ``floor`` keys in every row).
    """

    def __init__(self, target_sparsity: float, floor: int = 1,
                 allocation: str = "budget", floor_share: float | None = None) -> None:
        self.target_sparsity = target_sparsity
        self.floor = floor
        self.allocation = allocation
        self.floor_share = floor_share

    @property
    def row_share(self) -> float | None:
        """The share of a row's allowed keys its floor may take, ``c · (1 − target)`` (None:
        no cap)."""
        if self.floor_share is None:
            return None
        return float(self.floor_share) * (1.0 - float(self.target_sparsity))

    def _check(self) -> None:
        TARGET_SPARSITY.check(self.target_sparsity, text=False)
        f = self.floor
        if isinstance(f, bool) or not isinstance(f, int) or not 1 <= f <= RANK_CAP:
            raise ValueError(f"floor must be an integer in [1, {RANK_CAP}] keys per row, "
                             f"got {f!r}")
        if self.allocation not in ALLOCATIONS:
            raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {self.allocation!r}")
        c = self.floor_share
        if c is not None and (isinstance(c, bool) or not isinstance(c, int | float)
                              or not 0 < c <= 1):
            raise ValueError(f"floor_share must be None or a number in (0, 1], got {c!r}")

    def fit(self, samples: DistanceSamples) -> CalibratedFlooredDistance:
        """Choose the per-head thresholds on train samples; returns ``self``."""
        self._check()
        if not isinstance(samples, DistanceSamples) or samples.pair_rank is None:
            raise TypeError("fit() takes DistanceSamples drawn with row_ranks=True "
                            "(DistanceSamples.from_records(..., row_ranks=True))")
        pair_floor: int | Tensor = self.floor
        gold_floor: int | Tensor = self.floor
        if self.floor_share is not None:
            if samples.pair_allowed is None or samples.gold_allowed is None:
                raise TypeError("a floor_share needs each sample's row length; draw the "
                                "samples with DistanceSamples.from_records(..., row_ranks=True)")
            pair_floor = floor_counts(self.floor, self.row_share, samples.pair_allowed)
            gold_floor = floor_counts(self.floor, self.row_share, samples.gold_allowed)
        density = _floored_cdf(samples.pairs, samples.pair_rank, pair_floor)
        recall = _floored_cdf(samples.gold, samples.gold_rank, gold_floor)
        grid = torch.linspace(0.0, 1.0, _BUDGET_GRID + 1, dtype=torch.float64)[1:]
        index = (grid * samples.pairs.shape[-1]).long().clamp(1) - 1
        # candidate squared thresholds per head, plus one below everything (the floor only)
        cand = torch.cat([samples.pairs[..., :1] - 1.0, samples.pairs[..., index]], -1)
        cand_density = density(cand)
        goal = 1.0 - float(self.target_sparsity)
        if self.allocation == "budget":
            choice = allocate(cand_density, recall(cand), self.target_sparsity, None)
        else:  # the densest candidate within the target (density grows with t)
            choice = ((cand_density <= goal + 1e-12).sum(-1, keepdim=True) - 1).clamp(min=0)
        t2 = cand.gather(-1, choice)[..., 0]
        self.sq_thresholds_ = t2.float()
        self.train_sparsity_ = 1.0 - density(t2)
        self.train_recall_ = recall(t2)
        self.floor_sparsity_ = 1.0 - cand_density[..., 0]
        self.n_texts_ = samples.n_texts
        return self

    def for_layer(self, layer: int) -> RowFloor:
        """The predictor of one layer."""
        if not hasattr(self, "sq_thresholds_"):
            raise ValueError("this CalibratedFlooredDistance is not fitted; call fit() on "
                             "TRAIN samples")
        if not 0 <= layer < self.sq_thresholds_.shape[0]:
            raise ValueError(f"layer must be in [0, {self.sq_thresholds_.shape[0]}), "
                             f"got {layer}")
        return RowFloor(ThresholdDistance(self.sq_thresholds_[layer]), int(self.floor),
                        self.row_share)


#: The row-ranked samples of the last few (train records, projections): every floor and
#: target of a sweep (one curve per floor) reuses one sampling pass.
_SAMPLES: list[tuple[tuple[AttentionRecord, ...], Any, DistanceSamples]] = []
_SAMPLES_KEPT = 2


def _ranked_samples(records: Sequence[AttentionRecord], projections: Any) -> DistanceSamples:
    key = tuple(records)
    for kept, kept_projections, samples in _SAMPLES:
        if kept_projections is projections and len(kept) == len(key) and all(
                a is b for a, b in zip(kept, key, strict=True)):
            return samples
    samples = DistanceSamples.from_records(records, projections, row_ranks=True)
    _SAMPLES.insert(0, (key, projections, samples))
    del _SAMPLES[_SAMPLES_KEPT:]
    return samples


def floored_fitter(allocation: str) -> Callable[[Sequence[AttentionRecord]], Callable]:
    """``fit(train_records) -> factory(params, projections, layer)`` for the sweep registry
    (params ``target_sparsity``, ``floor`` and optionally ``floor_share``): the train pairs
    are sampled and projected once per (records, projections), each (target, floor, share)
    fitted once."""

    def fit(train_records: Sequence[AttentionRecord]) -> Callable:
        fitted_by: dict[tuple, tuple[Any, CalibratedFlooredDistance]] = {}

        def build(p: dict[str, Any], projections: Any, layer: int) -> RowFloor:
            if projections is None:
                raise ValueError("a distance floor needs learned projections; pass projections=")
            share = p.get("floor_share")
            share = None if share is None else float(share)
            key = (id(projections), float(p["target_sparsity"]), int(p["floor"]), share)
            entry = fitted_by.get(key)
            if entry is None or entry[0] is not projections:  # (an id may be reused)
                samples = _ranked_samples(train_records, projections)
                entry = (projections, CalibratedFlooredDistance(
                    key[1], key[2], allocation, share).fit(samples))
                fitted_by[key] = entry
            return entry[1].for_layer(layer)

        return build

    return fit
