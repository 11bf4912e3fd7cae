"""The distance test and the per-row floor in one compiled pass over the keys (the CPU path).

Why: a calibrated distance predictor (:class:`~.threshold_distance.ThresholdDistance`,
optionally under :class:`~.row_floor.RowFloor`) is the app's first screen, and in tensor ops it
writes, reads and compares a float32 ``(heads, n, m)`` block of partial distances per layer
(75 MB for 12 heads at n = 512), then counts each row's kept keys in another pass. Those passes
over memory, not the ``r``-term dot products, are its cost. Here one vectorised loop per
query row computes

    d_ij = ‖k_j‖² − 2 q_i·k_j  and keeps  d_ij ≤ t_h − ‖q_i‖²   (⇔ ‖q_i − k_j‖² ≤ t_h),

writes the row's mask and counts it in one loop; a row keeping fewer than its
floor ``f_i`` keys then gets its ``f_i`` smallest ``d_ij`` (its nearest keys): the row's
distances in one vectorised pass, a bound that rules out all but a few of them, and an
insertion pass over those few. Only each row's allowed keys (a
contiguous run, :func:`~sparsefinder.attention.masks.allowed_key_range`) are tested or chosen;
every other pair is written False.

The loops are written out for the vectors' own rank ``r`` (up to :data:`MAX_RANK`).
Larger ranks, other dtypes and other devices take the tensor-op path of the callers.

**Precision.** float32 as the tensor path, but the ``r`` products are summed in another order:
a pair whose distance lies within a few ulp of its threshold may be decided the other way
(on random data, ~1 pair in 10⁷). Ties among a short row's nearest keys go to the lower key
index. The kernels of a rank compile on its first call (about five seconds), once per machine
(:mod:`sparsefinder.jit` keeps them in the user cache), never at import.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np
import torch
from torch import Tensor

from sparsefinder.attention.masks import allowed_key_range

#: The largest projected rank the compiled pass takes (the bundled calibrated projections
#: have 11 coordinates: rank 9 plus the two augmentation coordinates).
MAX_RANK = 12
# Below this many pairs a call is not split over threads (the hand-off costs ~50 µs).
_SPLIT_MIN_PAIRS = 1 << 20

# The kernels for one rank, as a module (imported from a file by sparsefinder.jit, so numba
# compiles it once per machine). LLVM vectorises a key loop only when the r products are one
# unrolled expression over r key rows held in locals (a loop over r inside it, or coefficients
# read from an array, ran 4-6x slower), so the source is written out for each rank: {k} lists
# the key rows, {a} the sum. One query row at a time: pairing two rows on one read of the keys
# was no faster at rank 8 and slower at rank 11 (registers spill). No "reassoc" in fastmath:
# each d_ij is summed in one order whatever the vector width; no "nnan": NaN compares as False.
_SOURCE = """\
import numpy as np
from numba import njit

_FAST = {{"nsz", "contract"}}
_INLINE = njit(inline="always", error_model="numpy", fastmath=_FAST, boundscheck=False)


@_INLINE
def row_span(kt, kk, coef, t, lo, hi, row):
    {k} = {k_rows}
    base, out = kk[lo:hi], row[lo:hi]
    kept = 0
    for j in range(hi - lo):
        keep = np.uint8(base[j] + {a} <= t)
        out[j] = keep
        kept += np.int32(keep)
    return kept


@_INLINE
def distances(kt, kk, coef, lo, hi, out):
    {k} = {k_rows}
    base, dist = kk[lo:hi], out[:hi - lo]
    for j in range(hi - lo):
        dist[j] = base[j] + {a}


@_INLINE
def terms(q, t2):
    two = np.float32(-2.0)
    norm = np.float32(0.0)
    for c in range(q.shape[0]):
        norm += q[c] * q[c]
    return ({coef}), t2 - norm


@_INLINE
def insert(d, j, want, size, values, index):
    # Keep values[:size] the smallest distances seen, ascending (ties: the earlier j).
    if size < want:
        slot = size
        size += 1
    elif d < values[want - 1]:
        slot = want - 1
    else:
        return size
    while slot > 0 and values[slot - 1] > d:
        values[slot] = values[slot - 1]
        index[slot] = index[slot - 1]
        slot -= 1
    values[slot] = d
    index[slot] = j
    return size


