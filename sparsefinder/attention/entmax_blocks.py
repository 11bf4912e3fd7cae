"""The sort-free α-entmax solver in tensor operations (any device): blocks of keys, a Newton
bound, the closed-form threshold of a candidate support and its certificate.

The maths. Both are ``p_j = [z_j - τ]_+^β`` for a per-row threshold τ, with

* 1.5-entmax: ``z = (x - max x)/2``, β=2 and τ the root of ``f(τ) = Σ_j [z_j - τ]_+² - 1``;
* sparsemax:  ``z = x - max x``,      β=1 and τ the root of ``f(τ) = Σ_j [z_j - τ]_+ - 1``.

(These are the package's own scalings; :func:`_centre_` reproduces its z bit for bit.) f is
convex, continuous and strictly decreasing up to ``max z = 0``, and ``f(-1) ≥ 0``, so the root
is unique and ``τ* ∈ [-1, 0)``: every key with ``z ≤ -1`` — ``x ≤ max - 2`` for 1.5-entmax —
gets probability exactly 0. Given the support ``T = {j : z_j > τ*}``, τ* has a closed form
(the formula the package evaluates for every prefix of the sorted row; we need it for one set):

* 1.5-entmax: ``τ_S = mean_S - sqrt((1 - ss_S)/|S|)``, ``ss_S = Σ_S (z - mean_S)²``;
* sparsemax:  ``τ_S = (Σ_S z - 1)/|S|``.

The algorithm, per row:

1. **Block bound** (:func:`_block_bound`). One pass takes the maximum of every block of 16
   consecutive keys. Any subset of the keys gives a lower bound on τ* (dropping terms of f
   only lowers it), so Newton steps on the block maxima alone give a bound ``lo ≤ τ*`` —
   typically within a few % of τ*. A block whose maximum is ``≤ lo`` holds only
   zero-probability keys; on MiniLM attention at n=512, 9-36% of the blocks survive.
2. **Compaction** (:func:`_gather_blocks`): the surviving blocks are copied into a small
   (blocks, 16) tensor. Everything after this touches only that tensor.
3. **Certified solve** (:func:`_solve_blocks`): evaluations at points ``t ≥ lo`` — one pass
   computing ``|S_t|, Σ (z - t), Σ (z - t)²`` over ``S_t = {z > t}`` — alternate the closed
   form τ_S of the current set with Newton steps. Every answer is *certified*, not trusted to
   a tolerance: τ_S is accepted only when an evaluation at it counts exactly ``|S|`` keys,
   which proves S is its support (see :func:`_candidates`). 2.3-3 evaluations a row on
   average; the last few rows still open after ~4 evaluations go to the fallback.
4. **Output**: ``[z - τ]_+^β`` on the surviving blocks, copied into zeros.

Rows not certified (rounding exactly at a tie, NaN/inf input, the few stragglers) go to the
package's sort-based function. The result is therefore the package's function up to float
rounding of τ: same support (except keys lying exactly on the threshold, which get 0 here
and rounding-level mass there) and probabilities within ~1e-6 of it — closer to the exact
(float64) values than the package's own float32 result, whose prefix cumsums drift by ~1e-6.

Two solvers run this algorithm (:data:`ENGINES`). On a CPU the default is the compiled
per-row solver of :mod:`sparsefinder.attention.entmax_rows` (numba): the tensor-op version below
costs
~200 small operations a call, each a parallel region, which is most of its time (MiniLM,
n=512: ~35 ms a forward pass against ~6 ms for softmax) and which a busy machine stretches
many times over. The tensor-op version stays for GPUs and wherever numba is missing. Entry
points also tune glibc malloc (:func:`sparsefinder.runtime.tune_cpu_allocator`); importing
this module changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

# Keys per block in step 1. Small blocks prune more (a block survives if any of its keys
# might), large blocks make the block-max pass, the gather and the per-block sums cheaper;
# 16 measured best on MiniLM attention at n=512 on a CPU (8: +11%, 32: +12% time).
_BLOCK = 16


# Newton steps on the block maxima: a third moves the bound by <1% on attention rows.
_BOUND_STEPS = 2


# Evaluations before a row is handed to the fallback. Attention rows need 2-5.
_MAX_ITER = 12


# Re-compact the blocks once the open rows fall below this fraction of those at the last
# compaction.
_COMPACT_BELOW = 0.7


# Stop iterating once at most this many rows are still open; those go to the sort-based
# fallback (an evaluation costs about as much as sorting ~10 rows of 512; see _solve_blocks).
_TAIL_ROWS = 8

@dataclass
class SolverStats:
    """Counters a caller can pass to the fast functions to see how the solver did."""

    rows: int = 0  # rows solved, by the fast path or the fallback
    fallback_rows: int = 0  # rows handed to the sort-based function
    evaluations: int = 0  # Σ over evaluations of the rows still open in it
    block_fraction_sum: float = 0.0  # Σ over calls of the fraction of blocks kept in step 1
    calls: int = 0

    @property
    def fallback_rate(self) -> float:
        return self.fallback_rows / self.rows if self.rows else 0.0

    @property
    def evaluations_per_row(self) -> float:
        return self.evaluations / self.rows if self.rows else 0.0

    @property
    def block_fraction(self) -> float:
        return self.block_fraction_sum / self.calls if self.calls else 0.0


def _centre_(x: Tensor, row_max: Tensor, squared: bool) -> Tensor:
    """In place: ``z = (x - max)/2`` (1.5-entmax) or ``x - max`` (sparsemax), as the package.

    Bit for bit: halving is exact in binary floating point, so
    ``round(x/2 - max/2) = round(x - max)/2``. In place because fresh memory is expensive
    on a CPU (see :func:`sparsefinder.attention.entmax_ops.entmax15_fast`).
    """
    if squared:
        return x.mul_(0.5).sub_(row_max * 0.5)
    return x.sub_(row_max)


def _newton_bound(z: Tensor, t: Tensor, squared: bool, buf: Tensor) -> Tensor:
    """One Newton step from ``t`` on the row function of ``z`` (last axis); a lower bound.

    ``buf`` is scratch space shaped like z.
    1.5-entmax: the step is on ``h(τ) = sqrt(Σ [z - τ]_+²) - 1`` rather than on f. h has the
    same root and is convex — a norm, nondecreasing in each argument, of the convex
    ``[z_j - τ]_+`` — so its tangent lies below it and the step lands on a lower bound of the
    root from either side, never past it; and h is nearly linear where f is a steep parabola,
    so from far below it moves up to 2× further. Sparsemax: f is piecewise linear and the step
    is Michelot's ``t + (Σ (z - t)_+ - 1)/|S_t|``.
    """
    d = torch.sub(z, t, out=buf).clamp_(min=0)
    s1 = d.sum(-1, keepdim=True)
    if squared:
        norm = torch.linalg.vector_norm(d, dim=-1, keepdim=True)
        return t + (norm - 1) * norm / s1
    return t + (s1 - 1) / d.sign_().sum(-1, keepdim=True)


def _block_bound(x: Tensor, squared: bool, block: int) -> tuple[Tensor, Tensor, Tensor]:
    """Step 1: row maxima (r, 1), centred block maxima (r, blocks) and a bound ``lo ≤ τ*``.

    The block maxima are one max-pool pass (the last block may be partial). Their centring is
    monotone, so they are exactly the maxima of the blocks' z. The block maxima are a subset
    of the keys, and f over a subset is ≤ f, so its root τ_b is ≤ τ*; Newton steps from
    ``-1 ≤ τ_b`` stay below τ_b. A ~1e-6 margin absorbs the steps' rounding.
    """
    rows, n = x.shape
    if n % block == 0 and block >= 32:  # a plain reduction is vectorised from 32 keys up
        maxima = x.view(rows, n // block, block).amax(-1)
    else:
        maxima = F.max_pool1d(x.unsqueeze(1), block, block, ceil_mode=True).squeeze(1)
    row_max = maxima.amax(-1, keepdim=True)
    zb = _centre_(maxima, row_max, squared)
    t = torch.full_like(row_max, -1.0)
    buf = torch.empty_like(zb)
    for _ in range(_BOUND_STEPS):
        t = _newton_bound(zb, t, squared, buf)
    return row_max, zb, t - 1e-6 * (1 + t.abs())


def _gather_blocks(
    x: Tensor, row_max: Tensor, zb: Tensor, lo: Tensor, squared: bool, block: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Step 2: (kept blocks' rows (k,), their z (k, block), their maxima (k,), destination).

    Where they go: when ``block`` divides n, the kept blocks' ids in the (rows·n/block, block)
    view of the output; otherwise each key's flat position (k, block).

    Kept blocks are those whose maximum is above ``lo``. A block is ``block`` consecutive
    keys read through an overlapping ``unfold`` view of the flat scores, so one
    ``index_select`` gathers them wherever they start. When ``block`` does not divide n, the
    last block of a row is read right-aligned (its last ``block`` keys) and the keys it shares
    with the block before are set to -inf here and sent to a dummy output slot, so every key
    is counted once.
    """
    rows, n = x.shape
    per_row = zb.shape[1]
    ids = (zb > lo).view(-1).nonzero().squeeze(1)
    brow = torch.div(ids, per_row, rounding_mode="floor")
    block_max = row_max.view(-1).index_select(0, brow).unsqueeze(1)
    if n % block == 0:
        z = _centre_(x.view(-1, block).index_select(0, ids), block_max, squared)
        return brow, z, zb.view(-1).index_select(0, ids), ids
    first_col = (ids - brow * per_row) * block
    start_col = first_col.clamp(max=n - block)
    start = brow * n + start_col
    windows = x.reshape(-1).unfold(0, block, 1)
    z = _centre_(windows.index_select(0, start), block_max, squared)
    offsets = torch.arange(block, device=x.device)
    positions = start.unsqueeze(1) + offsets
    shared = (start_col.unsqueeze(1) + offsets) < first_col.unsqueeze(1)
    z.masked_fill_(shared, -math.inf)
    positions.masked_fill_(shared, rows * n)
    return brow, z, zb.view(-1).index_select(0, ids), positions


