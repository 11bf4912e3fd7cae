"""The distance test and the per-row floor in one compiled pass over the keys (the CPU path).

Why: a calibrated distance predictor (:class:`~.threshold_distance.ThresholdDistance`,
optionally under :class:`~.row_floor.RowFloor`) is the app's first screen, and in tensor ops it
writes, reads and compares a float32 ``(heads, n, m)`` block of partial distances per layer
(75 MB for 12 heads at n = 512), then counts each row's kept keys in another pass. Those passes
over memory, not the ``r``-term dot products, are its cost. Here one loop nest per pair of
query rows computes

    d_ij = ‖k_j‖² − 2 q_i·k_j  and keeps  d_ij ≤ t_h − ‖q_i‖²   (⇔ ‖q_i − k_j‖² ≤ t_h),

writes the row's mask and counts it while the keys are in cache; a row keeping fewer than its
floor ``f_i`` keys then gets its ``f_i`` smallest ``d_ij`` (its nearest keys) by one insertion
pass. Only each row's allowed keys (a contiguous run, :func:`~sparsefinder.attention.masks.
allowed_key_range`) are tested or chosen; every other pair is written False.

Two query rows share every key load (the dot products of both are formed from one read of
``k_j``), and ``r`` is padded with zeros to :data:`MAX_RANK` (a zero coordinate adds exactly
0). Larger ranks, other dtypes and other devices take the tensor-op path of the callers.

**Precision.** float32 as the tensor path, but the ``r`` products are summed in another order:
a pair whose distance lies within a few ulp of its threshold may be decided the other way
(on random data, ~1 pair in 10⁷). Ties among a short row's nearest keys go to the lower key
index. Compilation happens on the first call (about a second; cached on disk where numba
can), never at import.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np
import torch
from torch import Tensor

from sparsefinder.attention.masks import allowed_key_range

#: The largest projected rank the compiled pass takes; ranks up to 4 run as 4, up to 8 as 8
#: (zero-padded: a zero coordinate adds exactly 0).
MAX_RANK = 8
_RANKS = (4, 8)
# Below this many pairs a call is not split over threads (the hand-off costs ~50 µs).
_SPLIT_MIN_PAIRS = 1 << 20
# No "reassoc": each d_ij is summed in one order whatever the vector width; no "nnan": NaN
# compares as False.
_FASTMATH = {"nsz", "contract"}

# The two hot loops, written out for one rank. LLVM vectorises the key loop only when the r
# products are one unrolled expression over r key rows held in locals (a loop over r inside
# it, or coefficients read from an array, ran 4-6x slower), so the source is generated for
# each rank of _RANKS from these templates; {k} lists the key rows, {a}/{b} the sums.
_SPAN_SOURCE = """
def row_span(kt, kk, coef, t, lo, hi, row):
    {k} = {k_rows}
    base, out = kk[lo:hi], row[lo:hi]
    kept = 0
    for j in range(hi - lo):
        keep = np.uint8(base[j] + {a} <= t)
        out[j] = keep
        kept += np.int32(keep)
    return kept


def pair_span(kt, kk, ca, cb, ta, tb, lo, hi, row_a, row_b):
    {k} = {k_rows}
    base, out_a, out_b = kk[lo:hi], row_a[lo:hi], row_b[lo:hi]
    kept_a = 0
    kept_b = 0
    for j in range(hi - lo):
        {x} = {x_values}
        keep_a = np.uint8(base[j] + {a_x} <= ta)
        keep_b = np.uint8(base[j] + {b_x} <= tb)
        out_a[j] = keep_a
        out_b[j] = keep_b
        kept_a += np.int32(keep_a)
        kept_b += np.int32(keep_b)
    return kept_a, kept_b


def terms(q, t2):
    two = np.float32(-2.0)
    norm = np.float32(0.0)
    for c in range(q.shape[0]):
        norm += q[c] * q[c]
    return ({coef}), t2 - norm
