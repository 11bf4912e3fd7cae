"""The scorer's read of a prediction at the gold edges, in one compiled pass (the CPU path).

Why: :class:`~sparsefinder.metrics.scorer.Scorer` reads a prediction only at the gold edges of
a layer (listed once, row-major, cut into rows by ``row_ptr``). In tensor ops that read is a
gather into a bool array the size of the edge list, an int32 cumulative sum over it for the
misses of each row, and a float64 one over the missed probabilities: three passes over
arrays of ~300 k entries per layer, most of a slider move's scoring time. Here one loop over
the rows reads each edge's bit and sums, per head,

- the missed edges ``|G \\ Ĝ|`` (so the hits, for recall and precision),
- the rows with at least one miss (the exact fraction is the other rows),
- the missed probability mass (the mass recall is ``1 − lost / mass``),

without any temporary. Integer counts equal the tensor path's exactly; the lost mass is a
float64 sum taken edge by edge instead of by differences of a cumulative sum (the two agree
to ~1e-15 relative). Compilation happens on the first call (under a second; cached on disk
where numba can), never at import.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch
from torch import Tensor


@cache
def _kernel():  # noqa: ANN202 - returns a numba dispatcher
    """Compile (once per process, lazily) the pass."""
    from numba import njit

    @njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
    def run(bits, cells, row_ptr, probs, rows_per_head, missed, inexact, lost):  # noqa: ANN001,ANN202
        """bits uint8 (cells,), cells int64 (E,) positions into bits, row_ptr int64
        (heads·n + 1,), probs float64 (E,) → missed / inexact int64 (heads,), lost float64."""
        heads = missed.shape[0]
        for h in range(heads):
            head_missed = 0
            head_inexact = 0
            head_lost = 0.0
            for r in range(h * rows_per_head, (h + 1) * rows_per_head):
                row_missed = 0
                for e in range(row_ptr[r], row_ptr[r + 1]):  # branch-free: misses are
                    miss = 1 - bits[cells[e]]  # as likely as hits on a poor predictor
                    row_missed += miss
                    head_lost += miss * probs[e]
                head_missed += row_missed
                head_inexact += row_missed > 0
            missed[h] = head_missed
            inexact[h] = head_inexact
            lost[h] = head_lost

    return run


def applies(pred: Tensor) -> bool:
    """Whether the compiled pass reads this prediction (a CPU tensor, numba importable)."""
    if pred.device.type != "cpu":
        return False
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def read_edges(pred: Tensor, cells: Tensor, row_ptr: Tensor, probs: Tensor,
               heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """(missed edges, rows with a miss, missed mass) per head: int64, int64, float64 (heads,).

    ``pred`` is the contiguous bool prediction (or one head's mask shared by all heads),
    ``cells`` each gold edge's position in it, ``row_ptr`` the edges' CSR row offsets over
    ``heads`` heads, ``probs`` their float64 probabilities."""
    missed = np.zeros(heads, np.int64)
    inexact = np.zeros(heads, np.int64)
    lost = np.zeros(heads, np.float64)
    rows_per_head = (row_ptr.numel() - 1) // heads if heads else 0
    _kernel()(pred.reshape(-1).view(torch.uint8).numpy(), cells.numpy(), row_ptr.numpy(),
              probs.numpy(), rows_per_head, missed, inexact, lost)
    return torch.from_numpy(missed), torch.from_numpy(inexact), torch.from_numpy(lost)
