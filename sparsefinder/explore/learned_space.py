"""Why an edge: one head's learned space, where Sparsefinder decides each query–key pair.

A learned predictor looks only at the two projected vectors of a pair (r = 4 or 8
coordinates): their distance (a threshold ``t``, a per-head calibrated threshold, or a
row's nearest keys), the equal-population bins they fall in (quantization) or their nearest
k-means centroids. The diff of the Explorer shows the outcome; this view-model shows the
reason. For one head and one query row it gives

- a fixed linear map of the head's space onto a plane (:class:`Plane`): exact for r ≤ 2,
  else the two principal axes of the head's keys, with the share of their variance kept;
- the exact projected distance of every key to the query (a plane distorts them);
- the decision of the real predictor for the row (:class:`Decision`), restated in terms a
  figure can draw: the threshold, the query's bin interval along every dimension, or its
  chosen clusters. The kept keys are the predictor's own mask, never recomputed another way,
  and the tests check that the restatement reproduces it.

The model never runs: everything reads the prepared text's cached projected vectors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from sparsefinder.attention.masks import layer_allowed
from sparsefinder.explore.long_view import head_probs
from sparsefinder.explore.prepared import PreparedText
from sparsefinder.methods.spec import PredictorSpec, predict_layer
from sparsefinder.predictors import Distance, GlobalTokens, KMeans, Quantization, Union, Window
from sparsefinder.predictors.base import Predictor
from sparsefinder.predictors.distance import pairwise_sq_dist
from sparsefinder.predictors.row_floor import RowFloor
from sparsefinder.predictors.row_fraction import RowFraction
from sparsefinder.predictors.threshold_distance import ThresholdDistance

#: Decision kinds: a distance threshold, shared bins, shared clusters, or none in this space.
THRESHOLD, QUANTIZATION, KMEANS, OUTSIDE = "threshold", "quantization", "kmeans", "outside"


@dataclass(frozen=True)
class Plane:
    """A fixed linear map ``x ↦ (x − origin) · axesᵀ`` of the r-dim space onto 2-D."""

    origin: Tensor  # float64 (r,)
    axes: Tensor  # float64 (2, r), orthonormal rows
    explained: float  # share of the keys' variance the plane keeps (1 when exact)
    exact: bool  # r ≤ 2: the plane is the space itself (distances are true distances)

    def apply(self, x: Tensor) -> Tensor:
        """(..., r) → float64 (..., 2)."""
        return (x.double() - self.origin) @ self.axes.T


def fit_plane(keys: Tensor) -> Plane:
    """The plane of one head: the space itself when r ≤ 2, else PCA fitted on its keys.

    Fitted on keys (what a query is compared with) and fixed for the head, so moving the
    query never moves the points. Axis signs are fixed (largest loading positive) so that
    the picture does not flip between runs.
    """
    if keys.dim() != 2 or keys.shape[0] < 1:
        raise ValueError(f"expected keys of shape (m >= 1, r), got {tuple(keys.shape)}")
    r = keys.shape[1]
    x = keys.double()
    if r <= 2:
        return Plane(torch.zeros(r, dtype=torch.float64),
                     torch.eye(2, r, dtype=torch.float64), 1.0, True)
    origin = x.mean(0)
    _, s, vh = torch.linalg.svd(x - origin, full_matrices=False)
    axes = vh[:2]
    signs = torch.sign(axes.gather(1, axes.abs().argmax(1, keepdim=True)))
    axes = axes * torch.where(signs == 0, 1.0, signs)
    var = s.square()
    total = float(var.sum())
    explained = float(var[:2].sum()) / total if total > 0 else 1.0
    return Plane(origin, axes, explained, False)


@dataclass(frozen=True)
class Decision:
    """How the method's predictor decides the selected row, in terms a figure can draw.

    ``keep`` is the predictor's own mask row (window and global tokens not included). For
    ``THRESHOLD``: an allowed key is kept iff its distance ≤ ``threshold`` (NaN: the row
    keeps no key). ``QUANTIZATION``: iff it shares the query's bin in some dimension; ``bands`` are
    the key values of that bin per dimension. ``KMEANS``: iff one of its clusters is one of
    the query's. ``OUTSIDE``: the method does not decide in this space.
    """

    kind: str
    keep: Tensor  # bool (m,)
    rule: str  # the rule in words, with its numbers
    threshold: float | None = None
    query_bins: Tensor | None = None  # long (r,)
    key_bins: Tensor | None = None  # long (m, r)
    bands: Tensor | None = None  # float64 (r, 2): low/high key value in the query's bin
    centroids: Tensor | None = None  # float32 (B, r)
    query_clusters: Tensor | None = None  # long (k,), nearest first
    key_clusters: Tensor | None = None  # long (m, k)


@dataclass(frozen=True)
class HeadSpace:
    """One head's learned space around one query: points, exact distances, the decision."""

    layer: int
    head: int
    query: int
    queries: Tensor  # float32 (n, r) projected queries of the head
    keys: Tensor  # float32 (m, r)
    plane: Plane
    distances: Tensor  # float32 (m,): exact ‖q′ − k′_j‖ in the r-dim space
    gold: Tensor  # bool (m,): gold keys of the row
    probs: Tensor  # float32 (m,): their α-entmax probabilities (0 elsewhere)
    predicted: Tensor  # bool (m,): the method's full prediction (window, global included)
    decision: Decision
    allowed: Tensor  # bool (m,): keys the row may attend to (all but a decoder's future)

    @property
    def queries_2d(self) -> Tensor:
        return self.plane.apply(self.queries)

    @property
    def keys_2d(self) -> Tensor:
        return self.plane.apply(self.keys)

    @property
    def order(self) -> Tensor:
        """Keys from nearest to farthest (ties by position)."""
        return torch.argsort(self.distances, stable=True)

    @property
    def by_pattern(self) -> Tensor:
        """bool (m,): kept only by the window / global tokens added to the method."""
        return self.predicted & ~self.decision.keep

    @property
    def missed(self) -> Tensor:
        return self.gold & ~self.predicted

    @property
    def gold_mass(self) -> float:
        return float(self.probs.sum())

    @property
    def missed_mass(self) -> float:
        """α-entmax probability mass of the row's gold keys the prediction misses."""
        return float(self.probs[self.missed].sum())

    def reach(self) -> float | None:
        """Distance of the farthest gold key: the smallest threshold that keeps them all
        (None: the row has no gold key)."""
        return float(self.distances[self.gold].max()) if bool(self.gold.any()) else None

    def kept_within(self, radius: float) -> int:
        """How many keys lie within ``radius`` of the query (what that threshold keeps)."""
        return int(((self.distances <= radius) & self.allowed).sum())


