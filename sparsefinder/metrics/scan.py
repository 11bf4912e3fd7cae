"""The scorer's two reads of a prediction, each one compiled pass (the CPU path).

Why: :class:`~sparsefinder.metrics.scorer.Scorer` needs, per head, how many pairs a
prediction keeps among the allowed ones, its 16 × 16 tiles (block recall), and its bits at
the gold edges. In tensor ops that is an AND with the allowed pairs (a copy of the whole
``(heads, n, m)`` mask on a decoder), a popcount, a tiling pass, a gather into a bool array
the size of the edge list, an int32 cumulative sum over it for the misses of each row and a
float64 one over the missed probabilities: on a 1 B decoder at 2048 tokens, most of a
slider move. Here:

- :func:`count_kept` reads each row's allowed run once (:func:`~sparsefinder.attention.masks.
  allowed_key_range`), 16 keys at a time (two 64-bit words, or 16 bytes), and adds the kept
  pairs and the 16-tiles at once; nothing outside the run is read, so no AND is made;
- :func:`read_edges` loops over the gold edges of each row (listed once, row-major, cut into
  rows by ``row_ptr``) and sums, per head, the missed edges ``|G \\ Ĝ|`` (so the hits, for
  recall and precision), the rows with at least one miss (the exact fraction is the other
  rows) and the missed probability mass (the mass recall is ``1 − lost / mass``), without
  any temporary.

Integer counts and tiles equal the tensor path's exactly; the lost mass is a float64 sum
taken edge by edge instead of by differences of a cumulative sum (the two agree to ~1e-15
relative). The kernels (:mod:`sparsefinder.metrics.scan_kernels`) compile on their first call
(about a second), once per machine (numba's on-disk cache), never at import.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch
from torch import Tensor

#: Keys per tile of :func:`count_kept` (the scorer's smallest block).
TILE = 16  # as scan_kernels.TILE (not imported from there: that would import numba)


@cache
def _kernels():  # noqa: ANN202 - returns two numba dispatchers
    """The passes (numba imported on first use; each compiles once per machine)."""
    from sparsefinder.metrics import scan_kernels

    return scan_kernels.read, scan_kernels.count


def applies(pred: Tensor) -> bool:
    """Whether the compiled passes read this prediction (a CPU tensor, numba importable)."""
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
    _kernels()[0](pred.reshape(-1).view(torch.uint8).numpy(), cells.numpy(), row_ptr.numpy(),
                  probs.numpy(), rows_per_head, missed, inexact, lost)
    return torch.from_numpy(missed), torch.from_numpy(inexact), torch.from_numpy(lost)


def count_kept(pred: Tensor, first: Tensor, run: Tensor) -> tuple[Tensor, Tensor]:
    """(kept pairs int64 (heads,), bool 16-tiles (heads, ⌈n/16⌉, ⌈m/16⌉)) of a bool
    (heads, n, m) prediction, counting row i's keys ``first[i] … first[i] + run[i] − 1`` only
    (its allowed run; pairs outside it are never read)."""
    pred = pred.contiguous()
    heads, n, m = pred.shape
    mask = pred.view(torch.uint8).numpy()
    words = (mask.view(np.uint64) if m % 8 == 0 and m and pred.storage_offset() % 8 == 0
             else np.zeros((0, 0, 0), np.uint64))
    kept = np.zeros(heads, np.int64)
    tiles = np.zeros((heads, -(-n // TILE), -(-m // TILE)), np.uint8)
    _kernels()[1](mask, words, first.to(torch.int64).numpy(), run.to(torch.int64).numpy(),
                  kept, tiles)
    return torch.from_numpy(kept), torch.from_numpy(tiles).view(torch.bool)
