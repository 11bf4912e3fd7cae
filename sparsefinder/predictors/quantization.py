"""Buckets through quantization (paper §4.4): no learning, only a binning of each dimension.

Each of the ``r`` projected dimensions is cut into ``bins`` (β) bins of equal population
("fixed-size binning"): the token of rank ``p`` along a dimension goes to bin
``p // ceil(N / β)``, so every bin holds ``ceil(N / β)`` tokens except possibly the last.
Queries are ranked among queries and keys among keys (per head and per dimension), so a
query and a key share a bucket when they sit at the same quantile of that dimension. A pair
is an edge when it shares a bucket in at least one dimension; there are ``r * β`` buckets.

Equal-population bins keep buckets balanced, which is what makes bucketed attention cost
O(B L²) with small L (§4.6). Ties are broken by token position (stable sort), so the result is
deterministic. Unlike the paper we do not append padding: the last bin is simply smaller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sparsefinder.attention.masks import apply_causal
from sparsefinder.predictors.base import check_shapes


def _ranks(x: Tensor) -> Tensor:
    """Rank (0-based) of every token along the token axis, per head and dimension."""
    order = torch.argsort(x, dim=-2, stable=True)
    ranks = torch.empty_like(order)
    positions = torch.arange(x.shape[-2], device=x.device).view(1, -1, 1).expand_as(order)
    return ranks.scatter_(-2, order, positions)


@dataclass
class Quantization:
    """Edge iff query and key fall in the same equal-population bin of some dimension."""

    bins: int

    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput

    def __post_init__(self) -> None:
        if isinstance(self.bins, bool) or not isinstance(self.bins, int) or self.bins < 1:
            raise ValueError(f"bins must be an integer >= 1, got {self.bins!r}")

    def n_buckets(self, r: int, n_tokens: int | None = None) -> int:
        """Buckets of an r-dimensional projection: r · β nominally (``n_tokens`` None); with
        N tokens per side each bin holds ⌈N/β⌉ of them, so only ⌈N / ⌈N/β⌉⌉ bins per
        dimension exist (e.g. N = 10, β = 6: 2 per bin, 5 bins, not 6)."""
        if n_tokens is None:
            return r * self.bins
        if n_tokens < 1:
            return 0
        per_bin = -(-n_tokens // self.bins)
        return r * -(-n_tokens // per_bin)

    def assign(self, x: Tensor) -> Tensor:
        """Bin id of every token in every dimension: (heads, N, r) → LongTensor (heads, N, r).

        Bin ids are in ``[0, bins)``; add ``d * bins`` to get a global bucket id.
        """
        if x.dim() != 3:
            raise ValueError(f"expected x of shape (heads, N, r), got {tuple(x.shape)}")
        per_bin = max(1, -(-x.shape[-2] // self.bins))  # ceil(N / β)
        return _ranks(x) // per_bin

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m)."""
        check_shapes(q, k)
        bq = self.assign(q)
        bk = self.assign(k)
        return apply_causal(_share_any(bq, bk), causal)


def _share_any(bq: Tensor, bk: Tensor) -> Tensor:
    """bool (heads, n, m): do bin ids bq (heads, n, r) and bk (heads, m, r) agree somewhere?

    For ids < 256 this runs in uint8: ``min_d (bq_d XOR bk_d)`` is 0 iff some dimension
    agrees, and the result is turned into 0/1 bytes in place and reinterpreted as bool, so a
    single (heads, n, m) buffer is allocated (large fresh allocations page-fault every call,
    and ``==`` on int64 is an order of magnitude slower on CPU).
    """
    top = max(int(bq.max()) if bq.numel() else 0, int(bk.max()) if bk.numel() else 0)
    r = bq.shape[-1]
    if top >= 256:
        mask = bq[:, :, None, 0] == bk[:, None, :, 0]
        for d in range(1, r):  # loop over the r dimensions, not tokens
            mask |= bq[:, :, None, d] == bk[:, None, :, d]
        return mask
    bq = bq.to(torch.uint8).transpose(1, 2).contiguous()  # (heads, r, n)
    bk = bk.to(torch.uint8).transpose(1, 2).contiguous()
    acc = bq[:, 0, :, None] ^ bk[:, 0, None, :]
    if r > 1:
        tmp = torch.empty_like(acc)
        for d in range(1, r):  # loop over the r dimensions, not tokens
            torch.minimum(
                acc, torch.bitwise_xor(bq[:, d, :, None], bk[:, d, None, :], out=tmp), out=acc
            )
    return acc.clamp_(max=1).bitwise_xor_(1).view(torch.bool)
