"""Block Sparsefinder (paper §6, variant v1): pick key *blocks* from pooled projections.

Queries and keys are cut into blocks of ``block`` consecutive tokens and each block is
represented by the mean of its tokens' projected vectors — which, projections being linear,
is the projection of the pooled block. Per head, every query block keeps the ``n_blocks``
key blocks whose pooled vectors are closest to its own (squared Euclidean distance, the
geometry the projections are trained for) plus the band of ``window_blocks`` blocks around
the diagonal. Cost: O((n/block)·(m/block)·r) per head, negligible next to attention.

:meth:`BlockSparsefinder.predict_blocks` gives the (heads, n/block, m/block) block graph that
:func:`sparsefinder.attention.block_sparse.block_sparse_entmax` computes on; :meth:`predict`
expands it
to the token mask every sweep scores (so recall, sparsity, block recall and exact fraction
are those of the pairs the block-sparse attention really computes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sparsefinder.attention.block_sparse import expand_blocks
from sparsefinder.attention.masks import apply_causal
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


def keep_blocks(tiles: Tensor, n_blocks: int, window_blocks: int, last_query: Tensor,
                block: int, *, causal: bool) -> Tensor:
    """Block graph from tile scores (heads, nq, nk), higher = closer: per query block the
    ``n_blocks`` best key blocks ∪ the band of ``window_blocks`` blocks around the diagonal,
    future blocks dropped when ``causal``. ``last_query`` (nq, 1): each query block's last
    key position it may see (query ``i`` aligned with key ``i + m − n``)."""
    nk = tiles.shape[-1]
    cols = torch.arange(nk, device=tiles.device)[None, :]
    graph = torch.zeros(tiles.shape, dtype=torch.bool, device=tiles.device)
    top = min(n_blocks, nk)
    if top:
        graph.scatter_(-1, tiles.topk(top, dim=-1).indices, True)
    if window_blocks:
        diagonal = torch.div(last_query, block, rounding_mode="floor")
        graph |= (cols - diagonal).abs() < window_blocks
    if causal:
        graph &= ~(cols * block > last_query)
    return graph


def _last_query(n: int, m: int, block: int, device: torch.device) -> Tensor:
    """(ceil(n/b), 1): the last key each query block may see (its last query's position)."""
    rows = torch.arange(-(-n // block), device=device)[:, None]
    return torch.clamp((rows + 1) * block - 1, max=n - 1) + (m - n)


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

    def select(self, q: Tensor, k: Tensor, *, causal: bool = False,
               graph: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """(block graph bool (heads, ceil(n/b), ceil(m/b)), extra keys int64 (heads,
        ceil(n/b), n_keys) or None) — the inputs of
        :func:`~sparsefinder.attention.block_sparse.block_sparse_entmax`.

        ``graph``: key blocks chosen elsewhere (e.g. by :class:`LearnedBlockSparsefinder`);
        then only the ``n_keys`` nearest single keys outside them are added here."""
        check_shapes(q, k)
        heads, n, _ = q.shape
        m = k.shape[1]
        b = self.block
        qb = pool_blocks(q, b)
        nq, nk = qb.shape[1], -(-m // b)
        near = -pairwise_sq_dist(qb, k.float())  # (heads, nq, m): higher = closer
        # Query i is aligned with key i + m - n; a block's last query sees keys up to there.
        last_query = _last_query(n, m, b, q.device)
        if causal:
            near = near.masked_fill(torch.arange(m, device=q.device) > last_query, -torch.inf)
        if graph is None:
            padded = torch.nn.functional.pad(near, (0, nk * b - m), value=-torch.inf)
            tiles = padded.view(heads, nq, nk, b).amax(-1)
            graph = keep_blocks(tiles, self.n_blocks, self.window_blocks, last_query, b,
                                causal=causal)
        elif tuple(graph.shape) != (heads, nq, nk):
            raise ValueError(f"graph must be bool (heads, ceil(n/b), ceil(m/b)) = "
                             f"{(heads, nq, nk)}, got {tuple(graph.shape)}")
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
        graph, extra = self.select(q, k, causal=causal)
        mask = expand_blocks(graph, self.block, q.shape[1], k.shape[1], extra)
        return apply_causal(mask.contiguous(), causal)


@dataclass
class LearnedBlockSparsefinder:
    """Paper §6, v1, with projections learned on pooled blocks: score every (query block,
    key block) pair, keep the ``n_blocks`` best per query block ∪ the diagonal band.

    ``weight`` (heads, r, d) is one layer of block projections
    (:func:`sparsefinder.projections.blocks.train_block_projections`, trained on blocks of
    ``block`` tokens). It reads the model's own q/k (heads, n, d): pooling is linear, so
    ``W·mean(block) = mean(W·token)``; a tile's score is ``−‖W q̄_I − W k̄_J‖²``, the
    geometry Eq. 7 trains. Cost O((n/b)·(m/b)·r + (n + m)·d·r / b) per head. A head whose
    map is zero (dense at block level in training: ``dense_heads="zero"``) keeps every block.
    """

    weight: Tensor
    block: int
    n_blocks: int
    window_blocks: int = 1

    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput

    def __post_init__(self) -> None:
        if not isinstance(self.weight, Tensor) or self.weight.dim() != 3:
            raise ValueError("weight must be one layer's block projections (heads, r, d), "
                             f"got {getattr(self.weight, 'shape', type(self.weight).__name__)}")
        for name in ("block", "n_blocks", "window_blocks"):
            value = getattr(self, name)
            low = 1 if name == "block" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")

    def select(self, q: Tensor, k: Tensor, *, causal: bool = False) -> tuple[Tensor, None]:
        """(block graph bool (heads, ceil(n/b), ceil(m/b)), None): the same contract as
        :meth:`BlockSparsefinder.select` (no single extra keys)."""
        check_shapes(q, k)
        heads, _, d = self.weight.shape
        if q.shape[0] != heads or q.shape[2] != d:
            raise ValueError(
                f"block projections expect q/k of shape (heads={heads}, n, d={d}): the "
                f"model's own vectors, got {tuple(q.shape)}")
        n, m, b = q.shape[1], k.shape[1], self.block
        wt = self.weight.to(q.device).transpose(-1, -2)
        tiles = -pairwise_sq_dist(torch.bmm(pool_blocks(q, b), wt),
                                  torch.bmm(pool_blocks(k, b), wt))  # higher = closer
        last_query = _last_query(n, m, b, q.device)
        future = torch.arange(tiles.shape[-1], device=q.device) * b > last_query
        if causal:
            tiles = tiles.masked_fill(future, -torch.inf)
        graph = keep_blocks(tiles, self.n_blocks, self.window_blocks, last_query, b,
                            causal=causal)
        dense = self.weight.flatten(1).abs().sum(-1).to(q.device) == 0
        if bool(dense.any()):  # attended every tile of every training text: keep them all
            graph[dense] = ~future if causal else True
        return graph, None

    def predict_blocks(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, d), k: (heads, m, d) → bool (heads, ceil(n/b), ceil(m/b))."""
        return self.select(q, k, causal=causal)[0]

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """The block graph expanded to token pairs: bool (heads, n, m)."""
        mask = expand_blocks(self.predict_blocks(q, k, causal=causal), self.block,
                             q.shape[1], k.shape[1], None)
        return apply_causal(mask.contiguous(), causal)
