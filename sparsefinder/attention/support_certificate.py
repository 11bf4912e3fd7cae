"""Exact block-sparse α-entmax: a check per row, and a dense fallback where it fails.

Block Sparsefinder computes α-entmax on the selected keys ``S`` of each row. By
sparse-consistency that equals full α-entmax iff no key outside ``S`` would enter the
support: with the row's threshold ``τ`` found on ``S`` (in score units ``x* = τ/(α−1)``),
every key ``j ∉ S`` must have score ``x_j ≤ x*``. (Why that suffices: adding keys only raises
τ, so a key at or below the restricted threshold stays out of the full support, and the
selected keys already sum to 1 at ``τ``.)

**The exact check** computes, in one pass over each row's keys, the highest score among the
keys it may see but did not select (:func:`unselected_max`) and compares it with ``x*``: no
sort, no solver, no ``probs @ values``, and no (n, n) matrix (rows go in chunks by a memory
budget; with ``engine="triton"``, one kernel that keeps a running maximum per row:
:mod:`~sparsefinder.attention.triton_support_check`). A row passes iff its
selection holds its whole support; the others, and only they, are recomputed on their full row.
So every row's output is exact, the certificate says which rows needed the fallback, and a row
whose selection missed a key of its support always does.

**The pooled bound** (``bound=True``) can spare the check's pass where keys cluster: over a key
block ``B`` with coordinate-wise maximum ``k⁺`` and minimum ``k⁻``,

    q·k = Σ_d q_d k_d ≤ Σ_d max(q_d k⁺_d, q_d k⁻_d) = q⁺·k⁺ + q⁻·k⁻

(``q⁺ = max(q, 0)``, ``q⁻ = min(q, 0)``)

for every key of the block (Quest's page bound), and ``q·k ≤ q·c + ‖q‖·r`` with ``c`` the
block's mean key and ``r`` its largest distance to it (a ball); the smaller of the two holds. A
few ``(n, d) @ (d, nb)`` products bound every (row, block) pair. A row is vouched for when every
block it did not select (and may see) is bounded below ``x*`` by a rounding margin; only the
other rows get the exact check. The bound is conservative: a block holding a single
``extra_keys`` key of the row, or the row's own partially visible diagonal block, is bounded
whole. On the default model's real q/k it vouches for almost no row (the keys of a block do
not cluster: ``docs/results/long-inputs.md``), hence off by default.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from sparsefinder.attention.block_sparse import (
    block_sparse_rows,
    check_extra_keys,
    chunk_scores,
    compact_single_keys,
    num_blocks,
)
from sparsefinder.attention.entmax_ops import entmax_normalize
from sparsefinder.attention.masks import allowed_key_range

#: Relative rounding margin of a certificate, in units of the dtype's epsilon times the
#: magnitude of the scores compared (bound and threshold are each a sum of d products).
MARGIN_EPS = 64.0
#: Working memory of the dense fallback per score: the fp32 score, the solver's temporaries
#: and the mask (as gold extraction budgets it).
BYTES_PER_SCORE = 32
#: Default memory budget of one chunk of fallback rows (MiB).
FALLBACK_MIB = 256.0
#: On a CPU a chunk holds at most this many scores (8 MiB of fp32), whatever the budget: the
#: chunk's buffers then stay cache-sized and the allocator reuses them (the check at n = 4096,
#: 12 heads: 0.24 s in chunks of 8 MiB against 0.49 s in chunks of 32 MiB). On a GPU the cap
#: is :data:`~sparsefinder.attention.block_sparse.GPU_CHUNK_SCORES`.
CPU_CHUNK_SCORES = 1 << 21


@dataclass(frozen=True)
class SupportCertificate:
    """What the check found: ``certified`` bool (heads, n), rows exact on their own
    selection; the others were recomputed densely (``fallback_rows`` of ``rows``).
    ``by_bound``: the rows the pooled bound vouched for without the exact pass (all False
    unless ``bound=True``)."""

    certified: Tensor
    by_bound: Tensor | None = None

    @property
    def rows(self) -> int:
        return int(self.certified.numel())

    @property
    def fallback_rows(self) -> int:
        return int((~self.certified).sum())

    @property
    def certified_fraction(self) -> float:
        return 1.0 - self.fallback_rows / max(self.rows, 1)

    @property
    def bound_fraction(self) -> float:
        """Share of the rows the pooled bound vouched for (0 without the bound)."""
        if self.by_bound is None:
            return 0.0
        return int(self.by_bound.sum()) / max(self.rows, 1)


def block_score_bounds(query: Tensor, key: Tensor, block: int, scaling: float) -> Tensor:
    """float (heads, n, nb): an upper bound on ``scaling · q_i·k_j`` over every key ``j`` of
    each key block (the module docstring's bound; ``scaling`` > 0)."""
    if scaling <= 0:
        raise ValueError(f"the score bound needs a positive scaling, got {scaling}")
    heads, m, d = key.shape
    nb = num_blocks(m, block)
    pad = nb * block - m
    padded = torch.nn.functional.pad(key, (0, 0, 0, pad)).view(heads, nb, block, d)
    real = (torch.arange(nb * block, device=key.device) < m).view(1, nb, block, 1)
    high = padded.masked_fill(~real, -torch.inf).amax(2)  # (heads, nb, d)
    low = padded.masked_fill(~real, torch.inf).amin(2)
    box = (torch.bmm(query.clamp(min=0), high.transpose(1, 2))
           + torch.bmm(query.clamp(max=0), low.transpose(1, 2)))
    # the ball around the block's mean c holding its keys: q·k ≤ q·c + ‖q‖·max‖k − c‖
    count = real.sum(2).clamp(min=1)
    centre = (padded * real).sum(2) / count  # (heads, nb, d)
    radius = ((padded - centre.unsqueeze(2)).norm(dim=-1) * real[..., 0]).amax(2)
    ball = (torch.bmm(query, centre.transpose(1, 2))
            + query.norm(dim=-1, keepdim=True) * radius.unsqueeze(1))
    return scaling * torch.minimum(box, ball)


def _unselected_reachable(graph: Tensor, n: int, block: int, causal: bool,
                          sliding_window: int | None, piece: int) -> Tensor:
    """bool (heads, n, pieces): pieces of ``piece`` keys (``block`` a multiple of it) of the
    key blocks a row did not select that hold a key it may see."""
    split = block // piece
    rows = torch.arange(n, device=graph.device).unsqueeze(1)
    first = torch.arange(graph.shape[-1] * split, device=graph.device) * piece
    last = first + piece - 1
    reach = torch.ones(n, len(first), dtype=torch.bool, device=graph.device)
    if causal:
        reach &= first <= rows
    if sliding_window:
        reach &= last > rows - sliding_window
        if not causal:
            reach &= first < rows + sliding_window
    selected = graph.repeat_interleave(block, 1)[:, :n].repeat_interleave(split, -1)
    return (reach & ~selected)[..., :num_blocks(n, piece)]


def certify_rows(query: Tensor, key: Tensor, graph: Tensor, thresholds: Tensor, block: int,
                 scaling: float, *, causal: bool = False, sliding_window: int | None = None,
                 piece: int | None = None) -> Tensor:
    """bool (heads, n): the pooled bound's verdict — rows whose every unselected, visible key
    block is bounded below the row's threshold ``x*`` (``thresholds``, from
    :func:`block_sparse_rows` or the kernel's
    :func:`~sparsefinder.attention.triton_block_sparse.triton_block_sparse_rows`) by the margin.
    ``piece``: keys per bound (a divisor of ``block``; default the block itself): smaller
    pieces bound tighter and cost ``~2·d/piece`` multiply-adds per pair."""
    piece = block if piece is None else piece
    if piece < 1 or block % piece:
        raise ValueError(f"piece must divide block={block}, got {piece}")
    bounds = block_score_bounds(query, key, piece, scaling).double()
    outside = _unselected_reachable(graph, query.shape[1], block, causal, sliding_window,
                                    piece)
    worst = bounds.masked_fill(~outside, -torch.inf).amax(-1)  # (heads, n)
    scale = bounds.abs().amax(-1).clamp(min=1.0)
    margin = MARGIN_EPS * torch.finfo(query.dtype).eps * scale
    return torch.isfinite(thresholds) & (worst < thresholds - margin)


def exact_block_sparse_entmax(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    block_graph: Tensor,
    block: int,
    *,
    scaling: float | None = None,
    alpha: float = 1.5,
    causal: bool = False,
    extra_keys: Tensor | None = None,
    sliding_window: int | None = None,
    bound: bool = False,
    piece: int | None = None,
    engine: str = "torch",
    fallback_mib: float = FALLBACK_MIB,
) -> tuple[Tensor, SupportCertificate]:
    """:func:`~sparsefinder.attention.block_sparse.block_sparse_entmax`, exact on every row:
    each row's unselected keys are checked against its threshold (the module docstring), and
    the rows whose selection missed part of their support are recomputed on their full row.
    Returns the output (heads, n, dv) and the :class:`SupportCertificate`. Needs α > 1
    (softmax has no threshold: every row would fall back). ``bound``: first vouch for rows by
    the pooled score bound (``piece`` keys per bound), checking only the others (the Triton
    check passes over every row anyway: its cost is per query block). ``engine``:
    ``"torch"`` (the tensor path) or ``"triton"`` (the one-kernel path and the check's kernel,
    :mod:`~sparsefinder.attention.triton_block_sparse`, α = 1.5 only, a power-of-two
    ``block`` ≥ 16). The check's and the fallback's scores go in chunks of rows of at most
    ``fallback_mib`` MiB of working memory."""
    if alpha <= 1.0:
        raise ValueError(f"a support certificate needs α > 1 (sparse entmax), got α={alpha}")
    if engine not in ("torch", "triton"):
        raise ValueError(f"engine must be 'torch' or 'triton', got {engine!r}")
    if piece is not None and not bound:
        raise ValueError(f"piece={piece} sets the pooled bound's keys per bound, which runs "
                         "only with bound=True; pass bound=True or drop piece")
    scaling = _positive(query.shape[-1] ** -0.5 if scaling is None else scaling)
    layer = {"causal": causal, "sliding_window": sliding_window}
    if engine == "triton":
        if alpha != 1.5:
            raise ValueError(f"the Triton kernel computes 1.5-entmax only, got α={alpha}; "
                             "use engine='torch'")
        from sparsefinder.attention.triton_block_sparse import triton_block_sparse_rows

        out, graph, thresholds = triton_block_sparse_rows(
            query, key, value, block_graph, block, scaling=scaling, extra_keys=extra_keys,
            **layer)
    else:
        out, graph, thresholds = block_sparse_rows(
            query, key, value, block_graph, block, scaling=scaling, alpha=alpha,
            extra_keys=extra_keys, **layer)
    by_bound = torch.zeros_like(thresholds, dtype=torch.bool)
    if bound:
        by_bound = certify_rows(query, key, graph, thresholds, block, scaling, piece=piece,
                                **layer)
    if engine == "triton":
        from sparsefinder.attention.triton_support_check import triton_unselected_max

        worst = triton_unselected_max(query, key, graph, block, scaling=scaling,
                                      extra_keys=extra_keys, **layer)
    else:
        worst = unselected_max(query, key, graph, block, scaling=scaling,
                               extra_keys=extra_keys, rows=~by_bound, budget_mib=fallback_mib,
                               **layer)
    certified = by_bound | on_their_support(worst, thresholds)
    if not bool(certified.all()):  # in large chunks: per-chunk solves of a few rows cost more
        dense_rows(out, query, key, value, ~certified, scaling=scaling, alpha=alpha,
                   budget_mib=fallback_mib, **layer)
    return out, SupportCertificate(certified, by_bound)


def on_their_support(worst: Tensor, thresholds: Tensor) -> Tensor:
    """bool like ``thresholds``: rows whose highest unselected score ``worst`` is at or below
    their threshold ``x*`` (rows without a threshold fail). No margin is needed either way: a
    key within rounding of ``x*`` has probability ~0, and a failed row is only recomputed."""
    return torch.isfinite(thresholds) & (worst.double() <= thresholds)


def unselected_max(query: Tensor, key: Tensor, graph: Tensor, block: int, *,
                   scaling: float | None = None, extra_keys: Tensor | None = None,
                   causal: bool = False, sliding_window: int | None = None,
                   rows: Tensor | None = None, budget_mib: float = FALLBACK_MIB) -> Tensor:
    """float (heads, n; float32 or finer): each row's highest score ``scaling · q·k`` over
    the keys it may see outside its selection (the key blocks of ``graph`` (heads, nb, nb) —
    repaired, as :func:`~sparsefinder.attention.block_sparse.block_sparse_rows` returns it —
    and the ``extra_keys`` of its query block); −inf where it selected every key it may see.
    ``rows`` (bool (heads, n)): only those, the others NaN. Rows in chunks of at most
    ``budget_mib`` MiB of scores and masks."""
    scaling = _positive(query.shape[-1] ** -0.5 if scaling is None else scaling)
    extra = check_extra_keys(extra_keys, *graph.shape[:2], query.shape[1], query.device)
    singles = None if extra is None else _SingleKeys.of(extra, graph, block)
    worst = torch.full(query.shape[:2], torch.nan, device=query.device,
                       dtype=torch.promote_types(query.dtype, torch.float32))
    rows = torch.ones_like(worst, dtype=torch.bool) if rows is None else rows
    for head, part, products, visible in _row_chunks(query, key, rows, budget_mib,
                                                      causal=causal,
                                                      sliding_window=sliding_window):
        worst[head, part] = (_unselected_max(products, visible, graph[head], singles, head,
                                             part, block) * scaling).to(worst.dtype)
    return worst


def _positive(scaling: float) -> float:
    if not scaling > 0:
        raise ValueError(f"the support check needs a positive scaling, got {scaling}")
    return float(scaling)


@dataclass(frozen=True)
class _SingleKeys:
    """Each (head, query block)'s new single keys, compacted
    (:func:`~sparsefinder.attention.block_sparse.compact_single_keys`): ``keys`` int64
    (heads · nb, G), past each row's ``counts`` a key of one of its selected blocks (masked
    there anyway); ``common`` the median count. Why: a few crowded blocks may list many more
    keys than the rest, and masking every row at the widest width costs a scatter per key."""

    keys: Tensor
    counts: Tensor
    common: int

    @classmethod
    def of(cls, extra: Tensor, graph: Tensor, block: int) -> _SingleKeys:
        selected = graph.reshape(-1, graph.shape[-1])
        keys, counts = compact_single_keys(extra.view(selected.shape[0], -1), selected, block)
        anchor = selected.to(torch.int8).argmax(-1, keepdim=True) * block
        widest = int(counts.max())
        keys = torch.where(torch.arange(keys.shape[1], device=keys.device) < counts.unsqueeze(1),
                           keys, anchor)[:, :max(widest, 1)]
        return cls(keys, counts, int(counts.median()))

    def mask(self, products: Tensor, rows: Tensor) -> None:
        """−inf into ``products`` (r, m) at the single keys of ``rows`` (r,), ids of (head,
        query block): the first ``common`` of every row, the rest of the rows with more."""
        products.scatter_(-1, self.keys[rows, :self.common], -torch.inf)
        wider = (self.counts[rows] > self.common).nonzero()[:, 0]
        if wider.numel() and self.keys.shape[1] > self.common:
            products[wider.unsqueeze(1), self.keys[rows[wider], self.common:]] = -torch.inf


def _unselected_max(products: Tensor, visible: Tensor | None, graph: Tensor,
                    singles: _SingleKeys | None, head: int, part: Tensor, block: int) -> Tensor:
    """(r,) highest of ``products`` (r, m) — overwritten: −inf at the single keys and the
    invisible ones — over the rows' visible keys outside their query block's selected key
    blocks (``graph`` (nb, nb)) and single keys. The selected blocks are dropped after a
    per-block maximum, on (r, nb) instead of (r, m): one pass over the products fewer."""
    r, m = products.shape
    query_block = torch.div(part, block, rounding_mode="floor")
    if singles is not None:
        singles.mask(products, head * graph.shape[0] + query_block)
    if visible is not None:
        products.masked_fill_(~visible, -torch.inf)
    whole = m // block
    per_block = products[:, :whole * block].view(r, whole, block).amax(-1)  # (r, whole)
    if whole * block < m:  # the last, partial key block
        per_block = torch.cat([per_block, products[:, whole * block:].amax(-1, keepdim=True)],
                              1)
    return per_block.masked_fill_(graph[query_block], -torch.inf).amax(-1)


def _row_chunks(query: Tensor, key: Tensor, rows: Tensor, budget_mib: float, *, causal: bool,
                sliding_window: int | None,
                ) -> Iterator[tuple[int, Tensor, Tensor, Tensor | None]]:
    """(head, row ids, their full rows of products ``q·k`` (r, m), unscaled, their visible
    keys (r, m) or None) for the True ``rows`` (bool (heads, n)), in chunks whose scores and
    temporaries (about :data:`BYTES_PER_SCORE` each) fit ``budget_mib``: a whole head's rows
    at n = 32 768 would be 4 GiB of fp32 scores alone. No chunk exceeds
    :func:`~sparsefinder.attention.block_sparse.chunk_scores` (:data:`CPU_CHUNK_SCORES` on a
    CPU). The masks come from the rows' allowed key range, never an (n, m) mask."""
    m = key.shape[1]
    chunk = int(budget_mib * 2**20 // (m * BYTES_PER_SCORE))
    if chunk < 1:
        raise ValueError(f"one fallback row over m={m} keys needs "
                         f"{m * BYTES_PER_SCORE / 2**20:.2f} MiB, more than fallback_mib="
                         f"{budget_mib}; raise it")
    chunk = min(chunk, max(1, chunk_scores(query.device, CPU_CHUNK_SCORES) // m))
    first, count = allowed_key_range(query.shape[1], m, causal=causal,
                                     sliding_window=sliding_window, device=query.device)
    keys = torch.arange(m, device=query.device)
    for head in range(query.shape[0]):
        todo = torch.nonzero(rows[head]).squeeze(1)
        for start in range(0, len(todo), chunk):
            part = todo[start:start + chunk]
            visible = None
            if causal or sliding_window:
                lo = first[part].unsqueeze(1)
                visible = (keys >= lo) & (keys < lo + count[part].unsqueeze(1))
            yield head, part, query[head, part] @ key[head].T, visible


def dense_rows(out: Tensor, query: Tensor, key: Tensor, value: Tensor, rows: Tensor, *,
               scaling: float, alpha: float, causal: bool, sliding_window: int | None,
               budget_mib: float = FALLBACK_MIB) -> None:
    """Write full α-entmax attention into ``out`` (heads, n, dv) at the True ``rows`` (bool
    (heads, n)), in chunks of rows within ``budget_mib`` (:func:`_row_chunks`)."""
    for head, part, products, visible in _row_chunks(query, key, rows, budget_mib,
                                                      causal=causal,
                                                      sliding_window=sliding_window):
        probs = entmax_normalize(products.mul_(scaling), alpha, visible)
        out[head, part] = (probs.to(value.dtype) @ value[head]).to(out.dtype)
