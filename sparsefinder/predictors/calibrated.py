"""Distance predictors driven by a TARGET sparsity (or recall), calibrated per head on train.

Why: one raw threshold ``t`` shared by every head lands each head at a different sparsity
(heads differ in scale and in how dense their gold graphs are), and the same ``t`` drifts
with text length (sparsity ≈ 0.87 on short texts, 0.93 on long ones for the bundled
projections). Here the user asks for a sparsity ``s`` and every head ``h`` of every layer
gets its own squared-distance threshold ``t²_h``, chosen on TRAINING graphs.

What is calibrated: the macro average the metrics use. Sparsity and recall are averaged per
head over texts, each text weighing the same (:mod:`sparsefinder.metrics`). So from every
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
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sparsefinder.attention.masks import allowed_per_row, apply_causal, causal_mask
from sparsefinder.data.records import AttentionRecord
from sparsefinder.predictors.base import check_shapes
from sparsefinder.predictors.distance import _partial_sq_dist
from sparsefinder.predictors.row_fraction import RowFraction

ALLOCATIONS = ("equal", "budget")
_BUDGET_GRID = 512  # candidate thresholds per head (pair-distance quantiles)
_BISECTION_STEPS = 60


@dataclass
class ThresholdDistance:
    """Edge ``(i, j)`` of head ``h`` iff ``‖q'_i − k'_j‖² ≤ sq_thresholds[h]``.

    Squared thresholds may be negative (that head keeps nothing).
    """

    sq_thresholds: Tensor  # (heads,)

    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput

    def __post_init__(self) -> None:
        if not isinstance(self.sq_thresholds, Tensor) or self.sq_thresholds.dim() != 1:
            raise ValueError(
                "sq_thresholds must be a 1-d tensor with one squared distance per head, "
                f"got {getattr(self.sq_thresholds, 'shape', type(self.sq_thresholds).__name__)}"
            )
        if torch.isnan(self.sq_thresholds).any():
            raise ValueError("sq_thresholds contains NaN; calibrate on train records first")

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m)."""
        check_shapes(q, k)
        if q.shape[0] != self.sq_thresholds.shape[0]:
            raise ValueError(
                f"calibrated for {self.sq_thresholds.shape[0]} heads, got q with {q.shape[0]}"
            )
        partial, qq = _partial_sq_dist(q, k)
        t2 = self.sq_thresholds.to(device=partial.device, dtype=partial.dtype)[:, None, None]
        return apply_causal(partial <= t2 - qq, causal)


@dataclass
class DistanceSamples:
    """Sorted squared distances of sampled train pairs, per layer and head.

    ``pairs`` (layers, heads, T·K): uniformly drawn allowed pairs, ``K`` per text;
    ``gold`` (layers, heads, T·K): uniformly drawn gold edges, ``K`` per text (``-inf`` for a
    text whose head has no gold edge: its recall is 1 by convention, at any threshold);
    ``gold_fraction`` (optional, same shape): the rank of each sampled gold edge in its row,
    as ``(rank + 1) / allowed`` (``-inf`` as above). All sorted ascending along the last axis.
    """

    pairs: Tensor
    gold: Tensor
    n_texts: int
    gold_fraction: Tensor | None = None

    @classmethod
    def from_records(
        cls,
        records: Sequence[AttentionRecord],
        projections,
        samples_per_text: int = 1024,
        seed: int = 0,
        rank_fractions: bool = False,
    ) -> DistanceSamples:
        """Project every train record and sample ``samples_per_text`` pairs/edges per head
        (with ``rank_fractions``, also the in-row rank of each sampled gold edge)."""
        if not records:
            raise ValueError("calibration needs at least one TRAIN record (a text's gold graphs)")
        if isinstance(samples_per_text, bool) or not isinstance(samples_per_text, int) or (
            samples_per_text < 1
        ):
            raise ValueError(f"samples_per_text must be an integer >= 1, got {samples_per_text!r}")
        generator = torch.Generator().manual_seed(seed)
        layers = records[0].num_layers
        pairs: list[list[Tensor]] = [[] for _ in range(layers)]
        gold: list[list[Tensor]] = [[] for _ in range(layers)]
        fraction: list[list[Tensor]] = [[] for _ in range(layers)]
        for record in records:
            projected = projections.project_record(record)
            for layer, ((q, k), graph) in enumerate(zip(projected, record.layers, strict=True)):
                p, g, f = _sample_text(q, k, graph.gold, record.causal, samples_per_text,
                                       generator, rank_fractions)
                pairs[layer].append(p)
                gold[layer].append(g)
                fraction[layer].append(f)

        def pooled(parts: list[list[Tensor]]) -> Tensor:
            # float32 halves the memory (354 texts × 1024 samples × 72 heads ≈ 100 MB each)
            return torch.stack([torch.cat(p, 1) for p in parts]).float().sort(-1).values

        return cls(pairs=pooled(pairs), gold=pooled(gold), n_texts=len(records),
                   gold_fraction=pooled(fraction) if rank_fractions else None)

    @property
    def shape(self) -> tuple[int, int]:
        """(layers, heads)."""
        return int(self.pairs.shape[0]), int(self.pairs.shape[1])

    def density(self, sq_thresholds: Tensor) -> Tensor:
        """Estimated macro density ``1 − sparsity`` at thresholds (layers, heads, ...)."""
        return _cdf(self.pairs, sq_thresholds)

    def recall(self, sq_thresholds: Tensor) -> Tensor:
        """Estimated macro recall at thresholds (layers, heads, ...)."""
        return _cdf(self.gold, sq_thresholds)


