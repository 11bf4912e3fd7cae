"""The compiled row kernel of :mod:`sparsefinder.attention.entmax_rows` (its docstring has the
maths), in a module of its own so that numba's on-disk cache keeps it.

Why a separate module: numba caches a ``cache=True`` function next to the file that defines it,
but a function defined inside another one (the kernel was built in a cached closure, to keep
numba out of import time) is compiled again by every process: 1.7 s of a fresh server's first
graph. Importing this module imports numba; :func:`entmax_rows._kernel` imports it on first use.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# No "no NaN / no inf" flags: -inf scores occur (masked keys) and must compare as such.
_FASTMATH = {"reassoc", "nsz", "contract"}


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
