"""1.5-entmax and sparsemax solved one row at a time in compiled code: the CPU path.

Why a second solver next to the tensor-op block solver of :mod:`sparsefinder.attention.entmax_ops`:
on a CPU that one spends its time in the fixed cost of ~200 small tensor operations per
call, not in arithmetic, and each of them is a parallel region that waits for every thread.
On a busy 2-core machine a thread that the OS has descheduled stalls all ~200 of them, and a
forward pass that takes 35 ms of solver time when quiet took 10× longer under load. Here the
whole per-row algorithm is one loop nest compiled by numba; rows are split into one chunk
per thread, so a call has one synchronisation point instead of ~200.

The maths is the block solver's (:mod:`sparsefinder.attention.entmax_ops`, ``_candidates``); per
row:

1. **One pass** finds the maximum (and NaN), and the maximum of every block of ``block``
   keys; z = (x - max)/2 for 1.5-entmax, x - max for sparsemax.
2. **Bound.** Newton steps on the block maxima alone give ``lo ≤ τ*`` (a subset of keys
   gives a lower bound); blocks whose maximum is ``≤ lo`` hold only zero probabilities and
   are never read again.
3. **Certified iteration** over the kept blocks: alternate the closed form τ_S of
   ``S = {z > t}`` with Newton steps, never below the best lower bound. A row is certified
   when the evaluation at τ_S counts exactly ``|S|`` keys: S is then the support of τ_S, so
   τ_S is the root. Rows not certified within ``max_iter`` evaluations, or whose maximum is
   NaN/±inf, are reported back for the package's sort-based function.
4. **Output** ``[z - τ]_+^β`` on the kept blocks, zeros elsewhere.

**Precision.** Scores are read in their own dtype; z, the sums, τ and the output before its
final rounding are float64, so the support is the float64 package's up to keys lying exactly
on the threshold. The sums are reassociated (vectorised); in float64 that moves them ~1e-16.

Compilation happens on the first call (about a second; numba caches it on disk where it
can), never at import.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np
import torch
from torch import Tensor

# No "no NaN / no inf" flags: -inf scores occur (masked keys) and must compare as such.
_FASTMATH = {"reassoc", "nsz", "contract"}
# Below this many scores a call is not split over threads (the hand-off costs ~50 µs).
_SPLIT_MIN_SCORES = 1 << 16


@cache
def _kernel():  # noqa: ANN202 - returns a numba dispatcher
    """Compile (once per process, lazily) the row kernel."""
    from numba import njit

    @njit(inline="always", error_model="numpy")
    def has_nan(row):  # noqa: ANN001,ANN202 - strict IEEE: must see NaN
        bad = False
        for j in range(row.shape[0]):
            bad |= row[j] != row[j]
        return bad

    # Without NaN (checked before), max reductions vectorise.
    @njit(inline="always", error_model="numpy", fastmath={"nnan", "nsz"})
    def block_maxima(row, block, tops):  # noqa: ANN001,ANN202
        n = row.shape[0]
        peak = -np.inf
        for b in range(tops.shape[0]):
            best = row[b * block]
            for j in range(b * block + 1, min(b * block + block, n)):
                best = max(best, row[j])
            tops[b] = best
            peak = max(peak, np.float64(best))
        return peak

    @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FASTMATH)
    def solve_rows(x, block, squared, max_iter, bound_steps, out, certified,  # noqa: ANN001,ANN202
                   evaluations, kept_blocks):
        rows, n = x.shape
        per_row = (n + block - 1) // block
        tops = np.empty(per_row, np.float64)
        ids = np.empty(per_row, np.int64)
        half = 0.5 if squared else 1.0
        for r in range(rows):
            row = x[r]
            dest = out[r]
            # 1. The output row starts at zero; NaN; the maximum and the block maxima. The
            # row's sum, taken in the same pass, is NaN if a key is (or if +inf meets -inf):
            # only then is the row searched for NaN.
            total = 0.0
            for j in range(n):
                total += row[j]
                dest[j] = 0
            certified[r] = False
            evaluations[r] = 0
            kept_blocks[r] = 0
            if total != total and has_nan(row):
                continue
            peak = block_maxima(row, block, tops)
            if not np.isfinite(peak):
                continue
            for b in range(per_row):
                tops[b] = (tops[b] - peak) * half
            # 2. Newton steps from -1 on the block maxima: a lower bound on τ*.
            t = -1.0
            for _ in range(bound_steps):
                s0 = 0.0
                s1 = 0.0
                s2 = 0.0
                for b in range(per_row):
                    d = max(tops[b] - t, 0.0)
                    s0 += d > 0.0
                    s1 += d
                    s2 += d * d
                if squared:
                    norm = math.sqrt(s2)
                    t = t + (norm - 1.0) * norm / s1
                else:
                    t = t + (s1 - 1.0) / s0
            floor = t - 1e-6 * (1.0 + abs(t))
            blocks = 0
            for b in range(per_row):
                ids[blocks] = b
                blocks += tops[b] > floor
            kept_blocks[r] = blocks
            # 3. The certified iteration of entmax_ops._solve_blocks / _candidates.
            t = floor
            bound = floor
            pending = -1
            tau = 0.0
            done = False
            used = 0
            for _ in range(max_iter):
                used += 1
                s1 = 0.0
                s2 = 0.0
                # z - t = half·(x - shift): one subtraction per key, sums scaled after.
                shift = peak + t / half
                counted = 0.0  # a float count keeps the loop vectorisable
                for i in range(blocks):
                    keys = row[ids[i] * block:min(ids[i] * block + block, n)]
                    for j in range(keys.shape[0]):
                        d = max(np.float64(keys[j]) - shift, 0.0)
                        counted += 1.0 if d > 0.0 else 0.0
                        s1 += d
                        s2 += d * d
                count = int(counted)
                s1 *= half
                s2 *= half * half
                size = max(count, 1)
                if squared:
                    mean = s1 / size
                    disc = (1.0 - s2 + s1 * mean) / size
                    exists = disc >= 0.0
                    tau_s = t + mean - math.sqrt(disc) if exists else t
                    norm = math.sqrt(s2)
                    newton = t + (norm - 1.0) * norm / s1
                    below = s2 >= 1.0
                else:
                    tau_s = t + (s1 - 1.0) / size
                    exists = True
                    newton = tau_s
                    below = s1 >= 1.0
                if count == pending:
                    tau = tau_s
                    done = True
                    break
                if below or newton < t:
                    bound = max(bound, newton)
                raised = max(tau_s, floor if below else bound)
                if raised == t:
                    raised = max(tau_s, floor)
                t = raised if exists else bound
                pending = count if (exists and count > 0) else -1
            evaluations[r] = used
            certified[r] = done
            # 4. Output on the kept blocks.
            if done:
                shift = peak + tau / half
                for i in range(blocks):
                    start = ids[i] * block
                    for j in range(start, min(start + block, n)):
                        d = max(np.float64(row[j]) - shift, 0.0) * half
                        dest[j] = d * d if squared else d

    return solve_rows


@cache
def _pool(workers: int) -> ThreadPoolExecutor:
    """Worker threads for row chunks, created on first use (the kernel releases the GIL)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sparsefinder-entmax")