"""


def _span_source(rank: int) -> str:
    """:data:`_SPAN_SOURCE` written out for ``rank``."""
    names = ", ".join(f"k{c}" for c in range(rank))
    return _SPAN_SOURCE.format(
        k=names, k_rows=", ".join(f"kt[{c}, lo:hi]" for c in range(rank)),
        a=" + ".join(f"coef[{c}] * k{c}[j]" for c in range(rank)),
        x=", ".join(f"x{c}" for c in range(rank)), x_values=", ".join(
            f"k{c}[j]" for c in range(rank)),
        a_x=" + ".join(f"ca[{c}] * x{c}" for c in range(rank)),
        b_x=" + ".join(f"cb[{c}] * x{c}" for c in range(rank)),
        coef=", ".join(f"two * q[{c}]" for c in range(rank)) + ",")


@cache
def _kernel(rank: int):  # noqa: ANN202 - returns a numba dispatcher
    """Compile (once per process and rank, lazily) the pass for q/k padded to ``rank``."""
    from numba import njit

    jit = njit(inline="always", error_model="numpy", fastmath=_FASTMATH, boundscheck=False)
    spans: dict = {"np": np}
    exec(compile(_span_source(rank), f"<distance_pass rank {rank}>", "exec"), spans)  # noqa: S102
    row_span, pair_span, terms = (jit(spans[name]) for name in ("row_span", "pair_span",
                                                                 "terms"))

    @jit
    def nearest(kt, kk, coef, lo, hi, want, row, values, index):  # noqa: ANN001,ANN202
        """Set row[j] for the ``want`` smallest d_j, j in [lo, hi) (insertion; ties: low j)."""
        size = 0
        for j in range(lo, hi):
            d = kk[j]
            for c in range(len(coef)):
                d += coef[c] * kt[c, j]
            if size < want:
                slot = size
                size += 1
            elif d < values[want - 1]:
                slot = want - 1
            else:
                continue
            while slot > 0 and values[slot - 1] > d:
                values[slot] = values[slot - 1]
                index[slot] = index[slot - 1]
                slot -= 1
            values[slot] = d
            index[slot] = j
        for s in range(size):
            row[index[s]] = 1

    @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FASTMATH, boundscheck=False)
    def run(q, kt, kk, sq_thresholds, first, count, floor, out):  # noqa: ANN001,ANN202
        """q (H, n, r), kt (H, r, m), kk (H, m), sq_thresholds (H,), first/count/floor (n,)
        → out (H, n, m) uint8 (every entry written)."""
        heads, n = q.shape[0], q.shape[1]
        values = np.empty(max(1, floor.max()) if n else 1, np.float32)
        index = np.empty(values.shape[0], np.int64)
        for h in range(heads):
            kth, kkh, t2 = kt[h], kk[h], sq_thresholds[h]
            for a in range(0, n, 2):
                b = min(a + 1, n - 1)  # an odd last row is paired with itself
                ca, ta = terms(q[h, a], t2)
                cb, tb = terms(q[h, b], t2)
                row_a, row_b = out[h, a], out[h, b]
                lo_a, lo_b = first[a], first[b]
                hi_a, hi_b = lo_a + count[a], lo_b + count[b]
                row_a[:lo_a] = 0
                row_a[hi_a:] = 0
                row_b[:lo_b] = 0
                row_b[hi_b:] = 0
                lo, hi = max(lo_a, lo_b), min(hi_a, hi_b)  # the keys both rows may see
                if lo >= hi:
                    lo = hi = lo_a
                kept_a, kept_b = pair_span(kth, kkh, ca, cb, ta, tb, lo, hi, row_a, row_b)
                kept_a += row_span(kth, kkh, ca, ta, lo_a, lo, row_a)
                kept_a += row_span(kth, kkh, ca, ta, hi, hi_a, row_a)
                kept_b += row_span(kth, kkh, cb, tb, lo_b, max(lo_b, min(lo, hi_b)), row_b)
                kept_b += row_span(kth, kkh, cb, tb, max(lo_b, hi), hi_b, row_b)
                if kept_a < floor[a]:
                    nearest(kth, kkh, ca, lo_a, hi_a, floor[a], row_a, values, index)
                if b != a and kept_b < floor[b]:
                    nearest(kth, kkh, cb, lo_b, hi_b, floor[b], row_b, values, index)

    return run


@cache
def _pool(workers: int) -> ThreadPoolExecutor:
    """Worker threads for head chunks, created on first use (the pass releases the GIL)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sparsefinder-distance")


def applies(q: Tensor, k: Tensor) -> bool:
    """Whether the compiled pass takes these projected vectors (CPU float32, rank ≤ 8, and
    numba importable); otherwise the callers' tensor ops run."""
    if q.device.type != "cpu" or q.dtype != torch.float32 or k.dtype != torch.float32:
        return False
    if q.shape[-1] > MAX_RANK or q.dim() != 3:
        return False
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def threshold_pass(q: Tensor, k: Tensor, sq_thresholds: Tensor, *, causal: bool = False,
                   sliding_window: int | None = None, floor: Tensor | None = None) -> Tensor:
    """bool (heads, n, m): pair (i, j) of head h kept iff ``‖q_i − k_j‖² ≤ sq_thresholds[h]``
    and j is allowed (causal / sliding window), or j is among row i's ``floor[i]`` nearest
    allowed keys (``floor`` int (n,), at most the row's allowed keys; None: no floor).

    The caller checks :func:`applies` first."""
    heads, n, rank = q.shape
    m = k.shape[1]
    padded = next(size for size in _RANKS if rank <= size)
    pad = padded - rank
    q8 = torch.nn.functional.pad(q, (0, pad)) if pad else q
    k8 = torch.nn.functional.pad(k, (0, pad)) if pad else k
    q8 = q8.contiguous()
    kt = k8.transpose(1, 2).contiguous()
    kk = k.pow(2).sum(-1).contiguous()
    first, count = allowed_key_range(n, m, causal=causal, sliding_window=sliding_window)
    floors = (torch.zeros(n, dtype=torch.int64) if floor is None
              else floor.to(torch.int64).expand(n).contiguous())
    t2 = sq_thresholds.to(torch.float32).contiguous()
    out = torch.empty(heads, n, m, dtype=torch.bool)
    arrays = [q8.numpy(), kt.numpy(), kk.numpy(), t2.numpy()]
    rows = [first.numpy(), count.numpy(), floors.numpy()]
    target = out.view(torch.uint8).numpy()
    kernel = _kernel(padded)
    workers = min(torch.get_num_threads(), os.cpu_count() or 1, heads)
    if workers <= 1 or heads * n * m < _SPLIT_MIN_PAIRS:
        kernel(*arrays, *rows, target)
        return out
    bounds = np.linspace(0, heads, workers + 1).astype(int)
    chunks = [(slice(a, b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    jobs = [_pool(workers - 1).submit(kernel, *(x[s] for x in arrays), *rows, target[s])
            for s in chunks[1:]]
    kernel(*(x[chunks[0]] for x in arrays), *rows, target[chunks[0]])
    for job in jobs:
        job.result()
    return out