@_INLINE
def nearest(kt, kk, coef, lo, hi, want, row, dist, values, index, spots):
    # Set row[j] for the want smallest d_j, j in [lo, hi) (ties: the lower j; want <= hi - lo).
    # The row's distances in one vectorised pass. Then a bound: the minima of want disjoint
    # blocks are want distinct entries, so the want-th smallest is at most their largest; only
    # entries under it can be chosen (about 3·want of them), and only those reach the
    # branchy insertion pass, which costs a mispredicted branch or two per entry it sees.
    distances(kt, kk, coef, lo, hi, dist)
    span = hi - lo
    width = span // want
    bound = np.float32(-np.inf)
    for b in range(want):
        least = np.float32(np.inf)
        for j in range(b * width, span if b == want - 1 else (b + 1) * width):
            least = min(least, dist[j])
        bound = max(bound, least)
    found = 0
    for j in range(span):  # the candidates' positions, compacted without a branch
        spots[found] = j
        found += np.int32(dist[j] <= bound)
    size = 0
    for c in range(found):
        size = insert(dist[spots[c]], lo + spots[c], want, size, values, index)
    if size < want:  # fewer than want comparable (non-NaN) distances: every entry, in order
        size = 0
        for j in range(span):
            size = insert(dist[j], lo + j, want, size, values, index)
    for s in range(size):
        row[index[s]] = 1


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FAST, boundscheck=False)
def run(q, kt, kk, sq_thresholds, first, count, floor, out):
    # q (H, n, r), kt (H, r, m), kk (H, m), sq_thresholds (H,), first/count/floor (n,)
    # -> out (H, n, m) uint8 (every entry written).
    heads, n, m = q.shape[0], q.shape[1], kt.shape[2]
    values = np.empty(max(1, floor.max()) if n else 1, np.float32)
    index = np.empty(values.shape[0], np.int64)
    dist = np.empty(max(1, m), np.float32)
    spots = np.empty(max(1, m), np.int32)
    for h in range(heads):
        kth, kkh, t2 = kt[h], kk[h], sq_thresholds[h]
        for i in range(n):
            coef, t = terms(q[h, i], t2)
            row = out[h, i]
            lo, hi = first[i], first[i] + count[i]
            row[:lo] = 0
            row[hi:] = 0
            if row_span(kth, kkh, coef, t, lo, hi, row) < floor[i]:
                nearest(kth, kkh, coef, lo, hi, floor[i], row, dist, values, index, spots)
"""


def _source(rank: int) -> str:
    """:data:`_SOURCE` written out for ``rank``."""
    names = ", ".join(f"k{c}" for c in range(rank))
    return _SOURCE.format(
        k=names + ("," if rank == 1 else ""),
        k_rows=", ".join(f"kt[{c}, lo:hi]" for c in range(rank)) + ("," if rank == 1 else ""),
        a=" + ".join(f"coef[{c}] * k{c}[j]" for c in range(rank)),
        coef=", ".join(f"two * q[{c}]" for c in range(rank)) + ",")


@cache
def _kernel(rank: int):  # noqa: ANN202 - returns a numba dispatcher
    """The pass for rank-``rank`` vectors (its module generated and imported once per process;
    compiled once per machine, on first use)."""
    from sparsefinder.jit import generated_module

    return generated_module(f"distance_pass_r{rank}", _source(rank)).run


@cache
def _pool(workers: int) -> ThreadPoolExecutor:
    """Worker threads for head chunks, created on first use (the pass releases the GIL)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sparsefinder-distance")


def applies(q: Tensor, k: Tensor) -> bool:
    """Whether the compiled pass takes these projected vectors (CPU float32, rank ≤
    :data:`MAX_RANK`, and numba importable); otherwise the callers' tensor ops run."""
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
    qc = q.contiguous()
    kt = k.transpose(1, 2).contiguous()
    kk = k.pow(2).sum(-1).contiguous()
    first, count = allowed_key_range(n, m, causal=causal, sliding_window=sliding_window)
    floors = (torch.zeros(n, dtype=torch.int64) if floor is None
              else floor.to(torch.int64).expand(n).contiguous())
    t2 = sq_thresholds.to(torch.float32).contiguous()
    out = torch.empty(heads, n, m, dtype=torch.bool)
    arrays = [qc.numpy(), kt.numpy(), kk.numpy(), t2.numpy()]
    rows = [first.numpy(), count.numpy(), floors.numpy()]
    target = out.view(torch.uint8).numpy()
    kernel = _kernel(rank)
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
