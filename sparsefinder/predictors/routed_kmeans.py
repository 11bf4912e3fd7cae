"""Buckets that queries are ROUTED to: k-means on keys, queries pick centroids by q·c.

Why not the paper's k-means (:mod:`sparsefinder.predictors.kmeans`): it clusters the union
of projected queries and keys and links a query to a key when both are NEAREST to one
centroid. Queries and keys occupy different regions of the space, so clustering their union
mostly separates queries from keys, and nearness is the wrong criterion anyway: attention
ranks keys by the inner product ``q·k``, not by ``‖q − k‖``. Measured on the default model's
validation split, that design stays at R@0.90 ≈ 0.41 whatever the projection.

This predictor uses one codebook of B centroids per head fitted OFFLINE on training KEYS
only (scikit-learn k-means; queries are never clustered):

* every key joins its nearest centroid (Euclidean k-means assignment);
* every query ranks the centroids by ``q·c``. Since ``q·k = q·c + q·(k − c)`` and k-means
  keeps ``‖k − c‖`` small, the centroid score estimates the scores of the cluster's keys;
* the query is routed to its best centroids, in that order, until they hold a ``budget``
  share of the keys it may see in THIS text (``mode="budget"``, the default), or to a fixed
  number ``n_routes`` of them (``mode="top"``). Counting the text's own keys per cluster
  (a bincount, O(m)) gives every query about the same number of keys whatever the cluster
  sizes, which is what the top-k oracle does with exact scores; it measured ~+3 recall points
  at sparsity 0.9 over a fixed number of centroids.

An edge (i, j) is predicted iff key j's cluster is among query i's routes: the graph is the
union over centroids b of the blocks {queries routed to b} × {keys in b}. Assignment costs
O((n + m)·B·d) plus sorting B scores per query, never n·m scores; only writing the output
mask is n·m. It works on any vectors of matching dimension: we use the ORIGINAL queries and
keys (head dimension 32 for the default model). On 60 texts of the train split, B = 128,
budget 0.08: recall 0.73 at sparsity 0.90 on the original vectors, against 0.65 on the
bundled 4-dimensional projections with centroids ranked by ‖q' − c‖ (what the projections
are trained for) and 0.59 with q'·c.

Learned attributes: ``centroids_`` (heads, B, d) and, after ``fit``, ``inertia_`` (heads,).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from sparsefinder.attention.masks import apply_causal
from sparsefinder.predictors.base import check_shapes
from sparsefinder.predictors.kmeans import fit_head_centroids

MODES = ("budget", "top")


@dataclass
class RoutedKMeans:
    """Edge iff key j's centroid is among the centroids query i is routed to (see module).

    ``budget`` (``mode="budget"``): share of the keys a query may see that its routes must
    cover (a float, or a 1-d tensor with one share per head); the last centroid taken may
    overshoot it. ``n_routes`` (``mode="top"``): number of
    centroids per query. Both are plain attributes that may change after ``fit``: the
    centroids do not depend on them. A larger budget or ``n_routes`` never removes edges.
    """

    n_clusters: int = 128
    budget: float | Tensor = 0.08
    mode: str = "budget"
    n_routes: int = 1
    random_state: int = 0
    n_init: int = 1
    max_iter: int = 100
    max_points: int | None = 20000
    centroids_: Tensor | None = field(default=None, init=False, repr=False)
    inertia_: Tensor | None = field(default=None, init=False, repr=False)

    needs_full_scores: ClassVar[bool] = False
    uses_projections: ClassVar[bool] = False
    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput

    def __post_init__(self) -> None:
        for name in ("n_clusters", "n_init", "max_iter", "n_routes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.max_points is not None and (
            not isinstance(self.max_points, int) or self.max_points < self.n_clusters
        ):
            raise ValueError(
                f"max_points must be None or an integer >= n_clusters={self.n_clusters}, "
                f"got {self.max_points!r}"
            )
        self._check_routing(self.n_clusters)

    def _check_routing(self, n_clusters: int) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if isinstance(self.budget, Tensor):  # one budget per head (per-head calibration)
            if self.budget.dim() != 1 or not bool(((self.budget > 0) & (self.budget <= 1)).all()):
                raise ValueError("a per-head budget must be a 1-d tensor of shares of keys in "
                                 f"(0, 1], got {self.budget.tolist()}")
        elif isinstance(self.budget, bool) or not isinstance(self.budget, int | float) or not (
            0.0 < self.budget <= 1.0
        ):
            raise ValueError(f"budget must be a share of keys in (0, 1], got {self.budget!r}")
        if self.n_routes > n_clusters:
            raise ValueError(
                f"n_routes={self.n_routes} exceeds n_clusters={n_clusters}; "
                "choose n_routes <= n_clusters"
            )

    @classmethod
    def from_centroids(cls, centroids: Tensor, **params: object) -> RoutedKMeans:
        """A predictor from known key centroids (heads, B, d), e.g. loaded from disk."""
        if not isinstance(centroids, Tensor) or centroids.dim() != 3 or centroids.shape[1] < 1:
            shape = tuple(centroids.shape) if isinstance(centroids, Tensor) else type(centroids)
            raise ValueError(f"centroids must be a tensor of shape (heads, B, d), got {shape}")
        model = cls(n_clusters=int(centroids.shape[1]), max_points=None, **params)
        model.centroids_ = centroids.detach().float().clone()
        return model

    def fit(self, q: Tensor | None, k: Tensor) -> RoutedKMeans:
        """Learn per-head centroids of training KEYS k (heads, Nk, d); q is not used.

        ``q`` is accepted for the fit(q, k) symmetry of the other predictors (pass None):
        queries are routed at prediction time, never clustered. Stack the keys of many
        texts along the token axis. Heads with more than ``max_points`` keys are subsampled
        without replacement, seeded by ``random_state``.
        """
        if not isinstance(k, Tensor) or k.dim() != 3:
            raise ValueError(f"k must be a tensor (heads, N, d), got {_shape(k)}")
        if q is not None:
            check_shapes(q, k)
        x_all = k.detach().to("cpu", torch.float32).numpy()
        n_points = x_all.shape[1]
        if n_points < self.n_clusters:
            raise ValueError(
                f"fit got {n_points} keys per head but n_clusters={self.n_clusters}; "
                "pass more training tokens or lower n_clusters"
            )
        centroids, self.inertia_ = fit_head_centroids(
            x_all, self.n_clusters, n_init=self.n_init, max_iter=self.max_iter,
            random_state=self.random_state, max_points=self.max_points)
        self.centroids_ = centroids.to(k.device)
        return self

    def _centroids_for(self, x: Tensor) -> Tensor:
        if self.centroids_ is None:
            from sklearn.exceptions import NotFittedError  # importing scikit-learn costs ~0.5 s

            raise NotFittedError(
                "this RoutedKMeans predictor has no centroids; call fit() or "
                "from_centroids() first"
            )
        c = self.centroids_
        if x.dim() != 3 or x.shape[0] != c.shape[0] or x.shape[2] != c.shape[2]:
            raise ValueError(
                f"expected vectors of shape (heads={c.shape[0]}, N, d={c.shape[2]}) to match "
                f"the centroids {tuple(c.shape)}, got {tuple(x.shape)}; RoutedKMeans reads the "
                "vectors its centroids were fitted on (the model's original queries/keys)"
            )
        self._check_routing(c.shape[1])
        return c.to(x.device, torch.promote_types(x.dtype, torch.float32))

    def assign_keys(self, k: Tensor) -> Tensor:
        """Nearest centroid of every key: (heads, m, d) → LongTensor (heads, m)."""
        c = self._centroids_for(k)
        # ||k - c||² ranks like ||c||² - 2 k·c (one batched matmul)
        score = torch.baddbmm(
            c.pow(2).sum(-1)[:, None, :], k.to(c.dtype), c.transpose(1, 2), alpha=-2.0
        )
        if score.device.type == "cpu" and score.dtype == torch.float32:
            # numpy's SIMD argmin is ~4× faster than torch's over a short last axis; both
            # return the first minimum, so the assignment is the same
            return torch.from_numpy(score.numpy().argmin(-1))
        return score.argmin(-1)

    def _counts(self, key_ids: Tensor, n: int, n_clusters: int, causal: bool,
                dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Keys per cluster each query may see, int32 (heads, n or 1, B), and how many keys
        it may see, ``dtype`` (n, 1) or a scalar: the two sides of the budget test."""
        heads, m = key_ids.shape
        device = key_ids.device
        if causal:  # query i sees keys j <= i + (m - n): count only those
            one_hot = torch.zeros(heads, m, n_clusters, dtype=torch.int32, device=device)
            one_hot.scatter_(2, key_ids[..., None], 1)
            seen = one_hot.cumsum(1, dtype=torch.int32)  # (heads, m, B): keys 0..j per cluster
            last = torch.arange(n, device=device) + (m - n)
            counts = seen.index_select(1, last.clamp(0, m - 1))
            counts.masked_fill_((last < 0)[None, :, None], 0)  # rows that see no key
            return counts, (last + 1).clamp(min=0).to(dtype)[:, None]
        counts = torch.zeros(heads, n_clusters, dtype=torch.int32, device=device)
        counts.scatter_add_(1, key_ids, torch.ones_like(key_ids, dtype=torch.int32))
        return counts[:, None, :], torch.tensor(float(m), dtype=dtype, device=device)

    def routes(self, q: Tensor, key_ids: Tensor, *, causal: bool = False) -> Tensor:
        """Bool (heads, n, B): the centroids each query is routed to (see module docstring).

        Query i takes its centroids from the best ``q·c`` down (ties: lower index first):
        the ``n_routes`` best (``mode="top"``), or each centroid whose better centroids hold
        fewer than ``budget · visible`` of the keys it may see (``mode="budget"``), so the
        taken set is always a prefix of that order and one threshold per query marks it.
        """
        c = self._centroids_for(q)
        n, n_clusters, m = q.shape[1], c.shape[1], key_ids.shape[1]
        score = torch.bmm(q.to(c.dtype), c.transpose(1, 2))  # (heads, n, B)
        if self.mode == "top":
            counts, limit = None, None
        else:
            counts, visible = self._counts(key_ids, n, n_clusters, causal, score.dtype)
            budget = self.budget
            if isinstance(budget, Tensor):
                if budget.shape[0] != q.shape[0]:
                    raise ValueError(f"{budget.shape[0]} per-head budgets for {q.shape[0]} heads")
                budget = budget.to(q.device, score.dtype)[:, None, None]
            limit = budget * visible
        if (score.device.type == "cpu" and score.dtype == torch.float32
                and n_clusters <= _PACK_CLUSTERS and m < _PACK_COUNT):
            return _routes_packed(score, counts, limit, self.n_routes)
        return _routes_sorted(score, counts, limit, self.n_routes)

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, d), k: (heads, m, d) ORIGINAL vectors → bool (heads, n, m)."""
        check_shapes(q, k)
        heads, n, m = q.shape[0], q.shape[1], k.shape[1]
        if n == 0 or m == 0:
            return torch.zeros(heads, n, m, dtype=torch.bool, device=q.device)
        key_ids = self.assign_keys(k)
        routed = self.routes(q, key_ids, causal=causal).view(torch.uint8)
        mask = routed.gather(2, key_ids[:, None, :].expand(heads, n, m))
        return apply_causal(mask.view(torch.bool), causal)


#: The packed CPU path holds a centroid's index in 8 bits and a key count in 24 bits.
_PACK_CLUSTERS, _PACK_COUNT = 256, 2**24


def _routes_sorted(score: Tensor, counts: Tensor | None, limit: Tensor | None,
                   n_routes: int) -> Tensor:
    """Routes by a full sort of each query's centroid scores (any device, any size)."""
    order = descending_order(score)
    if counts is None:  # mode "top"
        take = torch.zeros(score.shape, dtype=torch.bool, device=score.device)
        take[..., :n_routes] = True
        return torch.zeros_like(take).scatter_(2, order, take)
    counts = counts.expand(score.shape)
    sorted_counts = counts.gather(2, order)  # int32: exact and half the bytes of int64
    before = sorted_counts.cumsum(-1, dtype=torch.int32) - sorted_counts  # better centroids
    take = before < limit  # the best centroid is always taken (when any key is visible)
    return torch.zeros_like(take).scatter_(2, order, take)