def available() -> bool:
    """Whether numba can be imported (the row solver's only extra requirement)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def solve_rows(
    x: Tensor, squared: bool, max_iter: int, block: int = 16, bound_steps: int = 2
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``[z - τ*]_+^β`` for every row of the contiguous CPU (rows, n) float32/float64 ``x``.

    Returns (probabilities like x, certified (rows,) bool, evaluations (rows,) int32, blocks
    read after the bound (rows,) int32). Rows not certified come back as zeros; the caller
    solves them another way. Large inputs are split over ``torch.get_num_threads()`` threads.
    """
    rows, n = x.shape
    out = torch.empty_like(x)
    certified = np.zeros(rows, np.bool_)
    evaluations = np.zeros(rows, np.int32)
    kept_blocks = np.zeros(rows, np.int32)
    arrays = (x.numpy(), out.numpy(), certified, evaluations, kept_blocks)
    kernel = _kernel()
    workers = min(torch.get_num_threads(), os.cpu_count() or 1, rows)
    if workers <= 1 or x.numel() < _SPLIT_MIN_SCORES:
        kernel(arrays[0], block, squared, max_iter, bound_steps, *arrays[1:])
    else:
        bounds = np.linspace(0, rows, workers + 1).astype(int)
        chunks = [[v[a:b] for v in arrays] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        jobs = [_pool(workers - 1).submit(kernel, c[0], block, squared, max_iter, bound_steps,
                                          *c[1:]) for c in chunks[1:]]
        kernel(chunks[0][0], block, squared, max_iter, bound_steps, *chunks[0][1:])  # ours
        for job in jobs:
            job.result()
    return (out, torch.from_numpy(certified), torch.from_numpy(evaluations),
            torch.from_numpy(kept_blocks))
