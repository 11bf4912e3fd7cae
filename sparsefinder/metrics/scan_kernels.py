"""The two compiled passes of :mod:`sparsefinder.metrics.scan` (see there for what they do).

A module of its own so that numba imports only when a pass first runs, and so that its
``cache=True`` kernels are defined in a file, where numba keeps them compiled between
processes (a kernel defined inside a function compiled again in every process).
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Keys per tile of ``count`` (the scorer's smallest block).
TILE = 16


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
            if full_lo >= full_hi:  # no whole tile: byte by byte, tile by tile
                for block in range(lo // TILE, (hi + TILE - 1) // TILE):
                    total += bytes_of(row, max(lo, block * TILE),
                                      min(hi, block * TILE + TILE), tile_row)
                continue
            # the partial tiles at either end byte by byte
            if lo < full_lo * TILE:
                total += bytes_of(row, lo, full_lo * TILE, tile_row)
            if hi > full_hi * TILE:
                total += bytes_of(row, full_hi * TILE, hi, tile_row)
            row_tiles = tile_row[full_lo:full_hi]
            if words.shape[0]:  # the whole tiles as two words each (slices from 0: the
                row_words = words[h, i, 2 * full_lo:2 * full_hi]  # loop vectorises)
                for block in range(full_hi - full_lo):
                    w = row_words[2 * block] + row_words[2 * block + 1]  # bytes <= 2
                    got = np.int64((w * spread) >> top)
                    total += got
                    row_tiles[block] |= np.uint8(got != 0)
                continue
            # rows not whole words (m not a multiple of 8: a 478-token text): each whole
            # tile's 16 bytes summed in a uint8 (<= 16), a fixed-length loop LLVM unrolls
            # (5-6x the speed of the byte loop with a branch per tile)
            for block in range(full_hi - full_lo):
                tile = row[(full_lo + block) * TILE:(full_lo + block + 1) * TILE]
                got8 = np.uint8(0)
                for j in range(TILE):
                    got8 += tile[j]
                total += np.int64(got8)
                row_tiles[block] |= np.uint8(got8 != 0)
        kept[h] = total