def _words(packed: np.ndarray) -> np.ndarray:
    """uint32 view (..., 2) of int64 values as [low word, high word]."""
    words = packed.view(np.uint32).reshape(*packed.shape, 2)  # little-endian: [low, high]
    if sys.byteorder != "little":  # pragma: no cover - every supported platform is
        words = words[..., ::-1]
    return words


def _routes_packed(score: Tensor, counts: Tensor | None, limit: Tensor | None,
                   n_routes: int) -> Tensor:
    """:func:`_routes_sorted` on CPU without an argsort or a scatter, same routes.

    Each (query, centroid) becomes one int64 whose order is the routing order: high word,
    the float32 score as an order-preserving int32; low word (unsigned), ``B − 1 − index``
    in the top 8 bits (ties: lower index first) and the centroid's key count in the low 24.
    One integer ``np.sort`` per row (SIMD, ~15× faster than torch's sort of 128 floats)
    then lists the counts in routing order, their cumulative sum finds how many centroids
    the query takes, and since they are a prefix of the order the routes are the packed
    values ``>=`` the last one taken: no index is ever unpacked or scattered. ``score`` (a
    fresh tensor) is reused in place.
    """
    width = score.shape[-1]
    # in place on the fresh scores: + 0.0 turns -0.0 into +0.0, which torch ranks as equal
    bits = score.detach().contiguous().add_(0.0).view(torch.int32).numpy()
    packed = np.empty(bits.shape, dtype=np.int64)
    words = _words(packed)
    high = words[..., 1].view(np.int32)
    # float bits with negatives' magnitude flipped order like the floats (+0.0 == -0.0)
    np.bitwise_xor(bits, (bits >> 31) & np.int32(0x7FFFFFFF), out=high)
    low = (np.arange(width - 1, -1, -1, dtype=np.uint32) << np.uint32(24))
    if counts is None:
        words[..., 0] = low
    else:
        np.bitwise_or(low, counts.numpy().astype(np.uint32, copy=False), out=words[..., 0])
    ascending = torch.from_numpy(np.sort(packed, axis=-1))
    if counts is None:  # mode "top": the n_routes largest
        threshold = ascending[..., width - n_routes: width - n_routes + 1]
    else:
        # the counts in ascending routing order (low 24 bits of the low words) and their
        # running sums: the keys in strictly better centroids are ``total − cumulative``
        in_order = _words(ascending.numpy())[..., 0] & np.uint32(0xFFFFFF)
        cumulative = torch.from_numpy(np.cumsum(in_order.view(np.int32), -1, dtype=np.int32))
        total = cumulative[..., -1:]
        # a centroid is skipped iff total − cumulative >= limit, i.e. (cumulative is an
        # integer) cumulative <= ⌊total − limit⌋, exact in float64: a binary search per row
        bound = (total.double() - limit.double()).floor_().clamp_(-1, 2**31 - 1).int()
        skipped = torch.searchsorted(cumulative, bound.contiguous(), right=True)
        # skipped == width: nothing is taken (no visible key); any value above all will do
        threshold = ascending.gather(-1, skipped.clamp(max=width - 1))
        threshold = torch.where(skipped >= width, torch.iinfo(torch.int64).max, threshold)
    return torch.from_numpy(packed) >= threshold


