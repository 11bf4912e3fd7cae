"""The scorer's two reads of a prediction, each one compiled pass (the CPU path).

Why: :class:`~sparsefinder.metrics.scorer.Scorer` needs, per head, how many pairs a
prediction keeps among the allowed ones, its 16 × 16 tiles (block recall), and its bits at
the gold edges. In tensor ops that is an AND with the allowed pairs (a copy of the whole
``(heads, n, m)`` mask on a decoder), a popcount, a tiling pass, a gather into a bool array
the size of the edge list, an int32 cumulative sum over it for the misses of each row and a
float64 one over the missed probabilities: on a 1 B decoder at 2048 tokens, most of a
slider move. Here:

- :func:`count_kept` reads each row's allowed run once (:func:`~sparsefinder.attention.masks.
  allowed_key_range`), 16 keys at a time as two 64-bit words, and adds the kept pairs and the
  16-tiles at once; nothing outside the run is read, so no AND is made;
- :func:`read_edges` loops over the gold edges of each row (listed once, row-major, cut into
  rows by ``row_ptr``) and sums, per head, the missed edges ``|G \\ Ĝ|`` (so the hits, for
  recall and precision), the rows with at least one miss (the exact fraction is the other
  rows) and the missed probability mass (the mass recall is ``1 − lost / mass``), without
  any temporary.

Integer counts and tiles equal the tensor path's exactly; the lost mass is a float64 sum
taken edge by edge instead of by differences of a cumulative sum (the two agree to ~1e-15
relative). Compilation happens on the first call (about a second; cached on disk where numba
can), never at import.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch
from torch import Tensor

#: Keys per tile of :func:`count_kept` (the scorer's smallest block).
TILE = 16


@cache
def _kernels():  # noqa: ANN202 - returns two numba dispatchers
    """Compile (once per process, lazily) both passes."""
    from numba import njit

    @njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
    def read(bits, cells, row_ptr, probs, rows_per_head, missed, inexact, lost):  # noqa: ANN001,ANN202
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

    @njit(inline="always", error_model="numpy", boundscheck=False)
    def bytes_of(row, lo, hi, tile_row):  # noqa: ANN001,ANN202
        """Kept pairs of row[lo:hi] (inside one tile), byte by byte; marks the tile."""
        got = 0
        for j in range(lo, hi):
            got += row[j]
        if got:
            tile_row[lo // TILE] = 1
        return got

    @njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
    def count(mask, words, first, run, kept, tiles):  # noqa: ANN001,ANN202
        """mask uint8 (H, n, m); words: the same as uint64 (H, n, m / 8) or an empty array
        when a row is not whole words; first/run int64 (n,) → kept int64 (H,), tiles uint8
        (H, ceil(n/16), ceil(m/16))."""
        heads, n = mask.shape[0], mask.shape[1]
        spread = np.uint64(0x0101010101010101)  # byte sums of a word land in its top byte
        top = np.uint64(56)
        for h in range(heads):
            total = 0
            for i in range(n):
                lo, hi = first[i], first[i] + run[i]
                row, tile_row = mask[h, i], tiles[h, i // TILE]
                full_lo = (lo + TILE - 1) // TILE  # the whole tiles of the run:
                full_hi = hi // TILE  # full_lo … full_hi - 1
                if not words.shape[0] or full_lo >= full_hi:  # byte by byte, tile by tile
                    for block in range(lo // TILE, (hi + TILE - 1) // TILE):
                        total += bytes_of(row, max(lo, block * TILE),
                                          min(hi, block * TILE + TILE), tile_row)
                    continue
                # the partial tiles at either end byte by byte; the whole ones as two words
                # each (slices from 0: the loop vectorises)
                if lo < full_lo * TILE:
                    total += bytes_of(row, lo, full_lo * TILE, tile_row)
                if hi > full_hi * TILE:
                    total += bytes_of(row, full_hi * TILE, hi, tile_row)
                row_words = words[h, i, 2 * full_lo:2 * full_hi]
                row_tiles = tile_row[full_lo:full_hi]
                for block in range(full_hi - full_lo):
                    w = row_words[2 * block] + row_words[2 * block + 1]  # bytes <= 2
                    got = np.int64((w * spread) >> top)
                    total += got
                    row_tiles[block] |= np.uint8(got != 0)
            kept[h] = total

    return read, count


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