@torch.inference_mode()
def head_space(prepared: PreparedText, spec: PredictorSpec, layer: int, head: int,
               query: int, predicted: Tensor | None = None) -> HeadSpace:
    """The learned space of head ``(layer, head)`` around ``query`` for the setting ``spec``.

    ``predicted``: the head's row of the full prediction when the caller has it (the app's
    cached masks); else it is predicted here, for this head only.
    """
    record = prepared.record
    for name, value, size in (("layer", layer, record.num_layers),
                              ("head", head, record.num_heads),
                              ("query", query, record.n_tokens)):
        if not 0 <= value < size:
            raise ValueError(f"{name} must be in [0, {size - 1}], got {value}")
    vectors = prepared.inputs_for(spec.method_id)
    if not vectors.has_projections:
        raise ValueError("the learned space needs projections for this model; train them with "
                         "`sparsefinder train --model NAME --out DIR` and load the file")
    q, k = vectors.projected(layer)
    qh, kh = q[head], k[head]
    graph = record.layers[layer]
    causal, window = record.causal, graph.sliding_window
    sq = pairwise_sq_dist(qh[None], kh[None])[0]  # the call shape the predictors make
    distances = sq[query].sqrt()
    base = PredictorSpec.of(spec.method, spec.param_dict, calibration=spec.calibration).build(
        vectors.projections, layer, prepared.fitted(spec.method_id))
    inputs = vectors.get(layer, spec.inputs)
    keep = _row(base, inputs, head, query, causal, window)
    row_allowed = layer_allowed(qh.shape[0], kh.shape[0], causal=causal, sliding_window=window)
    allowed = (torch.ones(kh.shape[0], dtype=torch.bool) if row_allowed is None
               else row_allowed[query].clone())
    decision = _decision(base, keep, qh, kh, sq[query], head, query, spec.inputs, allowed)
    if predicted is None:
        full = spec.build(vectors.projections, layer, prepared.fitted(spec.method_id))
        predicted = _row(full, inputs, head, query, causal, window)
    probs = head_probs(graph, head, slice(query, query + 1), slice(None))[0]
    return HeadSpace(layer, head, query, qh, kh, fit_plane(kh), distances,
                     graph.gold_of(head)[query].clone(), probs.float(), predicted.clone(),
                     decision, allowed)


