"""The support certificate's exact check as one Triton kernel: each row's highest score over
the keys it may see but did not select, in one pass that never stores a score.

Why a kernel: the check (:func:`~sparsefinder.attention.support_certificate.unselected_max`)
reads every key of every row once — a full ``QKᵀ`` — but needs only a running maximum per
row. The tensor path writes each chunk of rows' scores and a selection mask to memory and
reads them back; at n = 32 768 on a GPU that is ~4 GiB of fp32 scores per head and a Python
loop over chunks. Here one program per (head, query block) keeps its ``BLOCK × D`` queries on
chip and walks the keys it may see (causal: up to its own block; a local layer: those its
window reaches) ``BLOCK_N`` at a time. A tile whose keys all lie in selected blocks is skipped
(they are in the support's solve already); any other tile's ``BLOCK × BLOCK_N`` scores are
computed, the selected blocks' keys and the query block's single keys masked out (a bitmap of
one bit per key for each query block, built once from ``extra_keys``), and folded into the
running maximum. The cost is that of the score half of
one attention pass, with neither a solver nor ``probs @ values``.

``TRITON_INTERPRET=1`` runs the same kernel on a CPU (slowly: for tests).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from torch import Tensor

from sparsefinder.attention.block_sparse import check_extra_keys, new_single_keys, num_blocks
from sparsefinder.attention.triton_block_sparse import MIN_TILE, import_triton

#: Keys per step of the kernel for 16-bit inputs, and for fp32 ones: compiled for sm_90 on a
#: CPU (``benchmarks/kernel_resources.py``, block 32, head dim 64, 4 warps), fp16 at 64 keys
#: takes 92 registers and no spill, fp32 spills from 64 keys on (no spill at 32). Untimed (no
#: GPU was at hand), so a parameter to tune there.
KEY_TILE = 64
KEY_TILE_FP32 = 32


@cache
def _kernel() -> Any:
    """The Triton kernel, compiled (imported) on first use."""
    triton, tl = import_triton("the Triton support check", "engine='torch'")

    @triton.jit
    def unselected_max(q_ptr, k_ptr, graph_ptr, bits_ptr, worst_ptr, n, nb, padded, scaling,
                       D: tl.constexpr, BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
                       CAUSAL: tl.constexpr, WINDOW: tl.constexpr, PRECISION: tl.constexpr):
        row = tl.program_id(0)  # head · nb + query block
        head = row // nb
        query_pos = (row % nb) * BLOCK + tl.arange(0, BLOCK)
        dims = tl.arange(0, D)
        q = tl.load(q_ptr + (head * padded + query_pos[:, None]) * D + dims[None, :])
        worst = tl.full([BLOCK], float("-inf"), tl.float32)
        first = 0
        last = n  # keys [first, last) some row of the block may see
        if CAUSAL:
            last = tl.minimum((row % nb) * BLOCK + BLOCK, n)
        if WINDOW > 0:
            first = tl.maximum((row % nb) * BLOCK - WINDOW + 1, 0) // BLOCK_N * BLOCK_N
            if not CAUSAL:
                last = tl.minimum((row % nb) * BLOCK + BLOCK - 1 + WINDOW, n)
        for start in range(first, last, BLOCK_N):
            key_pos = start + tl.arange(0, BLOCK_N)
            real = key_pos < n
            selected = tl.load(graph_ptr + row * nb + key_pos // BLOCK, mask=real, other=1)
            if tl.min(selected, 0) == 0:  # else every key of the tile is in a selected block
                keys = tl.load(k_ptr + (head * padded + key_pos[:, None]) * D + dims[None, :],
                               mask=real[:, None], other=0.0)
                x = tl.dot(q, tl.trans(keys), input_precision=PRECISION).to(tl.float32)
                bits = tl.load(bits_ptr + row * (nb * BLOCK // 8) + key_pos // 8, mask=real,
                               other=0)
                single = ((bits.to(tl.int32) >> (key_pos % 8)) & 1) != 0
                ok = (real & (selected == 0) & ~single)[None, :] & (query_pos < n)[:, None]
                ahead = key_pos[None, :] - query_pos[:, None]  # j − i
                if CAUSAL:
                    ok = ok & (ahead <= 0)
                if WINDOW > 0:
                    ok = ok & (ahead > -WINDOW) & (ahead < WINDOW)
                worst = tl.maximum(worst, tl.max(tl.where(ok, x * scaling, float("-inf")), 1))
        tl.store(worst_ptr + head * padded + query_pos, worst, mask=query_pos < n)

    return unselected_max


def default_num_warps(block: int, key_tile: int) -> int:
    """Warps for a ``block × key_tile`` score tile: 4 up to 4 096 scores, then 8."""
    return 4 if block * key_tile <= 4096 else 8


def single_key_bits(extra_keys: Tensor | None, graph: Tensor, n: int, block: int) -> Tensor:
    """uint8 (heads · nb, nb · block / 8): bit ``j % 8`` of byte ``j // 8`` of row (head,
    query block) is set iff key ``j`` is one of the single keys that query block adds to its
    selected blocks of ``graph`` (:func:`~sparsefinder.attention.block_sparse.new_single_keys`:
    each once, none inside a selected block, which the kernel masks already). One bit per key:
    48 MiB for 12 heads at n = 32 768 and block 32."""
    heads, nb, _ = graph.shape
    bits = torch.zeros(heads * nb, nb * block // 8, dtype=torch.uint8, device=graph.device)
    extra = check_extra_keys(extra_keys, heads, nb, n, graph.device)
    if extra is None:
        return bits
    extra = extra.view(heads * nb, -1)
    kept = new_single_keys(extra, graph.reshape(heads * nb, nb), block)
    value = torch.bitwise_left_shift(torch.ones_like(extra), extra % 8) * kept
    # distinct keys set distinct bits, so their sum is their OR
    return bits.scatter_add_(1, extra // 8, value.to(torch.uint8))


def triton_unselected_max(query: Tensor, key: Tensor, graph: Tensor, block: int, *,
                          scaling: float | None = None, extra_keys: Tensor | None = None,
                          causal: bool = False, sliding_window: int | None = None,
                          key_tile: int | None = None, tf32: bool = False) -> Tensor:
    """float32 (heads, n): what :func:`~sparsefinder.attention.support_certificate.
    unselected_max` computes (same arguments), in one kernel. ``block`` a power of two ≥ 16
    (Triton's matrix tiles); ``key_tile`` keys per step (a power of two ≥ 16; default
    :data:`KEY_TILE`, :data:`KEY_TILE_FP32` for fp32 inputs)."""
    if block < MIN_TILE or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16 for the kernel, got {block}")
    if key_tile is None:
        key_tile = KEY_TILE_FP32 if query.dtype == torch.float32 else KEY_TILE
    if key_tile < MIN_TILE or key_tile & (key_tile - 1):
        raise ValueError(f"key_tile must be a power of two >= 16, got {key_tile}")
    heads, n, d = query.shape
    nb = num_blocks(n, block)
    if tuple(graph.shape) != (heads, nb, nb):
        raise ValueError(f"graph must be (heads={heads}, {nb}, {nb}) for n={n} and "
                         f"block={block}, got {tuple(graph.shape)}")
    scaling = d ** -0.5 if scaling is None else scaling
    padded, dims = nb * block, max(1 << max(d - 1, 0).bit_length(), MIN_TILE)
    padded = -(-padded // key_tile) * key_tile  # whole key tiles: no load past the end

    def prepare(t: Tensor) -> Tensor:
        return torch.nn.functional.pad(t, (0, dims - d, 0, padded - n)).contiguous()

    worst = torch.empty(heads, padded, dtype=torch.float32, device=query.device)
    bits = single_key_bits(extra_keys, graph, n, block)
    _kernel()[(heads * nb,)](
        prepare(query), prepare(key), graph.to(torch.uint8).contiguous(), bits, worst, n, nb,
        padded, float(scaling), D=dims, BLOCK=block, BLOCK_N=key_tile, CAUSAL=bool(causal),
        WINDOW=int(sliding_window or 0), PRECISION="tf32" if tf32 else "ieee",
        num_warps=default_num_warps(block, key_tile))
    return worst[:, :n]
