"""Per-head raw settings (B/k, β, window, key budget) for a target sparsity, chosen on TRAIN.

The calibrated distance methods (:mod:`sparsefinder.calibration.estimators`) turn a target
sparsity into a continuous per-head threshold. The other families have a discrete raw
hyperparameter — k-means' (B, k), quantization's β, the window w, routed k-means' key
budget — so here each head picks one point of the family's grid:

1. **Measure** (:func:`measure_grid`): every grid point is predicted on every TRAIN record
   and scored per head with the one :class:`~sparsefinder.metrics.scorer.Scorer`; recall and
   density ``1 − sparsity`` are averaged over texts (each text weighs the same, as in the
   metrics' macro average) → tables (layers, heads, G).
2. **Allocate** (:func:`~sparsefinder.calibration.allocation.allocate`, the same Lagrangian
   budget as ``distance:budget``): maximise the mean recall over heads subject to the mean
   density being ``1 − target``; dense heads get more, sparse heads less.
3. **Predict** with each head's own setting
   (:class:`~sparsefinder.predictors.per_head.PerHeadSelect`, or for routed k-means one
   predictor with a per-head budget).

The macro sparsity on train is then the target up to the grid's granularity (72 heads fill
the gaps); validation is never looked at.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from sparsefinder.calibration.allocation import allocate
from sparsefinder.data.records import AttentionRecord
from sparsefinder.methods.param import TARGET_SPARSITY
from sparsefinder.methods.parts import Parts
from sparsefinder.methods.registry import METHODS, MethodUnavailable, get_method
from sparsefinder.methods.spec import PredictorSpec, RecordInputs, predict_record
from sparsefinder.metrics.scorer import Scorer
from sparsefinder.predictors.per_head import PerHeadSelect

Params = dict[str, Any]


@dataclass
class GridTable:
    """Per-head macro recall and density of every grid point on train records.

    ``grid``: the raw parameter dicts that could be built (G); ``recall``/``density``:
    float64 (layers, heads, G); ``skipped``: ``"{params}: reason"`` of every point left out.
    """

    method: str
    grid: list[Params]
    recall: Tensor
    density: Tensor
    n_texts: int
    skipped: list[str] = field(default_factory=list)

    def choose(self, target_sparsity: float) -> Tensor:
        """Grid index per head, long (layers, heads), meeting ``target_sparsity`` on train."""
        TARGET_SPARSITY.check(target_sparsity, text=False)
        return allocate(self.density, self.recall, float(target_sparsity), None)[..., 0]

    def train_scores(self, choice: Tensor) -> tuple[float, float]:
        """(mean recall, mean sparsity) on train of a choice (layers, heads)."""
        pick = choice[..., None]
        return (float(self.recall.gather(-1, pick).mean()),
                1.0 - float(self.density.gather(-1, pick).mean()))


def measure_grid(records: Sequence[AttentionRecord], projections: Any, method: str,
                 grid: Sequence[Params], codebooks: Any = None) -> GridTable:
    """Score every raw setting of ``method`` on TRAIN ``records`` per (layer, head)
    (``codebooks``: routed k-means' key codebooks when they are not yet where the library
    looks them up, a bundle being prepared; None: the library's lookup)."""
    if not records:
        raise ValueError("per-head calibration needs at least one TRAIN record")
    num_layers = records[0].num_layers
    specs, built, kept, skipped = [], [], [], []
    parts = Parts(projections=projections, codebooks=codebooks)
    for params in grid:  # points that cannot be built (no centroids for that B) are left out
        spec = PredictorSpec.of(method, params)
        try:
            built.append(spec.build_layers(parts, num_layers))
        except ValueError as error:  # MethodUnavailable is one
            skipped.append(f"{spec.params_json()}: {error}")
            continue
        specs.append(spec)
        kept.append(dict(params))
    if not specs:
        # sweeps skip this method's points with a warning naming the reason
        raise MethodUnavailable(f"no setting of {method!r} can be built with these "
                                "projections (e.g. no centroids or codebooks for them)")
    recall = density = None
    for record in records:
        scorer = Scorer(record, extra=False)
        vectors = RecordInputs(record, projections if specs[0].needs_projections else None)
        scores = [scorer.score(predict_record(spec, layers, vectors))
                  for spec, layers in zip(specs, built, strict=True)]
        r = torch.stack([s.recall for s in scores], -1)
        d = 1.0 - torch.stack([s.sparsity for s in scores], -1)
        recall = r if recall is None else recall + r
        density = d if density is None else density + d
    return GridTable(method=method, grid=kept, recall=recall / len(records),
                     density=density / len(records), n_texts=len(records), skipped=skipped)


def layer_predictor(method: str, grid: Sequence[Params], picks: Tensor, projections: Any,
                    layer: int) -> Any:
    """The predictor of one layer whose head ``h`` uses ``grid[picks[h]]`` of the raw
    ``method`` (``picks``: long (heads,))."""
    picks = picks.long()
    if method == "kmeans-routed":  # one predictor, a key budget per head
        first = PredictorSpec.of(method, grid[0]).build(projections, layer)
        first.budget = torch.tensor([float(grid[i]["budget"]) for i in picks.tolist()])
        return first
    used = sorted(set(picks.tolist()))
    predictors = [PredictorSpec.of(method, grid[i]).build(projections, layer) for i in used]
    remap = torch.tensor([used.index(i) for i in picks.tolist()], dtype=torch.long)
    return PerHeadSelect(predictors, remap)


def head_grid(method: str) -> list[Params]:
    """The raw settings ``method``'s per-head ("budget") calibration chooses from: its
    catalog entry's ``Method.head_grid`` (its sweep grid, finer where a head's sparsity moves
    in large steps)."""
    grid = list(get_method(method).head_grid)
    if not grid:
        raise ValueError(f"method {method!r} declares no per-head grid (Method.head_grid)")
    return grid


def head_grid_families() -> list[str]:
    """The families that declare a per-head grid, in catalog order."""
    return [name for name, method in METHODS.items() if method.head_grid]


def head_grid_fitter(method: str, grid: Sequence[Params]
                     ) -> Callable[[Sequence[AttentionRecord]], Callable]:
    """``fit(train_records) -> factory(params, projections, layer)`` of one family's per-head
    ("budget") calibration over ``grid`` (the family's declared ``head_grid``): the grid is
    measured once per projections object, each target allocated once, and every layer built
    from that choice."""

    def fit(train_records: Sequence[AttentionRecord]) -> Callable:
        cache: dict[int, tuple[Any, GridTable, dict[float, Tensor]]] = {}

        def build(p: Params, projections: Any, layer: int) -> Any:
            entry = cache.get(id(projections))
            if entry is None or entry[0] is not projections:
                entry = (projections, measure_grid(train_records, projections, method, grid), {})
                cache[id(projections)] = entry
            target = float(p["target_sparsity"])
            if target not in entry[2]:
                entry[2][target] = entry[1].choose(target)
            table = entry[1]
            return layer_predictor(table.method, table.grid, entry[2][target][layer],
                                   projections, layer)

        return build

    return fit