def _evaluate(
    z: Tensor, t: Tensor, brow: Tensor, rows: int, squared: bool, buf: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """One evaluation: ``|S_t|, Σ_S (z - t), Σ_S (z - t)²`` per row, ``S_t = {z > t}``.

    ``z`` (k, block) are the kept blocks, ``t`` (k, 1) each block's row's point, ``brow``
    (k,) each block's row, ``buf`` scratch space like z. The sums are of ``d = [z - t]_+``,
    which is exactly 0 off S_t, so no mask is needed, and they are shifted to t, so no large
    terms cancel. d is then squared and turned into its sign in place (``d² > 0`` iff
    ``d > 0``), so one buffer serves all three sums: fresh memory is expensive here (a page
    fault per 4 KiB on first touch costs about as much as a pass over it).

    The per-block reductions are products with a vector of ones on the CPU — sums over 8-16
    contiguous floats run ~3× faster through BLAS than through ``sum`` — and ``sum`` on GPUs
    (where a float32 matmul may be TF32). Block sums go into rows with one ``index_add``.
    Returns three (rows,) tensors (s2 is s1 for sparsemax).
    """
    d = torch.sub(z, t, out=buf).clamp_(min=0)
    if z.device.type == "cpu":
        ones = torch.ones(z.shape[1], dtype=z.dtype)

        def block_sum(v: Tensor) -> Tensor:
            return v @ ones

    else:

        def block_sum(v: Tensor) -> Tensor:
            return v.sum(-1)

    parts = [block_sum(d)]
    if squared:
        parts.append(block_sum(d.square_()))
    parts.append(block_sum(d.sign_()))
    sums = torch.zeros(len(parts), rows, dtype=z.dtype, device=z.device)
    sums.index_add_(1, brow, torch.stack(parts))
    return sums[-1], sums[0], sums[1] if squared else sums[0]


def _candidates(
    t: Tensor, count: Tensor, s1: Tensor, s2: Tensor, squared: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """From one evaluation at ``t``: (below, τ_S, τ_S exists, Newton step).

    ``below`` is ``f(t) ≥ 0``, i.e. ``t ≤ τ*``. ``τ_S`` is the closed-form root for the set
    ``S = S_t = {z > t}`` (module docstring), computed from the sums of ``z - t`` over S —
    shifted to t, so no large terms cancel: for 1.5-entmax ``τ_S = t + m - sqrt((1 - ss)/|S|)``
    with ``m = s1/|S|``, ``ss = s2 - s1·m`` (it exists iff ``ss ≤ 1``); for sparsemax
    ``τ_S = t + (s1 - 1)/|S|``.

    Why τ_S is the next point to try. Write T for the support.

    * ``t ≤ τ*`` gives ``S ⊇ T``. On ``[t, τ*)`` the piece ``g_S(τ) = Σ_S (z - τ)^β - 1``
      dominates f (the extra terms are ≥ 0, keys outside S are ≤ t), and f > 0 there, so g_S
      has no root in ``[t, τ*)``: ``τ_S ≥ τ*``, with equality iff ``S = T``.
    * ``t > τ*`` gives ``S ⊆ T``, so ``g_S(τ*) ≤ f(τ*) = 0``: the root exists and
      ``τ_S ≤ τ*``, with equality iff ``S = T``.

    **Certificate.** If an evaluation at ``τ_S`` counts exactly ``|S|`` keys, then
    ``S_{τ_S} = S`` (the sets ``{z > a}`` are nested, so equal sizes mean equal sets), i.e.
    S is the support of τ_S, so ``f(τ_S) = g_S(τ_S) = 0``: τ_S is *the* root. The same holds
    when τ_S was raised to a proven lower bound ``lo ≤ τ*`` (second case): equal counts at lo
    and at ``t > τ*`` mean no key lies in ``(lo, t]``, so S is the support of every point
    there, τ* included.
    """
    count = count.clamp(min=1)  # t < 0 = max z, so |S| ≥ 1; guards rows with no blocks
    if squared:
        mean = s1 / count
        disc = torch.addcmul(1 - s2, s1, mean).div_(count)  # (1 - ss)/|S|, ss = s2 - s1·m
        exists = disc >= 0
        tau_s = torch.where(exists, (t + mean).sub_(disc.clamp_(min=0).sqrt_()), t)
        norm = s2.sqrt()
        newton = torch.addcmul(t, norm - 1, norm / s1)
        below = s2 >= 1
    else:
        tau_s = t + (s1 - 1) / count
        exists = torch.ones_like(t, dtype=torch.bool)
        newton = tau_s  # Newton on a piecewise-linear f is the piece's root
        below = s1 >= 1
    return below, tau_s, exists, newton


def _solve_blocks(
    brow: Tensor,
    z: Tensor,
    top: Tensor,
    lo: Tensor,
    squared: bool,
    max_iter: int,
    stats: SolverStats | None,
) -> tuple[Tensor, Tensor]:
    """Step 3: per-row τ* (r,) and a bool "certified" (r,), from the kept blocks only.

    ``brow`` (k,) is each block's row, ``z`` (k, block) its keys and ``top`` (k,) their maximum;
    ``lo`` (r,) a lower bound with every key above it inside a kept block. Each evaluation
    reduces ``[z - t]_+`` per block and adds the block sums into their rows. The next point is
    τ_S when it exists, else the Newton step, and never below the best lower bound so far
    (``lo`` only grows: the evaluation points below τ* and every Newton step are lower bounds,
    see :func:`_newton_bound`) — so keys ≤ lo, never counted, never matter. A row is
    certified by :func:`_candidates`' certificate.

    The loop stops once at most ``_TAIL_ROWS`` rows are open (or after ``max_iter``
    evaluations): every evaluation costs ~40 small per-row operations whatever the number of
    open rows, so the last few stragglers are cheaper to sort than to iterate on.
    """
    rows = lo.shape[0]
    floor, t, lo = lo, lo.clone(), lo.clone()  # floor: no key above it is outside z
    tau = torch.zeros_like(lo)
    pending = torch.full_like(lo, -1.0)  # |S| when t is (raised) τ_S of S; -1 otherwise
    live = torch.ones(rows, dtype=torch.bool, device=lo.device)
    open_rows = compacted_at = rows
    tail = min(_TAIL_ROWS, rows // 64)  # small inputs are solved to the end
    buf = torch.empty_like(z)
    for _ in range(max_iter):
        if stats is not None:
            stats.evaluations += open_rows
        count, s1, s2 = _evaluate(
            z, t.index_select(0, brow).unsqueeze(1), brow, rows, squared, buf[: z.shape[0]]
        )
        below, tau_s, exists, newton = _candidates(t, count, s1, s2, squared)
        done = live & (count == pending)
        # A certified t is (raised) τ_S of its set; τ_S recomputed from the sums *at t* is the
        # same root, computed with the shift right next to it (Σ (z - t)² ≈ 1), so more
        # accurately than from a far earlier point.
        tau = torch.where(done, tau_s, tau)
        live &= ~done
        # From above, the step must go down; where rounding leaves it at t, it proves nothing.
        lo = torch.where(below | (newton < t), torch.maximum(lo, newton), lo)
        # Above τ*, τ_S and the Newton step are both lower bounds: try the larger. Below τ*,
        # τ_S ≥ τ* ≥ lo already. Near τ* rounding can put τ_S a hair on the wrong side of t
        # (or misjudge the side); raising it must then not bring it back to t, or the row
        # would stall one evaluation short of its certificate.
        raised = torch.maximum(tau_s, torch.where(below, floor, lo))
        raised = torch.where(raised == t, torch.maximum(tau_s, floor), raised)
        t = torch.where(live, torch.where(exists, raised, lo), t)
        # A finite row always counts its maximum (z = 0 > t); a row that counts nothing holds
        # NaN/inf and must never be certified.
        pending = torch.where(exists & (count > 0), count, -1.0)
        open_rows = int(live.sum())
        if open_rows <= tail:
            break
        if open_rows < _COMPACT_BELOW * compacted_at:
            # Blocks of finished rows, and blocks entirely ≤ lo, can go: evaluation points
            # never drop below ``floor``, which moves up to lo here.
            compacted_at = open_rows
            floor = lo.clone()
            keep = live.index_select(0, brow) & (top > lo.index_select(0, brow))
            index = keep.nonzero().squeeze(1)
            brow, z, top = (v.index_select(0, index) for v in (brow, z, top))
    return tau, ~live
