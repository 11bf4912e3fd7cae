"""Estimators that calibrate a family per head on TRAIN graphs for a target sparsity or recall.

Distance predictors driven by a TARGET sparsity (or recall), calibrated per head on train.

Why: one raw threshold ``t`` shared by every head lands each head at a different sparsity
(heads differ in scale and in how dense their gold graphs are), and the same ``t`` drifts
with text length (sparsity ≈ 0.87 on short texts, 0.93 on long ones for the bundled
projections). Here the user asks for a sparsity ``s`` and every head ``h`` of every layer
gets its own squared-distance threshold ``t²_h``, chosen on TRAINING graphs.

What is calibrated: the macro average the metrics use. Sparsity and recall are averaged per
head over texts, each text weighing the same (:mod:`sparsefinder.metrics.scorer`). So from every
train text we draw the same number ``K`` of uniformly random allowed pairs and of gold edges
per head (:class:`DistanceSamples`); the empirical CDF of the pooled pair distances at
``t²`` is then an unbiased estimate of the macro density ``1 − sparsity_h(t)`` and that of
the gold-edge distances of the macro recall ``recall_h(t)``. Thresholds are quantiles:

- ``allocation="equal"``: every head gets the target: ``t²_h`` = the ``(1 − s)``-quantile of
  its pair distances (or, for a target recall ``ρ``, the ``ρ``-quantile of its gold-edge
  distances). Macro sparsity is then ``s`` on train whatever the lengths of the texts.
- ``allocation="budget"``: the heads share a sparsity budget. Maximise the mean recall over
  heads subject to the mean density being ``1 − s`` (or minimise the mean density subject to
  the mean recall being ``ρ``): with a Lagrange multiplier ``λ`` each head independently
  takes the candidate threshold maximising ``recall_h − λ·density_h``, and ``λ`` is found by
  bisection. Dense heads (many gold edges) get lower sparsity, sparse heads higher.

The result is a set of per-head thresholds; :class:`ThresholdDistance` is the predictor of
one layer (the same ``O(n·m·r)`` test as :class:`~sparsefinder.predictors.Distance`).

:class:`CalibratedRowFraction` calibrates the per-row keep fraction ``f_h`` of
:class:`~sparsefinder.predictors.row_fraction.RowFraction` the same way: its density is
``f_h`` by construction (so "equal" needs no data for a sparsity target and the sparsity is
the same for every text length), and its recall at ``f`` is the fraction of sampled gold
edges whose rank in their row, ``(rank + 1) / allowed``, is ≤ ``f``.

Calibration only sees projected train vectors and gold graphs: no validation data.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from sparsefinder.calibration.allocation import _BUDGET_GRID, ALLOCATIONS, allocate
from sparsefinder.calibration.samples import DistanceSamples, _cdf
from sparsefinder.data.records import AttentionRecord
from sparsefinder.methods.param import TARGET_RECALL, TARGET_SPARSITY
from sparsefinder.methods.spec import predict_layer
from sparsefinder.predictors.row_fraction import RowFraction
from sparsefinder.predictors.threshold_distance import ThresholdDistance


def _check_targets(target_sparsity: float | None, target_recall: float | None,
                   allocation: str) -> None:
    given = [(name, value) for name, value in (("target_sparsity", target_sparsity),
                                               ("target_recall", target_recall))
             if value is not None]
    if len(given) != 1:
        raise ValueError("pass exactly one of target_sparsity= or target_recall=")
    name, value = given[0]
    (TARGET_SPARSITY if name == "target_sparsity" else TARGET_RECALL).check(value, text=False)
    if allocation not in ALLOCATIONS:
        raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {allocation!r}")


class _TargetCalibrated:
    """Hyperparameters shared by the calibrated predictors: exactly one of
    ``target_sparsity``/``target_recall`` in (0, 1), and an ``allocation`` across heads
    (checked when fitting, scikit-learn style)."""

    def __init__(
        self,
        target_sparsity: float | None = None,
        target_recall: float | None = None,
        allocation: str = "equal",
    ) -> None:
        self.target_sparsity = target_sparsity
        self.target_recall = target_recall
        self.allocation = allocation

    def _check(self) -> None:
        _check_targets(self.target_sparsity, self.target_recall, self.allocation)


class CalibratedDistance(_TargetCalibrated):
    """Per-head distance thresholds that meet a target sparsity or recall (scikit-learn style).

    Hyperparameters: exactly one of ``target_sparsity``/``target_recall`` in (0, 1), and
    ``allocation`` ("equal" or "budget", see the module docstring). ``fit(samples)`` (a
    :class:`DistanceSamples` of TRAIN records, or use :meth:`fit_records`) learns
    ``sq_thresholds_`` (layers, heads) and the train estimates ``train_sparsity_`` /
    ``train_recall_`` (layers, heads). :meth:`for_layer` gives a layer's predictor;
    :meth:`predict` predicts one layer directly.
    """

    def fit_records(
        self, records: Sequence[AttentionRecord], projections, samples_per_text: int = 1024,
        seed: int = 0,
    ) -> CalibratedDistance:
        """Sample TRAIN records projected with ``projections`` and fit on them."""
        self._check()
        return self.fit(DistanceSamples.from_records(records, projections, samples_per_text, seed))

    def fit(self, samples: DistanceSamples) -> CalibratedDistance:
        """Choose the per-head thresholds on train samples; returns ``self``."""
        self._check()
        if not isinstance(samples, DistanceSamples):
            raise TypeError(
                "fit() takes DistanceSamples; use fit_records(records, projections) for records"
            )
        t2 = self._equal(samples) if self.allocation == "equal" else self._budget(samples)
        self.sq_thresholds_ = t2.float()
        self.train_sparsity_ = 1.0 - samples.density(t2)
        self.train_recall_ = samples.recall(t2)
        self.n_texts_ = samples.n_texts
        return self

    def _equal(self, samples: DistanceSamples) -> Tensor:
        if self.target_sparsity is not None:
            values, fraction = samples.pairs, 1.0 - float(self.target_sparsity)
        else:
            values, fraction = samples.gold, float(self.target_recall)
        count = round(fraction * values.shape[-1])  # keep this many of the sorted samples
        if count == 0:
            return values[..., 0] - 1.0  # below every sample: keeps (almost) nothing
        t2 = values[..., count - 1]
        # -inf: a head whose quantile falls among texts without gold edges (recall 1 at any
        # threshold) needs nothing: keep (almost) nothing.
        return torch.where(torch.isfinite(t2), t2, samples.pairs[..., 0] - 1.0)

    def _budget(self, samples: DistanceSamples) -> Tensor:
        layers, heads = samples.shape
        grid = torch.linspace(0.0, 1.0, _BUDGET_GRID + 1, dtype=torch.float64)[1:]
        index = (grid * samples.pairs.shape[-1]).long().clamp(1) - 1
        # Candidate squared thresholds per head, plus one below everything (keep nothing).
        cand = torch.cat([samples.pairs[..., :1] - 1.0, samples.pairs[..., index]], -1)
        choice = allocate(samples.density(cand), samples.recall(cand),
                          self.target_sparsity, self.target_recall)
        return cand.gather(-1, choice)[..., 0]

    # ---------------------------------------------------------------- predicting

    def _fitted(self) -> Tensor:
        if not hasattr(self, "sq_thresholds_"):
            raise ValueError("this CalibratedDistance is not fitted; call fit() on TRAIN samples")
        return self.sq_thresholds_

    def for_layer(self, layer: int) -> ThresholdDistance:
        """The predictor of one layer."""
        t2 = self._fitted()
        if not 0 <= layer < t2.shape[0]:
            raise ValueError(f"layer must be in [0, {t2.shape[0]}), got {layer}")
        return ThresholdDistance(t2[layer])

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False, layer: int = 0,
                sliding_window: int | None = None) -> Tensor:
        """Projected q (heads, n, r), k (heads, m, r) of ``layer`` → bool (heads, n, m); a
        local layer's (``sliding_window``) is cut to its window, as in ``predict_record``."""
        return predict_layer(self.for_layer(layer), q, k, causal=causal,
                             sliding_window=sliding_window)


