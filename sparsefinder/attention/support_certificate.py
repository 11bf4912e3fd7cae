"""Exact block-sparse α-entmax: a cheap certificate per row, and a dense fallback where it fails.

Block Sparsefinder computes α-entmax on the selected keys ``S`` of each row. By
sparse-consistency that equals full α-entmax iff no key outside ``S`` would enter the
support: with the row's threshold ``τ`` found on ``S`` (in score units ``x* = τ/(α−1)``),
every key ``j ∉ S`` must have score ``x_j ≤ x*``. Checking that exactly costs the full
``QKᵀ``. A bound does it for ``1/block`` of the cost: over a key block ``B`` with
coordinate-wise maximum ``k⁺`` and minimum ``k⁻``,

    q·k = Σ_d q_d k_d ≤ Σ_d max(q_d k⁺_d, q_d k⁻_d) = q⁺·k⁺ + q⁻·k⁻

(``q⁺ = max(q, 0)``, ``q⁻ = min(q, 0)``)

for every key of the block (Quest's page bound), and ``q·k ≤ q·c + ‖q‖·r`` with ``c`` the
block's mean key and ``r`` its largest distance to it (a ball); the smaller of the two holds. A
few ``(n, d) @ (d, nb)`` products bound every (row, block) pair. A row is **certified** when
every block it did not select (and may see) is bounded below ``x*`` by a rounding margin. A
certified row is exact; the others are recomputed densely (their full row of scores), so the
output is exact for every row, and the report says how many rows needed it. The bound is
conservative: a block holding a single ``extra_keys`` key of the row, or the row's own
partially visible diagonal block, is bounded whole, so such rows may fall back without need —
never the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sparsefinder.attention.block_sparse import block_sparse_rows, num_blocks
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


@dataclass(frozen=True)
class SupportCertificate:
    """What the certificate found: ``certified`` bool (heads, n), rows exact on their own
    support; the others were recomputed densely (``fallback_rows`` of ``rows``)."""

    certified: Tensor

    @property
    def rows(self) -> int:
        return int(self.certified.numel())

    @property
    def fallback_rows(self) -> int:
        return int((~self.certified).sum())

    @property
    def certified_fraction(self) -> float:
        return 1.0 - self.fallback_rows / max(self.rows, 1)


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
    """bool (heads, n): rows whose every unselected, visible key block is bounded below the
    row's threshold ``x*`` (``thresholds``, from :func:`block_sparse_rows` or the kernel's
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
    piece: int | None = None,
    engine: str = "torch",
    fallback_mib: float = FALLBACK_MIB,
) -> tuple[Tensor, SupportCertificate]:
    """:func:`~sparsefinder.attention.block_sparse.block_sparse_entmax`, exact on every row:
    rows the certificate cannot vouch for are recomputed on their full row of keys. Returns
    the output (heads, n, dv) and the :class:`SupportCertificate`. Needs α > 1 (softmax has
    no threshold: every row would fall back). ``engine``: ``"torch"`` (the tensor path) or
    ``"triton"`` (the one-kernel path, :mod:`~sparsefinder.attention.triton_block_sparse`,
    α = 1.5 only, a power-of-two ``block`` ≥ 16). The fallback's scores go in chunks of rows
    of at most ``fallback_mib`` MiB of working memory."""
    if alpha <= 1.0:
        raise ValueError(f"a support certificate needs α > 1 (sparse entmax), got α={alpha}")
    if engine not in ("torch", "triton"):
        raise ValueError(f"engine must be 'torch' or 'triton', got {engine!r}")
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if engine == "triton":
        if alpha != 1.5:
            raise ValueError(f"the Triton kernel computes 1.5-entmax only, got α={alpha}; "
                             "use engine='torch'")
        from sparsefinder.attention.triton_block_sparse import triton_block_sparse_rows

        out, graph, thresholds = triton_block_sparse_rows(
            query, key, value, block_graph, block, scaling=scaling, causal=causal,
            extra_keys=extra_keys, sliding_window=sliding_window)
    else:
        out, graph, thresholds = block_sparse_rows(
            query, key, value, block_graph, block, scaling=scaling, alpha=alpha,
            causal=causal, extra_keys=extra_keys, sliding_window=sliding_window)
    certified = certify_rows(query, key, graph, thresholds, block, scaling, causal=causal,
                             sliding_window=sliding_window, piece=piece)
    if not bool(certified.all()):
        out = out.clone()
        dense_rows(out, query, key, value, ~certified, scaling=scaling, alpha=alpha,
                   causal=causal, sliding_window=sliding_window, budget_mib=fallback_mib)
    return out, SupportCertificate(certified)


def dense_rows(out: Tensor, query: Tensor, key: Tensor, value: Tensor, rows: Tensor, *,
               scaling: float, alpha: float, causal: bool, sliding_window: int | None,
               budget_mib: float = FALLBACK_MIB) -> None:
    """Write full α-entmax attention into ``out`` (heads, n, dv) at the True ``rows`` (bool
    (heads, n)), in chunks of rows whose scores and solver temporaries (about
    :data:`BYTES_PER_SCORE` each) fit ``budget_mib``: a whole head's rows at n = 32 768 would
    be 4 GiB of fp32 scores alone. Each chunk's mask comes from the rows' allowed key range,
    never an (n, m) mask."""
    m = key.shape[1]
    chunk = int(budget_mib * 2**20 // (m * BYTES_PER_SCORE))
    if chunk < 1:
        raise ValueError(f"one fallback row over m={m} keys needs "
                         f"{m * BYTES_PER_SCORE / 2**20:.2f} MiB, more than fallback_mib="
                         f"{budget_mib}; raise it")
    first, count = allowed_key_range(query.shape[1], m, causal=causal,
                                     sliding_window=sliding_window, device=query.device)
    keys = torch.arange(m, device=query.device)
    for head in range(query.shape[0]):
        todo = torch.nonzero(rows[head]).squeeze(1)
        for start in range(0, len(todo), chunk):
            part = todo[start:start + chunk]
            scores = (query[head, part] @ key[head].T) * scaling  # (r, m): the full rows
            allowed = None
            if causal or sliding_window:
                lo = first[part].unsqueeze(1)
                allowed = (keys >= lo) & (keys < lo + count[part].unsqueeze(1))
            probs = entmax_normalize(scores, alpha, allowed)
            out[head, part] = (probs.to(value.dtype) @ value[head]).to(out.dtype)
