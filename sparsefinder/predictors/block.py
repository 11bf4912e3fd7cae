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

On a local (sliding-window) layer, ``sliding_window=`` makes each query block choose its
``n_blocks`` among the key blocks some of its queries may attend to (causal or bidirectional
window, :func:`~sparsefinder.attention.masks.layer_allowed`), so no budget is spent on
blocks the window cuts afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sparsefinder.attention.block_sparse import expand_blocks
from sparsefinder.attention.masks import layer_allowed
from sparsefinder.predictors.base import check_ints, check_shapes
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
                block: int, *, reach: Tensor | None = None) -> Tensor:
    """Block graph from tile scores (heads, nq, nk), higher = closer: per query block the
    ``n_blocks`` best key blocks ∪ the band of ``window_blocks`` blocks around the diagonal,
    cut to ``reach`` (nq, nk) bool, the key blocks the query block may attend to (None: all;
    unreachable tiles must score ``-inf`` so the budget goes to reachable ones).
    ``last_query`` (nq, 1): each query block's last query position (query ``i`` aligned with
    key ``i + m − n``)."""
    nk = tiles.shape[-1]
    cols = torch.arange(nk, device=tiles.device)[None, :]
    graph = torch.zeros(tiles.shape, dtype=torch.bool, device=tiles.device)
    top = min(n_blocks, nk)
    if top:
        graph.scatter_(-1, tiles.topk(top, dim=-1).indices, True)
    if window_blocks:
        diagonal = torch.div(last_query, block, rounding_mode="floor")
        graph |= (cols - diagonal).abs() < window_blocks
    if reach is not None:
        graph &= reach
    return graph