def _cdf(sorted_values: Tensor, at: Tensor) -> Tensor:
    """Fraction of ``sorted_values`` (L, H, N) that are ≤ ``at`` (L, H, G) → (L, H, G)."""
    squeeze = at.dim() == 2
    at = at[..., None] if squeeze else at
    count = torch.searchsorted(sorted_values, at.to(sorted_values.dtype).contiguous(), right=True)
    out = count.double() / sorted_values.shape[-1]
    return out[..., 0] if squeeze else out


def _sample_text(
    q: Tensor, k: Tensor, gold: Tensor, causal: bool, num: int, generator: torch.Generator,
    rank_fractions: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Squared distances of ``num`` uniform allowed pairs and ``num`` uniform gold edges per
    head of one text → (heads, num) each, and the gold edges' in-row rank fractions (empty
    unless ``rank_fractions``); gold is ``-inf`` for a head without gold edges."""
    heads, n, m = gold.shape
    if causal:
        allowed = causal_mask(n, m).reshape(-1)
        gold = gold & allowed.view(n, m)
        flat_allowed = allowed.nonzero()[:, 0]
    else:
        flat_allowed = torch.arange(n * m)
    pick = flat_allowed[torch.randint(0, flat_allowed.numel(), (heads, num), generator=generator)]
    weights = gold.reshape(heads, -1).float()
    empty = weights.sum(-1) == 0
    weights[empty] = 1.0  # any column; overwritten with -inf below
    edges = torch.multinomial(weights, num, replacement=True, generator=generator)

    def sq_dist(flat: Tensor) -> Tensor:
        qi = q.gather(1, (flat // m)[..., None].expand(-1, -1, q.shape[-1]))
        kj = k.gather(1, (flat % m)[..., None].expand(-1, -1, k.shape[-1]))
        return (qi.double() - kj.double()).square().sum(-1)

    gold_d = sq_dist(edges)
    fraction = torch.empty(heads, 0, dtype=torch.float64)
    if rank_fractions:
        rows = edges // m  # (heads, num): rank each edge among its row's allowed keys
        partial, qq = _partial_sq_dist(q, k)
        dist = (partial + qq).double()
        if causal:
            dist = dist.masked_fill(~causal_mask(n, m), torch.inf)
        row_d = dist.gather(1, rows[..., None].expand(-1, -1, m))  # (heads, num, m)
        own = row_d.gather(2, (edges % m)[..., None])
        rank = (row_d < own).sum(-1)
        fraction = (rank + 1).double() / allowed_per_row(n, m, causal=causal)[rows].clamp(min=1)
        fraction[empty] = -torch.inf
    gold_d[empty] = -torch.inf
    return sq_dist(pick), gold_d, fraction


def allocate(
    density: Tensor, recall: Tensor, target_sparsity: float | None, target_recall: float | None
) -> Tensor:
    """Budget allocation over heads: index (layers, heads, 1) of the chosen candidate.

    ``density``/``recall`` (layers, heads, G) of G candidates per head. For a sparsity target
    maximises the mean recall at mean density ``1 − target``; for a recall target minimises
    the mean density at mean recall ``target`` (Lagrangian relaxation, λ by bisection).
    """
    want_sparsity = target_sparsity is not None
    table = density if want_sparsity else recall
    goal = 1.0 - target_sparsity if want_sparsity else target_recall

    def choose(lam: float) -> Tensor:
        return (recall - lam * density).argmax(-1, keepdim=True)

    def value(lam: float) -> float:
        return float(table.gather(-1, choose(lam)).mean())

    low, high = 0.0, 1.0  # λ; a larger λ gives sparser, lower-recall choices
    while value(high) > goal and high < 1e12:
        high *= 4.0
    for _ in range(_BISECTION_STEPS):
        mid = (low + high) / 2
        if value(mid) > goal:
            low = mid
        else:
            high = mid
    # The two sides of the jump in λ differ in a few heads (ties, non-concave curves): start
    # from the side that meets the target (the sparser one for a sparsity target, the one
    # reaching the recall otherwise) and move heads to the other side, best trade first,
    # while the target still holds.
    sparse, dense = choose(high), choose(low)
    start, other = (sparse, dense) if want_sparsity else (dense, sparse)
    choice = start.clone()
    d_gain = (density.gather(-1, other) - density.gather(-1, start)).flatten()
    r_gain = (recall.gather(-1, other) - recall.gather(-1, start)).flatten()
    count = d_gain.numel()
    total = float(table.gather(-1, start).sum())
    moved = (r_gain / d_gain.clamp(min=1e-12)) if want_sparsity else (d_gain / r_gain.clamp(
        max=-1e-12))
    flat = choice.view(-1)
    for index in torch.argsort(moved, descending=True).tolist():
        if bool(start.view(-1)[index] == other.view(-1)[index]):
            continue
        step = float(d_gain[index] if want_sparsity else r_gain[index])
        if (total + step) / count <= goal if want_sparsity else (total + step) / count >= goal:
            flat[index] = other.view(-1)[index]
            total += step
    if want_sparsity:  # a linear stretch (recall ∝ density) jumps as a whole: fill it in
        _fill(choice, density, recall, goal * count - total)
    return choice


def _fill(choice: Tensor, density: Tensor, recall: Tensor, budget: float) -> None:
    """Spend the density left under the target (``budget``, summed over heads) greedily: the
    move of one head to a denser candidate with the largest recall gain that still fits."""
    for _ in range(choice.numel()):
        extra_d = density - density.gather(-1, choice)
        extra_r = recall - recall.gather(-1, choice)
        fits = (extra_d > 0) & (extra_d <= budget + 1e-12)
        gain = torch.where(fits, extra_r, -torch.inf).flatten()
        best = int(gain.argmax())
        if not float(gain[best]) > 0:
            return
        g = density.shape[-1]
        choice.view(-1)[best // g] = best % g
        budget -= float(extra_d.flatten()[best])


def _check_targets(target_sparsity: float | None, target_recall: float | None,
                   allocation: str) -> None:
    given = [(name, value) for name, value in (("target_sparsity", target_sparsity),
                                               ("target_recall", target_recall))
             if value is not None]
    if len(given) != 1:
        raise ValueError("pass exactly one of target_sparsity= or target_recall=")
    name, value = given[0]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
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

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False, layer: int = 0) -> Tensor:
        """Projected q (heads, n, r), k (heads, m, r) of ``layer`` → bool (heads, n, m)."""
        return self.for_layer(layer).predict(q, k, causal=causal)


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

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False, layer: int = 0) -> Tensor:
        """Projected q (heads, n, r), k (heads, m, r) of ``layer`` → bool (heads, n, m)."""
        return self.for_layer(layer).predict(q, k, causal=causal)
