"""Block-sparse 1.5-entmax attention as one Triton kernel: the selected key blocks of a query
block are read once, their scores stay on chip, τ is solved there and the output written.

Why a kernel: the tensor path (:mod:`sparsefinder.attention.block_sparse`) gathers every
selected key into a padded strip in memory, writes the scores, runs the solver's ~dozens of
kernels over them and reads them again for ``probs @ values``; on a GPU at long context that
traffic, not the arithmetic, made it slower than softmax. Here one program per (head, query
block) loads its ``K`` selected key blocks (``K ≤ K_MAX``, a power of two), computes the
``block × K·block`` scores once, and solves

    Σ_j [z_j − τ]_+² = 1,   z = (x − max x)/2     (1.5-entmax, scores x = scaling · q·k)

by Newton's method from ``τ₀ = −1``: ``f(τ) = Σ [z − τ]_+² − 1`` is convex and decreasing,
``f(−1) ≥ 0`` since the maximum has ``z = 0``, so every step stays left of the root and the
iterates increase to it (no overshoot, no bracketing needed); ``N_ITER`` steps reach fp32
precision (each step at least halves the distance to the root once within ``[−1, 0]``).
Then ``p = [z − τ]_+²`` (renormalised against rounding) and ``p @ V`` on the same keys.

The result is α-entmax restricted to the selected blocks, as the tensor path's; with a
support certificate (:mod:`~sparsefinder.attention.support_certificate`) it is exact. Runs on
a GPU; ``TRITON_INTERPRET=1`` runs the same kernel on a CPU (slowly: for tests).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from torch import Tensor

from sparsefinder.attention.block_sparse import check_block_inputs, repair_block_graph

#: Newton steps of the kernel's τ solve (see the module docstring).
N_ITER = 32


@cache
def _kernel() -> Any:
    """The Triton kernel, compiled (imported) on first use: triton is an optional dependency."""
    try:
        import triton
        import triton.language as tl
    except ImportError as error:
        raise ImportError("the Triton block-sparse kernel needs triton (`pip install triton`, "
                          "part of PyTorch's CUDA wheels); the tensor path "
                          "sparsefinder.attention.block_sparse needs nothing") from error

    @triton.jit
    def block_entmax15(q_ptr, k_ptr, v_ptr, slots_ptr, counts_ptr, out_ptr, n, nb, padded,
                       scaling, D: tl.constexpr, DV: tl.constexpr, BLOCK: tl.constexpr,
                       K_MAX: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                       ITERS: tl.constexpr):
        row = tl.program_id(0)  # head · nb + query block
        head = row // nb
        query_pos = (row % nb) * BLOCK + tl.arange(0, BLOCK)
        dims = tl.arange(0, D)
        dims_v = tl.arange(0, DV)
        q = tl.load(q_ptr + (head * padded + query_pos[:, None]) * D + dims[None, :])
        count = tl.load(counts_ptr + row)
        slot = tl.arange(0, K_MAX)
        blocks = tl.load(slots_ptr + row * K_MAX + slot)
        key_pos = tl.reshape(blocks[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :],
                             (K_MAX * BLOCK,))
        key_ok = tl.reshape((slot < count)[:, None] & (tl.arange(0, BLOCK) < BLOCK)[None, :],
                            (K_MAX * BLOCK,)) & (key_pos < n)
        keys = tl.load(k_ptr + (head * padded + key_pos[:, None]) * D + dims[None, :],
                       mask=key_ok[:, None], other=0.0)
        x = tl.dot(q, tl.trans(keys)).to(tl.float32) * scaling  # (BLOCK, K_MAX·BLOCK)
        allowed = key_ok[None, :] & (query_pos < n)[:, None]
        ahead = key_pos[None, :] - query_pos[:, None]  # j − i
        if CAUSAL:
            allowed = allowed & (ahead <= 0)
        if WINDOW > 0:
            allowed = allowed & (ahead > -WINDOW) & (ahead < WINDOW)
        x = tl.where(allowed, x, float("-inf"))
        top = tl.max(x, 1)
        top = tl.where(top == float("-inf"), 0.0, top)  # padding rows: all masked
        z = (x - top[:, None]) * 0.5
        tau = tl.zeros([BLOCK], dtype=tl.float32) - 1.0
        for _ in tl.static_range(ITERS):
            gap = tl.maximum(z - tau[:, None], 0.0)
            excess = tl.sum(gap * gap, 1) - 1.0
            slope = tl.maximum(tl.sum(gap, 1), 1e-30)
            tau = tau + excess / (2.0 * slope)
        gap = tl.maximum(z - tau[:, None], 0.0)
        probs = gap * gap
        probs = probs / tl.maximum(tl.sum(probs, 1), 1e-30)[:, None]
        values = tl.load(v_ptr + (head * padded + key_pos[:, None]) * DV + dims_v[None, :],
                         mask=key_ok[:, None], other=0.0)
        out = tl.dot(probs.to(values.dtype), values)
        tl.store(out_ptr + (head * padded + query_pos[:, None]) * DV + dims_v[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=(query_pos < n)[:, None])

    return block_entmax15


def _pow2(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


def triton_block_sparse_entmax(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    block_graph: Tensor,
    block: int,
    *,
    scaling: float | None = None,
    causal: bool = False,
    sliding_window: int | None = None,
    warn_empty: bool = True,
) -> Tensor:
    """1.5-entmax attention (heads, n, dv) on the selected key blocks, in one Triton kernel:
    the same result as :func:`~sparsefinder.attention.block_sparse.block_sparse_entmax`
    without ``extra_keys`` (single keys are not read by this kernel). ``block`` a power of two
    ≥ 16 (Triton's matrix tiles)."""
    if block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16 for the kernel, got {block}")
    heads, n, d, nb = check_block_inputs(query, key, value, block_graph, block, sliding_window)
    scaling = d ** -0.5 if scaling is None else scaling
    graph = repair_block_graph(block_graph.to(query.device), causal=causal, warn=warn_empty,
                               sliding_window=sliding_window, n=n, block=block)
    rows = heads * nb
    selected = graph.view(rows, nb)
    counts = selected.sum(-1).to(torch.int32)
    k_max = _pow2(int(counts.max()))
    order = torch.sort(selected.to(torch.int8), dim=-1, descending=True, stable=True).indices
    slots = torch.nn.functional.pad(order, (0, max(k_max - nb, 0)))[:, :k_max]
    slots = slots.to(torch.int32).contiguous()
    padded = nb * block
    dims, dims_v = max(_pow2(d), 16), max(_pow2(value.shape[-1]), 16)

    def prepare(t: Tensor, width: int) -> Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[-1], 0, padded - n)).contiguous()

    q, k, v = prepare(query, dims), prepare(key, dims), prepare(value, dims_v)
    out = torch.empty(heads, padded, dims_v, dtype=value.dtype, device=value.device)
    _kernel()[(rows,)](q, k, v, slots, counts.contiguous(), out, n, nb, padded, float(scaling),
                       D=dims, DV=dims_v, BLOCK=block, K_MAX=k_max, CAUSAL=bool(causal),
                       WINDOW=int(sliding_window or 0), ITERS=N_ITER)
    return out[:, :n, :value.shape[-1]]