def _last_query(n: int, m: int, block: int, device: torch.device) -> Tensor:
    """(ceil(n/b), 1): the last key each query block may see (its last query's position)."""
    rows = torch.arange(-(-n // block), device=device)[:, None]
    return torch.clamp((rows + 1) * block - 1, max=n - 1) + (m - n)


def block_reach(n: int, m: int, block: int, *, causal: bool, sliding_window: int | None = None,
                device: torch.device | str | None = None) -> Tensor | None:
    """Bool (ceil(n/b), m): the keys that at least one query of each query block may attend to
    (the union of its rows of :func:`~sparsefinder.attention.masks.layer_allowed`), or None
    when every key is allowed."""
    if not causal and not sliding_window:
        return None
    rows = torch.arange(-(-n // block), device=device)[:, None]
    first = rows * block + (m - n)
    last = _last_query(n, m, block, rows.device)
    keys = torch.arange(m, device=device)[None, :]
    window = int(sliding_window) if sliding_window else 0
    reach = keys <= (last if causal else last + window - 1)
    if window:
        reach &= keys > first - window
    return reach


def _tiles_of(reach: Tensor, block: int) -> Tensor:
    """(nq, m) key reach → (nq, ceil(m/b)): a key block is reachable if one of its keys is."""
    nq, m = reach.shape
    nk = -(-m // block)
    padded = torch.nn.functional.pad(reach, (0, nk * block - m), value=False)
    return padded.view(nq, nk, block).any(-1)


def _cut(mask: Tensor, causal: bool, sliding_window: int | None) -> Tensor:
    """The token mask cut to the layer's allowed pairs (a contiguous tensor)."""
    n, m = mask.shape[-2:]
    allowed = layer_allowed(n, m, causal=causal, sliding_window=sliding_window,
                            device=mask.device)
    return mask.contiguous() if allowed is None else mask & allowed


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
    honours_window: ClassVar[bool] = True  # see base.WindowAware

    def __post_init__(self) -> None:
        check_ints(self, {"block": 1, "n_blocks": 0, "n_keys": 0, "window_blocks": 0})

    def select(self, q: Tensor, k: Tensor, *, causal: bool = False,
               graph: Tensor | None = None,
               sliding_window: int | None = None) -> tuple[Tensor, Tensor | None]:
        """(block graph bool (heads, ceil(n/b), ceil(m/b)), extra keys int64 (heads,
        ceil(n/b), n_keys) or None) — the inputs of
        :func:`~sparsefinder.attention.block_sparse.block_sparse_entmax`.

        ``graph``: key blocks chosen elsewhere (e.g. by :class:`LearnedBlockSparsefinder`);
        then only the ``n_keys`` nearest single keys outside them are added here.
        Blocks and single keys are chosen among those the query block may attend to
        (past, local window: :func:`block_reach`)."""
        check_shapes(q, k)
        heads, n, _ = q.shape
        m = k.shape[1]
        b = self.block
        qb = pool_blocks(q, b)
        nq, nk = qb.shape[1], -(-m // b)
        near = -pairwise_sq_dist(qb, k.float())  # (heads, nq, m): higher = closer
        # Query i is aligned with key i + m - n; a block's last query sees keys up to there.
        last_query = _last_query(n, m, b, q.device)
        reach = block_reach(n, m, b, causal=causal, sliding_window=sliding_window,
                            device=q.device)
        if reach is not None:
            near = near.masked_fill(~reach, -torch.inf)
        if graph is None:
            padded = torch.nn.functional.pad(near, (0, nk * b - m), value=-torch.inf)
            tiles = padded.view(heads, nq, nk, b).amax(-1)
            graph = keep_blocks(tiles, self.n_blocks, self.window_blocks, last_query, b,
                                reach=None if reach is None else _tiles_of(reach, b))
        elif tuple(graph.shape) != (heads, nq, nk):
            raise ValueError(f"graph must be bool (heads, ceil(n/b), ceil(m/b)) = "
                             f"{(heads, nq, nk)}, got {tuple(graph.shape)}")
        extra = None
        if self.n_keys:
            covered = graph.repeat_interleave(b, -1)[..., :m]
            near = near.masked_fill(covered, -torch.inf)
            extra = near.topk(min(self.n_keys, m), dim=-1).indices
        return graph, extra

    def predict_blocks(self, q: Tensor, k: Tensor, *, causal: bool = False,
                       sliding_window: int | None = None) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, ceil(n/b), ceil(m/b))."""
        return self.select(q, k, causal=causal, sliding_window=sliding_window)[0]

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False,
                sliding_window: int | None = None) -> Tensor:
        """The selection expanded to token pairs and cut to the layer's allowed pairs:
        bool (heads, n, m)."""
        graph, extra = self.select(q, k, causal=causal, sliding_window=sliding_window)
        mask = expand_blocks(graph, self.block, q.shape[1], k.shape[1], extra)
        return _cut(mask, causal, sliding_window)


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
    honours_window: ClassVar[bool] = True  # see base.WindowAware

    def __post_init__(self) -> None:
        if not isinstance(self.weight, Tensor) or self.weight.dim() != 3:
            raise ValueError("weight must be one layer's block projections (heads, r, d), "
                             f"got {getattr(self.weight, 'shape', type(self.weight).__name__)}")
        for name in ("block", "n_blocks", "window_blocks"):
            value = getattr(self, name)
            low = 1 if name == "block" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")

    def select(self, q: Tensor, k: Tensor, *, causal: bool = False,
               sliding_window: int | None = None) -> tuple[Tensor, None]:
        """(block graph bool (heads, ceil(n/b), ceil(m/b)), None): the same contract as
        :meth:`BlockSparsefinder.select` (no single extra keys), blocks chosen among the
        reachable ones."""
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
        reach = block_reach(n, m, b, causal=causal, sliding_window=sliding_window,
                            device=q.device)
        tiles_reach = None if reach is None else _tiles_of(reach, b)
        if tiles_reach is not None:
            tiles = tiles.masked_fill(~tiles_reach, -torch.inf)
        graph = keep_blocks(tiles, self.n_blocks, self.window_blocks, last_query, b,
                            reach=tiles_reach)
        dense = self.weight.flatten(1).abs().sum(-1).to(q.device) == 0
        if bool(dense.any()):  # attended every tile of every training text: keep them all
            graph[dense] = True if tiles_reach is None else tiles_reach
        return graph, None

    def predict_blocks(self, q: Tensor, k: Tensor, *, causal: bool = False,
                       sliding_window: int | None = None) -> Tensor:
        """q: (heads, n, d), k: (heads, m, d) → bool (heads, ceil(n/b), ceil(m/b))."""
        return self.select(q, k, causal=causal, sliding_window=sliding_window)[0]

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False,
                sliding_window: int | None = None) -> Tensor:
        """The block graph expanded to token pairs, cut to the layer's allowed pairs:
        bool (heads, n, m)."""
        graph = self.predict_blocks(q, k, causal=causal, sliding_window=sliding_window)
        mask = expand_blocks(graph, self.block, q.shape[1], k.shape[1], None)
        return _cut(mask, causal, sliding_window)