def one_head(predictor: Predictor, head: int) -> Predictor | None:
    """The predictor of head ``head`` alone (input with one head), or None when its type is
    not known here (then the whole layer is predicted and the head sliced out)."""
    if isinstance(predictor, Union):
        parts = [one_head(p, head) for p in predictor.predictors]
        return None if any(p is None for p in parts) else Union(*parts)
    if isinstance(predictor, Distance | Quantization | Window | GlobalTokens):
        return predictor  # nothing per head
    if isinstance(predictor, KMeans) and predictor.centroids_ is not None:
        return KMeans.from_centroids(predictor.centroids_[head:head + 1], predictor.top_k)
    if isinstance(predictor, ThresholdDistance):
        return ThresholdDistance(predictor.sq_thresholds[head:head + 1])
    if isinstance(predictor, RowFraction):
        return RowFraction(predictor.fractions[head:head + 1])
    if isinstance(predictor, RowFloor):  # the floor counts per row: the base per head
        base = None if predictor.base is None else one_head(predictor.base, head)
        if predictor.base is not None and base is None:
            return None
        return RowFloor(base, predictor.floor, predictor.row_share)
    return None


def _row(predictor: Predictor | None, inputs: tuple[Tensor, Tensor], head: int, query: int,
         causal: bool, window: int | None) -> Tensor:
    """bool (m,): the predictor's mask row of (head, query), predicted as a record is."""
    q, k = inputs
    if predictor is None:  # nothing switched on: the empty graph
        return torch.zeros(k.shape[1], dtype=torch.bool)
    single = one_head(predictor, head)
    if single is None:
        return predict_layer(predictor, q, k, causal=causal, sliding_window=window)[head, query]
    mask = predict_layer(single, q[head:head + 1], k[head:head + 1], causal=causal,
                         sliding_window=window)
    return mask[0, query]


def _decision(base: Predictor | None, keep: Tensor, qh: Tensor, kh: Tensor, sq_row: Tensor,
              head: int, query: int, inputs: str, allowed: Tensor) -> Decision:
    """Restate the base predictor's decision of the row (``keep``) in drawable terms."""
    if inputs != "projected" or base is None:
        return Decision(OUTSIDE, keep, "decided outside the learned space (the model's own "
                        "q/k or token positions)" if base is not None else "no learned part")
    if isinstance(base, Distance):
        t = float(base.threshold)
        return Decision(THRESHOLD, keep, f"kept iff d ≤ t = {t:.4g}", threshold=t)
    if isinstance(base, ThresholdDistance):
        t2 = float(base.sq_thresholds[head])
        t = math.sqrt(t2) if t2 >= 0 else math.nan
        return Decision(THRESHOLD, keep, f"kept iff d ≤ t = {t:.4g} (this head's calibrated "
                        "threshold)", threshold=t)
    if isinstance(base, RowFraction):
        count, kept = int(allowed.sum()), int(keep.sum())
        t = float(sq_row[keep].max().sqrt()) if kept else math.nan
        fraction = float(base.fractions[head])
        return Decision(THRESHOLD, keep, f"kept iff among the {kept} nearest of {count} keys "
                        f"(fraction {fraction:.3f}): d ≤ {t:.4g}", threshold=t)
    if isinstance(base, RowFloor):  # the threshold drawn; the floor's keys kept besides
        floor = (f"or among the row's {base.floor} nearest keys" if base.row_share is None
                 else f"or among the row's nearest keys (at most {base.floor})")
        if base.base is None:
            return Decision(OUTSIDE, keep, f"kept iff {floor.removeprefix('or ')}")
        inner = _decision(base.base, keep, qh, kh, sq_row, head, query, inputs, allowed)
        return replace(inner, rule=f"{inner.rule}, {floor}")
    if isinstance(base, Quantization):
        return _quantization(base, keep, qh, kh, query)
    if isinstance(base, KMeans):
        return _kmeans(base, keep, qh, kh, head, query)
    return Decision(OUTSIDE, keep, f"{type(base).__name__} has no drawable decision here")


