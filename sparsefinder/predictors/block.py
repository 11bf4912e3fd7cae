"""Block Sparsefinder (paper §6, variant v1): pick key *blocks* from pooled projections.

Queries and keys are cut into blocks of ``block`` consecutive tokens and each block is
represented by the mean of its tokens' projected vectors — which, projections being linear,
is the projection of the pooled block. Per head, every query block keeps the ``n_blocks``
key blocks whose pooled vectors are closest to its own (squared Euclidean distance, the
geometry the projections are trained for) plus the band of ``window_blocks`` blocks around
the diagonal. Cost: O((n/block)·(m/block)·r) per head, negligible next to attention.

:meth:`BlockSparsefinder.predict_blocks` gives the (heads, n/block, m/block) block graph that
:func:`sparsefinder.block_sparse.block_sparse_entmax` computes on; :meth:`predict` expands it
to the token mask every sweep scores (so recall, sparsity, block recall and exact fraction
are those of the pairs the block-sparse attention really computes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sparsefinder.masks import apply_causal
from sparsefinder.predictors.base import check_shapes
from sparsefinder.predictors.distance import pairwise_sq_dist


def pool_blocks(x: Tensor, block: int) -> Tensor:
    """Mean of every block of ``block`` consecutive rows: (heads, n, r) → (heads, ceil(n/b), r).

    The last block may be partial; it is the mean of its real rows.
    """
    heads, n, r = x.shape
    nb = -(-n // block)
    pad = nb * block - n
    x = x.float()
    if pad:
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))
    sums = x.view(heads, nb, block, r).sum(2)
    sizes = torch.full((nb, 1), float(block), device=x.device)
    sizes[-1] = block - pad
    return sums / sizes


@dataclass
class BlockSparsefinder:
    """Top-``n_blocks`` nearest key blocks per query block, ∪ a diagonal band of blocks."""

    block: int
    n_blocks: int
    window_blocks: int = 1

    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput

    def __post_init__(self) -> None:
        for name in ("block", "n_blocks", "window_blocks"):
            value = getattr(self, name)
            low = 1 if name == "block" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")

    def predict_blocks(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, ceil(n/b), ceil(m/b))."""
        check_shapes(q, k)
        n, m = q.shape[1], k.shape[1]
        qb, kb = pool_blocks(q, self.block), pool_blocks(k, self.block)
        nq, nk = qb.shape[1], kb.shape[1]
        dist = pairwise_sq_dist(qb, kb)
        rows = torch.arange(nq, device=q.device)[:, None]
        cols = torch.arange(nk, device=q.device)[None, :]
        # Key block J is in the future of every query of block I when its first key comes
        # after the block's last query (aligned at key i + m - n).
        last_query = torch.clamp((rows + 1) * self.block - 1, max=n - 1) + (m - n)
        future = cols * self.block > last_query
        if causal:
            dist = dist.masked_fill(future, float("inf"))
        graph = torch.zeros(dist.shape, dtype=torch.bool, device=q.device)
        top = min(self.n_blocks, nk)
        if top:
            nearest = dist.topk(top, dim=-1, largest=False).indices
            graph.scatter_(-1, nearest, True)
        diagonal = torch.div(last_query, self.block, rounding_mode="floor")
        if self.window_blocks:
            graph |= (cols - diagonal).abs() < self.window_blocks
        if causal:
            graph &= ~future
        return graph

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """The block graph expanded to token pairs: bool (heads, n, m)."""
        n, m = q.shape[1], k.shape[1]
        graph = self.predict_blocks(q, k, causal=causal)
        mask = graph.repeat_interleave(self.block, -2).repeat_interleave(self.block, -1)
        return apply_causal(mask[..., :n, :m].contiguous(), causal)