class CalibratedRowFraction(_TargetCalibrated):
    """Per-head keep fractions of :class:`RowFraction` for a target sparsity or recall.

    Same hyperparameters as :class:`CalibratedDistance`. ``fit(samples)`` needs samples drawn
    with ``rank_fractions=True``; learns ``fractions_`` (layers, heads) and the train
    estimates ``train_sparsity_``/``train_recall_``. With ``allocation="equal"`` and a
    sparsity target every head keeps ``1 − target`` of each row.
    """

    def fit_records(
        self, records: Sequence[AttentionRecord], projections, samples_per_text: int = 1024,
        seed: int = 0,
    ) -> CalibratedRowFraction:
        """Sample TRAIN records projected with ``projections`` and fit on them."""
        self._check()
        return self.fit(DistanceSamples.from_records(
            records, projections, samples_per_text, seed, rank_fractions=True))

    def fit(self, samples: DistanceSamples) -> CalibratedRowFraction:
        """Choose the per-head fractions on train samples; returns ``self``."""
        self._check()
        if not isinstance(samples, DistanceSamples) or samples.gold_fraction is None:
            raise TypeError("fit() takes DistanceSamples drawn with rank_fractions=True")
        layers, heads = samples.shape
        ranks = samples.gold_fraction
        if self.allocation == "equal" and self.target_sparsity is not None:
            f = torch.full((layers, heads), 1.0 - float(self.target_sparsity),
                           dtype=torch.float64)
        elif self.allocation == "equal":
            count = max(1, round(float(self.target_recall) * ranks.shape[-1]))
            f = ranks[..., count - 1].clamp(0.0, 1.0)  # -inf (no gold edges) → 0
        else:
            grid = torch.linspace(0.0, 1.0, _BUDGET_GRID + 1, dtype=torch.float64)
            cand = grid.expand(layers, heads, -1).contiguous()
            choice = allocate(cand, _cdf(ranks, cand), self.target_sparsity,
                              self.target_recall)
            f = cand.gather(-1, choice)[..., 0]
        self.fractions_ = f.float()
        self.train_sparsity_ = 1.0 - f
        self.train_recall_ = _cdf(ranks, f)
        self.n_texts_ = samples.n_texts
        return self

    def for_layer(self, layer: int) -> RowFraction:
        """The predictor of one layer."""
        if not hasattr(self, "fractions_"):
            raise ValueError("this CalibratedRowFraction is not fitted; call fit() on TRAIN "
                             "samples")
        if not 0 <= layer < self.fractions_.shape[0]:
            raise ValueError(f"layer must be in [0, {self.fractions_.shape[0]}), got {layer}")
        return RowFraction(self.fractions_[layer])

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False, layer: int = 0,
                sliding_window: int | None = None) -> Tensor:
        """Projected q (heads, n, r), k (heads, m, r) of ``layer`` → bool (heads, n, m); a
        local layer's (``sliding_window``) is cut to its window, as in ``predict_record``."""
        return predict_layer(self.for_layer(layer), q, k, causal=causal,
                             sliding_window=sliding_window)