def descending_order(score: Tensor) -> Tensor:
    """Indices sorting each row of ``score`` (..., B) from highest to lowest; ties: lower index
    first.

    On CPU, torch's sort of many short rows costs ~40 ms for 72 heads × 512 queries × 128
    centroids; numpy sorts plain integers with SIMD ~40× faster. So each float32 score is
    mapped to an int32 with the same order (its IEEE bits, negatives' magnitude flipped) and
    packed with ``B - 1 - index`` (low word) into one int64: one integer ``np.sort`` per row
    then gives the order, exactly (no precision lost), index included. Scores that float32
    cannot hold exactly (float64, integers) are sorted by torch: rounding them to float32 would
    tie values that differ.
    """
    if (score.device.type != "cpu" or score.shape[-1] >= 2**31
            or score.dtype not in (torch.float32, torch.float16, torch.bfloat16)):
        return torch.sort(score, stable=True, dim=-1, descending=True).indices
    width = score.shape[-1]
    # + 0.0 turns -0.0 into +0.0, which torch also ranks as equal
    bits = (score.detach().to(torch.float32) + 0.0).contiguous().view(torch.int32).numpy()
    key = np.empty(bits.shape, dtype=np.int64)
    words = key.view(np.int32).reshape(*bits.shape, 2)  # little-endian: [low, high]
    if sys.byteorder != "little":  # pragma: no cover - every supported platform is
        words = words[..., ::-1]
    # high word: the float's bits with negatives' magnitude bits flipped (same order as ints)
    np.bitwise_xor(bits, (bits >> 31) & np.int32(0x7FFFFFFF), out=words[..., 1])
    words[..., 0] = np.arange(width - 1, -1, -1, dtype=np.int32)  # B - 1 - index
    key.sort(axis=-1)
    index = (width - 1) - words[..., ::-1, 0].astype(np.int64)
    return torch.from_numpy(index)


def _shape(x: object) -> object:
    return tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
