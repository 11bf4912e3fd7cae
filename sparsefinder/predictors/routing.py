"""Routing Transformer baseline (Roy et al., 2021; Sparsefinder paper §5 and appendix C).

Queries and keys are L2-normalised and clustered by spherical k-means (cosine similarity,
centroids on the unit sphere). Then *each centroid picks its tokens*: the ⌈n/c⌉ queries and
the ⌈m/c⌉ keys most similar to it (a top-k over the token axis, "balanced clusters", as in
appendix C with top-k = ⌈n/c⌉). An edge (i, j) is predicted iff query i and key j were
picked by a common centroid. Sparsefinder sweeps c ∈ {2, 4, 6, 8, 10}.

Difference from Sparsefinder's ``KMeans`` predictor: there the top-k runs over the
*centroids* (every token goes to its nearest centroid(s), so every query gets a bucket);
here it runs over the *tokens* (every centroid takes its nearest tokens), so a token may be
taken by several centroids, or by none — its row/column is then empty, which costs recall.

Centroids come from, in this order: ``fit`` (``fit_iter`` spherical k-means steps on training
projections, the offline analogue of Routing Transformer's online k-means), the
``centroids`` argument (heads, c, r), or, when neither is given, ``n_iter`` k-means steps on
the queries and keys of the text being predicted. Both start from c distinct random points
per head drawn with a ``torch.Generator`` seeded by ``seed``, so the same input always gives
the same graph. ``n_iter=5`` keeps the per-text fallback within the hot-path budget: in r=4
dimensions later steps barely move the centroids (routing_transformer initialises with 10).

The similarity, the k-means step and the top-k over tokens follow ``routing_transformer``
1.6.1 (``similarity``, ``kmeans_iter``, ``distribution`` and ``KmeansAttention.forward``
with ``shared_qk=False``), whose queries and keys are clustered together by one k-means.
``causal=True`` cuts the future afterwards (its causal mask within clusters).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from sparsefinder.attention.masks import apply_causal
from sparsefinder.predictors.base import check_shapes

_BIT_WEIGHTS = 2 ** torch.arange(8, dtype=torch.int32)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


# Layout note: similarities are kept as (heads, c, N) — centroids on the middle axis, tokens
# last. On CPU, a max over c is several times faster across the middle axis than along a
# short last axis, and the top-k over tokens then runs along the last axis.


def _unit(x: Tensor, dim: int = -1) -> Tensor:
    return F.normalize(x, dim=dim)


def _step(x: Tensor, xt: Tensor, centroids: Tensor) -> Tensor:
    """``kmeans_step`` on contiguous x (heads, N, r), its transpose xt (heads, r, N) and
    centroids (heads, c, r) → new centroids (heads, c, r)."""
    sim = torch.bmm(centroids, xt)  # (heads, c, N)
    # One-hot of the most similar centroid without argmax (slow on CPU): sim - max is 0 at
    # the max and < 0 elsewhere, so sign() + 1 is 1 there and 0 elsewhere.
    onehot = (sim - sim.amax(1, keepdim=True)).sign_().add_(1)
    sums = torch.bmm(onehot, x)  # (heads, c, r)
    counts = onehot.sum(-1, keepdim=True)  # (heads, c, 1)
    return torch.where(counts > 0, _unit(sums), centroids)


def kmeans_step(x: Tensor, centroids: Tensor) -> Tensor:
    """One spherical k-means (Lloyd) step: x (heads, N, r) unit vectors, centroids
    (heads, c, r) → new centroids (heads, c, r).

    Each point goes to its most similar centroid (dot product); a centroid becomes the
    normalised sum of its points, or stays put when it got none. (A point exactly tied
    between centroids counts for each; the reference takes the lowest id. Ties have
    probability zero for real-valued data.)
    """
    x = x.contiguous()
    return _step(x, x.transpose(1, 2).contiguous(), centroids.contiguous())


def spherical_kmeans(x: Tensor, n_clusters: int, n_iter: int, seed: int) -> Tensor:
    """Centroids (heads, c, r) of unit vectors x (heads, N, r) after ``n_iter`` steps from c
    distinct random points per head (repeats only when N < c)."""
    heads, n_points, r = x.shape
    if n_points == 0:  # nothing to cluster (an empty text): any centroids will do
        return torch.zeros(heads, n_clusters, r, dtype=x.dtype, device=x.device)
    gen = torch.Generator().manual_seed(seed)
    if n_points >= n_clusters:
        # The c largest of N iid uniforms: a uniformly random c-subset (cheaper than argsort).
        idx = torch.rand((heads, n_points), generator=gen).topk(n_clusters, dim=-1).indices
    else:
        idx = torch.randint(0, n_points, (heads, n_clusters), generator=gen)
    x = x.contiguous()
    xt = x.transpose(1, 2).contiguous()
    centroids = x.gather(1, idx.to(x.device)[..., None].expand(-1, -1, r))
    for _ in range(n_iter):
        centroids = _step(x, xt, centroids)
    return centroids


def _picks(x: Tensor, centroids: Tensor, size: int) -> Tensor:
    """bool (heads, c, N): True where token j is among the ``min(size, N)`` tokens most
    similar to centroid c (top-k over the token axis)."""
    heads, n_points, _ = x.shape
    member = torch.zeros(heads, centroids.shape[1], n_points, dtype=torch.bool, device=x.device)
    size = min(size, n_points)
    if size > 0:
        sim = torch.bmm(centroids, x.transpose(1, 2))  # (heads, c, N)
        member.scatter_(2, sim.topk(size, dim=-1, sorted=False).indices, True)
    return member


def routing_membership(x: Tensor, centroids: Tensor, size: int) -> Tensor:
    """Which centroids pick which tokens: x (heads, N, r) unit vectors, centroids (heads, c,
    r) → bool (heads, N, c), True where the token is among the ``min(size, N)`` tokens most
    similar to the centroid."""
    return _picks(x, centroids, size).transpose(1, 2)


def _packed(member: Tensor) -> Tensor:
    """bool (heads, c, N) → uint8 (heads, ⌈c/8⌉, N): bit b of byte p is cluster 8p + b."""
    heads, c, n_points = member.shape
    n_bytes = -(-c // 8)
    padded = torch.zeros(heads, n_bytes * 8, n_points, dtype=torch.int32, device=member.device)
    padded[:, :c] = member
    weights = _BIT_WEIGHTS.to(member.device)[:, None]
    return (padded.view(heads, n_bytes, 8, n_points) * weights).sum(2).to(torch.uint8)


@dataclass(eq=False)
class Routing:
    """Edge iff query i and key j are both among the tokens picked by some centroid
    (each centroid picks its ⌈n/c⌉ nearest queries and ⌈m/c⌉ nearest keys).

    Learned attribute: ``centroids_`` (heads, c, r), unit norm, after ``fit`` (or from the
    ``centroids`` argument).
    """

    n_clusters: int
    seed: int = 0
    centroids: Tensor | None = field(default=None, repr=False)
    n_iter: int = 5
    fit_iter: int = 50
    centroids_: Tensor | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        _check_int("n_clusters", self.n_clusters, 1)
        _check_int("seed", self.seed, 0)
        _check_int("n_iter", self.n_iter, 0)
        _check_int("fit_iter", self.fit_iter, 0)
        if self.centroids is not None:
            c = self.centroids
            if not isinstance(c, Tensor) or c.dim() != 3 or c.shape[1] != self.n_clusters:
                shape = tuple(c.shape) if isinstance(c, Tensor) else type(c).__name__
                raise ValueError(
                    f"centroids must be a tensor (heads, n_clusters={self.n_clusters}, r), "
                    f"got {shape}; pass n_clusters=centroids.shape[1]"
                )
            self.centroids_ = _unit(c.detach().float())

    def fit(self, q: Tensor, k: Tensor) -> Routing:
        """Learn per-head centroids from training projections q (heads, Nq, r), k (heads,
        Nk, r) (tokens of many texts stacked on the token axis): ``fit_iter`` spherical k-means
        steps on queries and keys together, seeded by ``seed``."""
        check_shapes(q, k)
        x = _unit(torch.cat([q, k], dim=1).detach().float())
        if x.shape[1] < self.n_clusters:
            raise ValueError(
                f"fit got {x.shape[1]} points per head but n_clusters={self.n_clusters}; "
                f"pass more training tokens or lower n_clusters"
            )
        self.centroids_ = spherical_kmeans(x, self.n_clusters, self.fit_iter, self.seed)
        return self

    def _centroids_for(self, qn: Tensor, kn: Tensor) -> Tensor:
        if self.centroids_ is None:
            return spherical_kmeans(
                torch.cat([qn, kn], dim=1), self.n_clusters, self.n_iter, self.seed
            )
        centroids = self.centroids_
        if centroids.shape[0] != qn.shape[0] or centroids.shape[2] != qn.shape[2]:
            raise ValueError(
                f"centroids {tuple(centroids.shape)} do not fit q {tuple(qn.shape)}: "
                f"expected (heads={qn.shape[0]}, c, r={qn.shape[2]})"
            )
        return centroids.to(qn.device, qn.dtype)

    def _picks(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        check_shapes(q, k)
        dtype = torch.promote_types(q.dtype, torch.float32)
        qn, kn = _unit(q.to(dtype)), _unit(k.to(dtype))
        centroids = self._centroids_for(qn, kn)
        c = self.n_clusters
        return (
            _picks(qn, centroids, math.ceil(q.shape[1] / c)),
            _picks(kn, centroids, math.ceil(k.shape[1] / c)),
        )

    def membership(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Cluster membership of queries, bool (heads, n, c), and keys, bool (heads, m, c)."""
        pq, pk = self._picks(q, k)
        return pq.transpose(1, 2), pk.transpose(1, 2)

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m)."""
        pq, pk = self._picks(q, k)
        bq, bk = _packed(pq), _packed(pk)
        # Bitwise AND of uint8 cluster bits (fast) instead of comparisons (slow on CPU).
        both = bq[:, 0, :, None] & bk[:, 0, None, :]  # uint8 (heads, n, m)
        for p in range(1, bq.shape[1]):  # loop over groups of 8 clusters, not tokens
            both |= bq[:, p, :, None] & bk[:, p, None, :]
        return apply_causal(both.bool(), causal)
