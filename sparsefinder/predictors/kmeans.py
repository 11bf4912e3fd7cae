"""Buckets through clustering (paper §4.5 and appendix C): offline k-means on projections.

Per head, B centroids are learned offline with scikit-learn's k-means (k-means++ init,
``n_init`` restarts, ``max_iter`` iterations; paper Table 5) on the projected queries and keys
of a training sample. At prediction time every query and every key goes to its ``top_k``
nearest centroids (Eq. 8–9) and a pair is an edge when the two sets intersect. Assigning
points to centroids (not centroids to points, as Routing Transformer does) means no query is
ever left without a bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from sparsefinder.attention.masks import apply_causal
from sparsefinder.predictors.base import check_shapes


def membership_bytes(ids: Tensor, n_clusters: int) -> Tensor:
    """Cluster sets as bit masks: ids (heads, N, k) → uint8 (heads, ceil(B/8), N).

    Byte p, bit b is set iff cluster ``8p + b`` is among the ids. Two sets intersect iff some
    byte pair has a non-zero AND, which on CPU is far cheaper than a float matmul of one-hot
    matrices or an int64 comparison over the (heads, n, m) output.
    """
    n_bytes = -(-n_clusters // 8)
    packed = torch.zeros(*ids.shape[:2], n_bytes, dtype=torch.int64, device=ids.device)
    # ids of one point are distinct, so adding their bits is the same as OR-ing them
    packed.scatter_add_(-1, ids // 8, torch.ones_like(ids) << (ids % 8))
    return packed.to(torch.uint8).transpose(1, 2).contiguous()


def intersect(bq: Tensor, bk: Tensor) -> Tensor:
    """bool (heads, n, m): do the bit sets bq (heads, P, n) and bk (heads, P, m) intersect?

    Works in uint8 and ends with a 0/1 byte tensor reinterpreted as bool, so only one
    (heads, n, m) buffer is allocated: big fresh allocations page-fault on every call.
    """
    acc = bq[:, 0, :, None] & bk[:, 0, None, :]
    if bq.shape[1] > 1:
        tmp = torch.empty_like(acc)
        for p in range(1, bq.shape[1]):  # loop over groups of 8 centroids, not tokens
            acc |= torch.bitwise_and(bq[:, p, :, None], bk[:, p, None, :], out=tmp)
    return acc.clamp_(max=1).view(torch.bool)


def head_samples(n_points: int, heads: int, max_points: int | None,
                 random_state: int) -> list[np.ndarray | None]:
    """Sorted indices of the points each head's fit uses (None: all ``n_points``).

    Drawn without replacement from one generator seeded by ``random_state``, head after head,
    so any process that knows ``n_points`` draws the same sample (the distributed fit in
    :mod:`sparsefinder.projections.distributed_centroids` relies on it).
    """
    if max_points is None or n_points <= max_points:
        return [None] * heads
    rng = np.random.default_rng(random_state)
    return [np.sort(rng.choice(n_points, max_points, replace=False)) for _ in range(heads)]


def fit_head_centroids(
    x_all: np.ndarray, n_clusters: int, *, n_init: int, max_iter: int, random_state: int,
    max_points: int | None,
) -> tuple[Tensor, Tensor]:
    """One scikit-learn k-means (k-means++) per head of float32 points (heads, N, d) →
    (centroids (heads, B, d) float32, inertia (heads,) float64). Heads with more than
    ``max_points`` points are subsampled without replacement (:func:`head_samples`)."""
    from sklearn.cluster import KMeans as SkKMeans  # here: importing it costs ~0.5 s

    samples = head_samples(x_all.shape[1], x_all.shape[0], max_points, random_state)
    centroids, inertia = [], []
    for x, sample in zip(x_all, samples, strict=True):  # one sklearn fit per head
        if sample is not None:
            x = x[sample]
        km = SkKMeans(n_clusters=n_clusters, init="k-means++", n_init=n_init,
                       max_iter=max_iter, random_state=random_state).fit(x)
        centroids.append(torch.from_numpy(km.cluster_centers_.astype(np.float32)))
        inertia.append(float(km.inertia_))
    return torch.stack(centroids), torch.tensor(inertia, dtype=torch.float64)


@dataclass
class KMeans:
    """Edge iff a query and a key share one of their ``top_k`` nearest centroids.

    ``top_k`` is a plain attribute and may be changed after ``fit``: the centroids do not
    depend on it, so a sparsity–recall sweep over ``top_k`` needs only one fit. For fixed
    centroids a larger ``top_k`` never removes edges.

    Learned attributes: ``centroids_`` (heads, B, r) and, after ``fit``, ``inertia_`` (heads,).
    """

    n_clusters: int = 8
    top_k: int = 1
    random_state: int = 0
    n_init: int = 10
    max_iter: int = 300
    max_points: int | None = 20000
    centroids_: Tensor | None = field(default=None, init=False, repr=False)
    inertia_: Tensor | None = field(default=None, init=False, repr=False)

    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput

    def __post_init__(self) -> None:
        for name in ("n_clusters", "top_k", "n_init", "max_iter"):
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
        self._check_top_k(self.n_clusters)

    def _check_top_k(self, n_clusters: int) -> None:
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f"top_k must be an integer >= 1, got {self.top_k!r}")
        if self.top_k > n_clusters:
            raise ValueError(
                f"top_k={self.top_k} exceeds n_clusters={n_clusters}; choose top_k <= n_clusters"
            )

    @classmethod
    def from_centroids(cls, centroids: Tensor, top_k: int = 1) -> KMeans:
        """A predictor from known centroids (heads, B, r), e.g. loaded from disk."""
        if not isinstance(centroids, Tensor) or centroids.dim() != 3 or centroids.shape[1] < 1:
            shape = tuple(centroids.shape) if isinstance(centroids, Tensor) else type(centroids)
            raise ValueError(f"centroids must be a tensor of shape (heads, B, r), got {shape}")
        model = cls(n_clusters=centroids.shape[1], top_k=top_k)
        model.centroids_ = centroids.detach().clone()
        return model

    def fit(self, q: Tensor, k: Tensor) -> KMeans:
        """Learn per-head centroids from training projections q (heads, Nq, r), k (heads, Nk, r).

        Queries and keys of a head are clustered together (they must share buckets). Stack
        the tokens of many texts along the token axis. Heads with more than ``max_points``
        points are subsampled without replacement, seeded by ``random_state``, so that fitting
        stays fast and reproducible.
        """
        check_shapes(q, k)
        x_all = torch.cat([q, k], dim=1).detach().to("cpu", torch.float32).numpy()
        n_points = x_all.shape[1]
        if n_points < self.n_clusters:
            raise ValueError(
                f"fit got {n_points} points per head but n_clusters={self.n_clusters}; "
                f"pass more training tokens or lower n_clusters"
            )
        self.centroids_, self.inertia_ = fit_head_centroids(
            x_all, self.n_clusters, n_init=self.n_init, max_iter=self.max_iter,
            random_state=self.random_state, max_points=self.max_points)
        self.centroids_ = self.centroids_.to(q.device)
        return self

    def _centroids_for(self, x: Tensor) -> Tensor:
        if self.centroids_ is None:
            from sklearn.exceptions import NotFittedError  # see fit_centroids: import cost

            raise NotFittedError(
                "this KMeans predictor has no centroids; call fit() or from_centroids() first"
            )
        c = self.centroids_
        if x.dim() != 3 or x.shape[0] != c.shape[0] or x.shape[2] != c.shape[2]:
            raise ValueError(
                f"expected x of shape (heads={c.shape[0]}, N, r={c.shape[2]}) to match the "
                f"centroids {tuple(c.shape)}, got {tuple(x.shape)}"
            )
        self._check_top_k(c.shape[1])
        dtype = torch.promote_types(x.dtype, torch.float32)
        return c.to(x.device, dtype)

    def assign(self, x: Tensor) -> Tensor:
        """Ids of the ``top_k`` nearest centroids: (heads, N, r) → LongTensor (heads, N, top_k).

        Ordered nearest first.
        """
        c = self._centroids_for(x)
        # ||x - c||² = ||x||² - 2 x·c + ||c||²; the first term is the same for every centroid,
        # so ranking ||c||² - 2 x·c (one small batched matmul) gives the same neighbours.
        score = torch.baddbmm(
            c.pow(2).sum(-1)[:, None, :], x.to(c.dtype), c.transpose(1, 2), alpha=-2.0
        )
        if self.top_k == 1:
            return score.argmin(-1, keepdim=True)
        return score.topk(self.top_k, dim=-1, largest=False, sorted=True).indices

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m)."""
        check_shapes(q, k)
        n = q.shape[1]
        ids = self.assign(torch.cat([q, k], dim=1))  # one pass for queries and keys
        bits = membership_bytes(ids, self.centroids_.shape[1])
        return apply_causal(intersect(bits[..., :n], bits[..., n:]), causal)