def _quantization(base: Quantization, keep: Tensor, qh: Tensor, kh: Tensor,
                  query: int) -> Decision:
    """Bins as the predictor assigns them (queries ranked among queries, keys among keys)."""
    query_bins = base.assign(qh[None])[0, query]
    key_bins = base.assign(kh[None])[0]
    same = key_bins == query_bins  # (m, r): key shares the query's bin in dimension d
    values = kh.double()
    low = torch.where(same, values, torch.inf).min(0).values
    high = torch.where(same, values, -torch.inf).max(0).values
    bands = torch.stack([low, high], dim=1)
    bands[~same.any(0)] = math.nan
    return Decision(QUANTIZATION, keep, f"kept iff it shares the query's bin in one of "
                    f"{kh.shape[1]} dimensions (β = {base.bins} bins each)",
                    query_bins=query_bins, key_bins=key_bins, bands=bands)


def _kmeans(base: KMeans, keep: Tensor, qh: Tensor, kh: Tensor, head: int,
            query: int) -> Decision:
    """Clusters as the predictor assigns them (queries and keys in one pass)."""
    single = KMeans.from_centroids(base.centroids_[head:head + 1], base.top_k)
    ids = single.assign(torch.cat([qh, kh])[None])[0]
    n = qh.shape[0]
    clusters = int(single.centroids_.shape[1])
    return Decision(KMEANS, keep, f"kept iff one of its {base.top_k} nearest centroids is one "
                    f"of the query's (B = {clusters})",
                    centroids=single.centroids_[0].float(), query_clusters=ids[query],
                    key_clusters=ids[n:])


def kmeans_region(space: HeadSpace, xs: Tensor, ys: Tensor) -> Tensor | None:
    """bool (len(ys), len(xs)): where a key would be kept on a grid of the plane, for
    k-means on an exact plane (r = 2); None otherwise (a plane point is no r-dim point)."""
    decision = space.decision
    if decision.kind != KMEANS or not space.plane.exact or space.keys.shape[1] != 2:
        return None
    grid = torch.stack(torch.meshgrid(ys.double(), xs.double(), indexing="ij")[::-1], -1)
    points = grid.reshape(-1, 2).float()
    top_k = int(decision.query_clusters.numel())
    ids = KMeans.from_centroids(decision.centroids[None], top_k).assign(points[None])[0]
    inside = torch.isin(ids, decision.query_clusters).any(-1)
    return inside.reshape(len(ys), len(xs))


def reasons(space: HeadSpace) -> list[str]:
    """Why each key is kept or not, in words (one per key), from the decision's own terms:
    its distance against the threshold, the bins or the clusters it shares with the query."""
    d = space.decision
    out = []
    for j in range(space.keys.shape[0]):
        if not bool(space.allowed[j]):
            out.append("not allowed (a future key)")
            continue
        if bool(space.by_pattern[j]):
            out.append("kept by the window / global tokens")
            continue
        kept = bool(d.keep[j])
        if d.kind == THRESHOLD:
            if d.threshold is None or not math.isfinite(d.threshold):
                out.append("the row keeps no key")
            else:
                gap = float(space.distances[j]) - d.threshold
                out.append(f"d − t = {gap:+.3g}" + (" (within t)" if kept else " (beyond t)"))
        elif d.kind == QUANTIZATION:
            shared = (d.key_bins[j] == d.query_bins).nonzero().flatten().tolist()
            out.append("shares its bin in dim " + ", ".join(str(s + 1) for s in shared)
                       if shared else "no shared bin: bins "
                       + ",".join(map(str, d.key_bins[j].tolist())) + " vs the query's "
                       + ",".join(map(str, d.query_bins.tolist())))
        elif d.kind == KMEANS:
            mine = d.key_clusters[j].tolist()
            shared = [c for c in mine if c in set(d.query_clusters.tolist())]
            out.append("shares cluster " + ", ".join(f"c{c}" for c in shared) if shared else
                       "clusters " + ", ".join(f"c{c}" for c in mine) + " vs the query's "
                       + ", ".join(f"c{c}" for c in d.query_clusters.tolist()))
        else:
            out.append("kept by the method" if kept else "not kept by the method")
    return out
