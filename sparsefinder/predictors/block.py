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
    """Nearest key blocks (and single keys) per query block, ∪ a diagonal band of blocks.

    A key block's distance to a query block is that of its *closest* key to the pooled query
    block (a block that holds one strongly attended key — a separator, a period — is kept
    for it, which a pooled key block would average away). ``n_keys`` > 0 adds, per query
    block, the ``n_keys`` nearest single keys outside the chosen blocks: attention to such
    scattered keys is what leaves rows inexact at block granularity (measured on MiniLM q/k
    of concatenated windows: 60-85% of 64-token tiles hold a gold edge at n = 2048).
    """

    block: int
    n_blocks: int
    n_keys: int = 0
    window_blocks: int = 1

    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput

    def __post_init__(self) -> None:
        for name in ("block", "n_blocks", "n_keys", "window_blocks"):
            value = getattr(self, name)
            low = 1 if name == "block" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")

    def select(self, q: Tensor, k: Tensor, *, causal: bool = False
               ) -> tuple[Tensor, Tensor | None]:
        """(block graph bool (heads, ceil(n/b), ceil(m/b)), extra keys int64 (heads,
        ceil(n/b), n_keys) or None) — the inputs of
        :func:`~sparsefinder.block_sparse.block_sparse_entmax`."""
        check_shapes(q, k)
        heads, n, _ = q.shape
        m = k.shape[1]
        b = self.block
        qb = pool_blocks(q, b)
        nq, nk = qb.shape[1], -(-m // b)
        near = -pairwise_sq_dist(qb, k.float())  # (heads, nq, m): higher = closer
        rows = torch.arange(nq, device=q.device)[:, None]
        # Query i is aligned with key i + m - n; a block's last query sees keys up to there.
        last_query = torch.clamp((rows + 1) * b - 1, max=n - 1) + (m - n)
        if causal:
            near = near.masked_fill(torch.arange(m, device=q.device) > last_query, -torch.inf)
        padded = torch.nn.functional.pad(near, (0, nk * b - m), value=-torch.inf)
        tiles = padded.view(heads, nq, nk, b).amax(-1)
        cols = torch.arange(nk, device=q.device)[None, :]
        future = cols * b > last_query
        graph = torch.zeros(tiles.shape, dtype=torch.bool, device=q.device)
        top = min(self.n_blocks, nk)
        if top:
            graph.scatter_(-1, tiles.topk(top, dim=-1).indices, True)
        if self.window_blocks:
            diagonal = torch.div(last_query, b, rounding_mode="floor")
            graph |= (cols - diagonal).abs() < self.window_blocks
        if causal:
            graph &= ~future
        extra = None
        if self.n_keys:
            covered = graph.repeat_interleave(b, -1)[..., :m]
            near = near.masked_fill(covered, -torch.inf)
            extra = near.topk(min(self.n_keys, m), dim=-1).indices
        return graph, extra

    def predict_blocks(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, ceil(n/b), ceil(m/b))."""
        return self.select(q, k, causal=causal)[0]

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """The selection expanded to token pairs: bool (heads, n, m)."""
        from sparsefinder.block_sparse import expand_blocks

        graph, extra = self.select(q, k, causal=causal)
        mask = expand_blocks(graph, self.block, q.shape[1], k.shape[1], extra)
        return apply_causal(mask.contiguous(), causal)
