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

import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np
import torch
from torch import Tensor

# Below this many scores a call is not split over threads (the hand-off costs ~50 µs).
_SPLIT_MIN_SCORES = 1 << 16


@cache
def _kernel():  # noqa: ANN202 - returns a numba dispatcher
    """The row kernel (:mod:`~sparsefinder.attention.entmax_row_kernel`), imported on first use:
    importing numba is not free, and most callers of this package never solve on a CPU."""
    from sparsefinder.attention.entmax_row_kernel import solve_rows

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
