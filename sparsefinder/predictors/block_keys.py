"""Single keys per query block, scored by the model's own q·k on pooled query sub-blocks.

At long n the gold entmax graph is not block-structured: queries attend to separators and
punctuation all over the sequence (on MiniLM q/k of concatenated windows 60-85 % of 64-token
tiles hold a gold edge), so key *blocks* waste the budget on their unattended neighbours.
Here every query block keeps its diagonal band of key blocks and the ``n_keys`` single keys
with the highest score ``max_s q̄_s · k_j`` over its sub-blocks ``s`` of ``sub_block``
consecutive queries (q̄_s their mean). Scoring with the model's own vectors is affordable
because the queries are pooled: ``n/sub_block × m × d`` multiply-adds per head, 1/sub_block of
QKᵀ; the max over sub-blocks keeps a key that only a few queries of the block attend to,
which one pooled query per block averages away. On TRAIN-split MiniLM q/k at n = 4096 this
lifted edge recall from 0.69 (key blocks + single keys by rank-4 projections, same budget)
to 0.95 (``tools/choose_block_keys.py``).

Mostly the pooled ranking, not the budget, is what misses gold keys: on TRAIN q/k at n = 4096
(layers 1-4) the gold keys a query block needs outside its band number 104-132 on average,
far under the 448 kept, yet 5 % of the gold edges fall outside. With ``candidates``, a second
stage re-ranks the pooled stage's best ``candidates`` keys by the block's own queries
(:func:`refine_keys`) and keeps ``n_keys`` of them: recall close to that of ``candidates``
pooled keys, at the width of ``n_keys`` (0.950 → 0.992 edge recall with 2048 candidates,
``tools/choose_candidates.py``).

:meth:`BlockKeySparsefinder.select` returns the (block graph, extra keys) pair that
:func:`~sparsefinder.attention.block_sparse.block_sparse_entmax` computes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sparsefinder.attention.block_sparse import chunk_scores, expand_blocks
from sparsefinder.attention.masks import hidden_offsets
from sparsefinder.predictors.base import check_ints, check_shapes
from sparsefinder.predictors.block import _cut, _last_query, _tiles_of, block_reach, keep_blocks

#: Scores per chunk of query blocks while scoring sub-blocks: 4 MiB of float32, so a chunk's
#: scores stay in cache until reduced (measured at n = 4096, one thread: 0.047 s for the
#: whole layer against 0.146 s with 64 MiB chunks).
_CHUNK_SCORES = 1 << 20
#: A candidate within this gap of a row's maximum (score units) counts towards the crowd
#: (a key needs a gap under 2 to enter a 1.5-entmax support, ``τ ≥ −1``); chosen on TRAIN.
CROWD_GAP = 0.5
#: A block is crowded when more than ``n_keys`` times this share of its candidates lie within
#: ``CROWD_GAP``; chosen on TRAIN (``tools/choose_candidates.py --wide``).
CROWD_SHARE = 1 / 3


def sub_block_scores(q: Tensor, k: Tensor, block: int, sub_block: int) -> Tensor:
    """float32 (heads, ceil(n/block), m): per query block, ``max`` over its sub-blocks of
    (mean query of the sub-block) · key. A partial last sub-block is the mean of its real
    rows; sub-blocks past the end of the sequence do not count. The means are taken in
    float32; the products are in the inputs' precision, so half q/k (a GPU's fp16 or bf16
    attention) take the half matmul and write half the scores, as the second stage does."""
    heads, n, d = q.shape
    m = k.shape[1]
    per = block // sub_block
    nb = -(-n // block)
    ns = -(-n // sub_block)
    pad = ns * sub_block - n
    x = torch.nn.functional.pad(q.float(), (0, 0, 0, pad)) if pad else q.float()
    sizes = torch.full((ns, 1), float(sub_block), device=q.device)
    sizes[-1] = sub_block - pad
    pooled = (x.view(heads, ns, sub_block, d).sum(2) / sizes).to(k.dtype)  # (heads, ns, d)
    if nb * per > ns:  # the last block's missing sub-blocks repeat its last real one (same max)
        pooled = torch.cat([pooled, pooled[:, -1:].expand(heads, nb * per - ns, d)], 1)
    kt = k.transpose(1, 2)
    out = q.new_empty((heads, nb, m), dtype=torch.float32)
    # on a GPU (block_sparse.GPU_CHUNK_SCORES) whole heads at once where they fit: a layer at
    # n = 32 768 takes 12 launches instead of 1 536
    budget = chunk_scores(q.device, _CHUNK_SCORES)
    rows = max(1, budget // (per * m))  # query blocks per chunk
    group = max(1, min(heads, budget // (nb * per * m))) if rows >= nb else 1  # whole heads
    for h0 in range(0, heads, group):  # chunks of (heads, query blocks): not a per-row loop
        h1 = min(heads, h0 + group)
        for start in range(0, nb, rows):
            stop = min(nb, start + rows)
            scores = torch.bmm(pooled[h0:h1, start * per : stop * per], kt[h0:h1])
            if h1 - h0 == 1 and scores.dtype == out.dtype:
                torch.amax(scores.view(stop - start, per, m), 1, out=out[h0, start:stop])
            else:
                out[h0:h1, start:stop] = scores.view(h1 - h0, stop - start, per, m).amax(2)
    return out


def refine_keys(q: Tensor, k: Tensor, candidates: Tensor, usable: Tensor, block: int,
                n_keys: int, *, causal: bool = False, sliding_window: int | None = None,
                wide_keys: int = 0, scaling: float | None = None) -> Tensor:
    """int64 (heads, ceil(n/b), n_keys, or more with ``wide_keys``): per query block, the
    ``n_keys`` of its ``candidates`` (heads, ceil(n/b), C; ``usable`` bool like it, False for
    fillers) closest to entering one of its rows' support, scored by the block's own queries.

    With ``wide_keys`` > ``n_keys``, a *crowded* block keeps ``wide_keys`` of them instead,
    and the result is ``wide_keys`` wide wherever one block is crowded (the other blocks'
    extra columns repeat their first key, which every block-sparse path counts once).
    Crowded: more than ``n_keys · CROWD_SHARE`` candidates lie within ``CROWD_GAP`` of a
    row's maximum in score units (``scaling`` times q·k, default ``d^-1/2``). Why: on TRAIN
    q/k that count follows the gold keys a block needs (correlation 0.84-0.98 per layer at
    n = 4096 and 8192, about two gold keys per crowded candidate), and the blocks that need
    more than ``n_keys`` are few (up to 8 % of a layer's) but hold most of the missed edges
    of the layers that have them (``tools/choose_candidates.py --wide``).

    Why this ranking: in score units ``x = scaling·q·k`` a key is in row ``i``'s 1.5-entmax
    support only if ``x_ij > x*_i ≥ max_j x_ij − 2`` (``τ ≥ −1``), so what matters is a
    key's gap to the row's maximum, not its raw score. Each candidate gets
    ``max_i (q_i·k_j − M_i)`` over the block's rows ``i`` that may see it, ``M_i`` the row's
    maximum over the candidates and its own diagonal block (scaling > 0 leaves the order
    as it is). Cost: ``block × C × d`` multiply-adds per query block, ``C/m`` of ``QKᵀ``, in
    chunks of query blocks (:func:`~sparsefinder.attention.block_sparse.chunk_scores`)."""
    heads, n, d = q.shape
    m = k.shape[1]
    nq, count = candidates.shape[1:]
    pad = nq * block - n
    queries = (torch.nn.functional.pad(q, (0, 0, 0, pad)) if pad else q).reshape(-1, block, d)
    keys = k.reshape(-1, d)
    flat, ok = candidates.reshape(-1, count), usable.reshape(-1, count)
    rows = heads * nq
    head = torch.div(torch.arange(rows, device=q.device), nq, rounding_mode="floor")
    query_pos = (torch.arange(rows, device=q.device) % nq).unsqueeze(1) * block + torch.arange(
        block, device=q.device)  # (rows, block)
    aligned = query_pos + (m - n)  # query i sees key i + m − n as its own position
    own = aligned.clamp(0, m - 1)  # the diagonal block's keys (clamped past the ends)
    width = max(n_keys, min(wide_keys, count))
    near = CROWD_GAP / (d**-0.5 if scaling is None else scaling)  # in q·k units
    out = torch.empty(rows, width, dtype=torch.int64, device=q.device)
    crowded = False
    size = max(1, chunk_scores(q.device, _CHUNK_SCORES) // (block * (count + block)))
    for start in range(0, rows, size):
        part = slice(start, min(rows, start + size))
        base = (head[part] * m).unsqueeze(1)
        positions = torch.cat([flat[part], own[part]], 1)  # (c, C + block)
        gathered = keys.index_select(0, (base + positions).view(-1)).view(
            -1, count + block, d)
        products = torch.bmm(queries[part].to(gathered.dtype), gathered.transpose(1, 2))
        products = products.float()  # fillers and clamped diagonal keys are real keys: they
        if causal or sliding_window:  # count for the peak where the row may see them
            ahead = positions.unsqueeze(1) - aligned[part].unsqueeze(-1)  # (c, block, K)
            products.masked_fill_(hidden_offsets(ahead, causal=causal,
                                                 sliding_window=sliding_window), -torch.inf)
        if pad:  # the last query block's missing rows
            products.masked_fill_((query_pos[part] >= n).unsqueeze(-1), -torch.inf)
        peak = products.amax(-1, keepdim=True)
        gap = products[..., :count].sub_(peak.masked_fill_(~torch.isfinite(peak), torch.inf))
        best = gap.amax(1).masked_fill_(~ok[part], -torch.inf)  # (c, C)
        kept = flat[part].gather(1, best.topk(n_keys, -1, sorted=False).indices)
        if width == n_keys:
            out[part] = kept
            continue
        out[part, :n_keys], out[part, n_keys:] = kept, kept[:, :1]  # repeats count once
        wide = ((best > -near).sum(-1) > n_keys * CROWD_SHARE).nonzero()[:, 0]
        if wide.numel():  # the few crowded blocks: a top-``width`` of their own
            crowded = True
            out[start + wide] = flat[part][wide].gather(
                1, best[wide].topk(width, -1, sorted=False).indices)
    out = out.view(heads, nq, width)
    return out if crowded else out[..., :n_keys].contiguous()


@dataclass
class BlockKeySparsefinder:
    """Per query block: the diagonal band of ``window_blocks`` key blocks ∪ the ``n_keys``
    single keys outside it that score highest against the block's pooled sub-blocks of
    ``sub_block`` queries. Reads the model's own q/k (heads, n, d).

    ``candidates`` > 0 adds a second stage: the pooled scores pick that many keys, and the
    block's own queries keep the ``n_keys`` of them nearest to a row's support
    (:func:`refine_keys`). The selection stays ``n_keys`` wide (what the Triton kernel holds
    on chip) while its recall approaches that of ``candidates`` pooled keys. ``wide_keys``
    (> ``n_keys``, at most ``candidates``; 0 = off) lets the crowded blocks keep that many:
    the block-sparse paths give each row its own width, so only those rows pay for it."""

    block: int
    n_keys: int
    sub_block: int = 8
    window_blocks: int = 1
    candidates: int = 0
    wide_keys: int = 0

    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput
    honours_window: ClassVar[bool] = True  # see base.WindowAware

    def __post_init__(self) -> None:
        check_ints(self, {"block": 1, "n_keys": 0, "sub_block": 1, "window_blocks": 1,
                          "candidates": 0, "wide_keys": 0})
        if self.wide_keys and not self.n_keys < self.wide_keys <= self.candidates:
            raise ValueError(f"wide_keys ({self.wide_keys}) is the width of a crowded block, "
                             f"chosen among the candidates: use 0 (off) or a value in "
                             f"(n_keys={self.n_keys}, candidates={self.candidates}]")
        if 0 < self.candidates < self.n_keys:
            raise ValueError(f"candidates ({self.candidates}) are the keys the second stage "
                             f"keeps n_keys={self.n_keys} of: use 0 (one stage) or at least "
                             f"{self.n_keys}")
        if self.block % self.sub_block:
            raise ValueError(f"sub_block ({self.sub_block}) must divide block ({self.block}), "
                             f"e.g. sub_block={self.block // 4 or 1}")

    def select(self, q: Tensor, k: Tensor, *, causal: bool = False,
               sliding_window: int | None = None, scaling: float | None = None,
               ) -> tuple[Tensor, Tensor | None]:
        """(block graph bool (heads, ceil(n/b), ceil(m/b)): the diagonal band; extra keys
        int64 (heads, ceil(n/b), n_keys or wide_keys) or None), chosen among the keys the
        query block may attend to (:func:`~sparsefinder.predictors.block.block_reach`);
        ``scaling`` (default ``d^-1/2``) only places the crowd of ``wide_keys``."""
        check_shapes(q, k)
        heads, n, _ = q.shape
        m, b = k.shape[1], self.block
        nq, nk = -(-n // b), -(-m // b)
        reach = block_reach(n, m, b, causal=causal, sliding_window=sliding_window,
                            device=q.device)
        band = keep_blocks(torch.zeros((1, nq, nk), device=q.device), 0, self.window_blocks,
                           _last_query(n, m, b, q.device), b,
                           reach=None if reach is None else _tiles_of(reach, b))[0]
        graph = band.expand(heads, nq, nk).contiguous()
        if not self.n_keys:
            return graph, None
        near = sub_block_scores(q, k, b, self.sub_block)
        taken = band.repeat_interleave(b, -1)[:, :m]  # (nq, m): keys of the band
        if reach is not None:
            taken = taken | ~reach
        near.masked_fill_(taken, -torch.inf)
        keep = min(self.n_keys, m)
        if min(self.candidates, m) <= keep:
            return graph, near.topk(keep, dim=-1, sorted=False).indices
        scores, pool = near.topk(min(self.candidates, m), dim=-1, sorted=False)
        return graph, refine_keys(q, k, pool, scores > -torch.inf, b, keep, causal=causal,
                                  sliding_window=sliding_window, scaling=scaling,
                                  wide_keys=self.wide_keys)

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False,
                sliding_window: int | None = None) -> Tensor:
        """The selection expanded to token pairs, cut to the layer's allowed pairs:
        bool (heads, n, m)."""
        graph, extra = self.select(q, k, causal=causal, sliding_window=sliding_window)
        mask = expand_blocks(graph, self.block, q.shape[1], k.shape[1], extra)
        return _cut(mask, causal, sliding_window)
