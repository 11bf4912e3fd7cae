"""Block-sparse 1.5-entmax attention as one Triton kernel: the selected key blocks and single
keys of a query block are read once, their scores stay on chip, τ is solved there and the
output written.

Why a kernel: the tensor path (:mod:`sparsefinder.attention.block_sparse`) gathers every
selected key into a padded strip in memory, writes the scores, runs the solver's ~dozens of
kernels over them and reads them again for ``probs @ values``; on a GPU at long context that
traffic, not the arithmetic, made it slower than softmax. Here one program per (head, query
tile of ``BLOCK_M`` rows of a query block) loads its ``K`` selected key blocks (``K ≤ K_MAX``,
a power of two) and its ``G`` single keys (``extra_keys`` less those that repeat or lie in a
selected block, ``G ≤ G_MAX``, a power of two ≥ 16), computes the two score tiles
``BLOCK_M × K_MAX·block`` and ``BLOCK_M × G_MAX`` once, and solves over both

    Σ_j [z_j − τ]_+² = 1,   z = (x − max x)/2     (1.5-entmax, scores x = scaling · q·k)

by Newton's method from ``τ₀ = −1``: ``f(τ) = Σ [z − τ]_+² − 1`` is convex and decreasing,
``f(−1) ≥ 0`` since the maximum has ``z = 0``, so every step stays left of the root and the
iterates increase to it (no overshoot, no bracketing needed); ``N_ITER`` steps reach fp32
precision (each step at least halves the distance to the root once within ``[−1, 0]``).
Then ``p = [z − τ]_+²`` (renormalised against rounding) and ``p @ V`` on the same keys. A key
is in the support iff ``z > τ``, i.e. its score ``x > x* = max x + 2τ``: the row's threshold
in score units, which :func:`triton_block_sparse_rows` returns for the support certificate.

Register budget. At the default long-context selection (block 32, a band of 3 blocks →
``K_MAX`` 4, 448 single keys → ``G_MAX`` 512) a program holds ``BLOCK_M × (4·32 + 512)`` fp32
scores: 20 480 with a whole query block (``BLOCK_M`` 32), 80 per thread at 8 warps, and the
Newton loop keeps both score tiles live — past a thread's 255 registers. ``BLOCK_M`` 16
(``tl.dot``'s smallest tile) halves it (10 240 scores, 40 per thread at 8 warps); the price is
that the two query tiles of a block load its keys twice (the second read mostly from L2).
Compiled for sm_90 on a CPU (Triton 3.9's ptxas, head dim 64, fp16; ``python
benchmarks/kernel_resources.py``), ``BLOCK_M`` 16 at 8 warps takes 252 registers and no spill,
``BLOCK_M`` 32 spills at 8 and 16 warps; 4 warps spill from 4 096 scores on. Hence the
defaults: ``BLOCK_M = min(block, 16)``, ``num_warps`` 4 up to 2 048 scores, 8 up to 10 240,
then 16, and a rolled (not unrolled) Newton loop, which spills less with both tiles. The key
tiles go through shared memory for ``tl.dot``: 640 × 64 keys are 80 KiB in fp16, 160 KiB in
fp32; fp32 inputs (``tl.dot`` in IEEE fp32, no tensor cores; ``tf32=True`` trades precision
for them) spill heavily at this size, and head dim 128 spills in fp16 too: expect those to be
slow. None of this is timed: no GPU was at hand when it was written. Rows that add more
single keys than the rest (a selector's crowded blocks) run in launches of their own
``G_MAX`` (:func:`width_classes`), so their wider tiles do not widen every program. A launch
whose key tiles exceed the GPU's shared memory (compiled for sm_90: 1024 single keys in fp32,
2048 in fp16) is refused by Triton before it runs; its rows go to the tensor path.

The result is α-entmax restricted to the selected blocks and single keys, as the tensor
path's; with a support certificate
(:func:`~sparsefinder.attention.support_certificate.exact_block_sparse_entmax`,
``engine="triton"``) it is exact. Runs on a GPU; ``TRITON_INTERPRET=1`` runs the same kernel
on a CPU (slowly: for tests).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from torch import Tensor

from sparsefinder.attention.block_sparse import (
    block_sparse_rows,
    check_block_inputs,
    check_extra_keys,
    compact_single_keys,
    repair_block_graph,
)

#: Newton steps of the kernel's τ solve (see the module docstring).
N_ITER = 32
#: Smallest tile ``tl.dot`` multiplies (rows of the query tile, columns of a key tile).
MIN_TILE = 16


def import_triton(needs: str, instead: str) -> tuple[Any, Any]:
    """``(triton, triton.language)``, or an ImportError saying what ``needs`` it and what
    works without it (``instead``): triton is an optional dependency, imported on first use."""
    try:
        import triton
        import triton.language as tl
    except ImportError as error:
        raise ImportError(f"{needs} needs triton (`pip install triton`, part of PyTorch's CUDA "
                          f"wheels); {instead} needs nothing") from error
    return triton, tl


@cache
def _kernel() -> Any:
    """The Triton kernel, compiled (imported) on first use."""
    triton, tl = import_triton("the Triton block-sparse kernel",
                               "the tensor path sparsefinder.attention.block_sparse")

    @triton.jit
    def block_entmax15(q_ptr, k_ptr, v_ptr, slots_ptr, counts_ptr, rows_ptr, extra_ptr,
                       extra_counts_ptr, out_ptr, thresholds_ptr, n, nb, padded, scaling,
                       D: tl.constexpr, DV: tl.constexpr, BLOCK: tl.constexpr,
                       BLOCK_M: tl.constexpr, K_MAX: tl.constexpr, G_MAX: tl.constexpr,
                       CAUSAL: tl.constexpr, WINDOW: tl.constexpr, ITERS: tl.constexpr,
                       PRECISION: tl.constexpr, THRESHOLDS: tl.constexpr):
        tile = tl.program_id(0)  # (this launch's row) · BLOCK/BLOCK_M + query tile
        local = tile // (BLOCK // BLOCK_M)  # rows_ptr[local] = head · nb + query block
        row = tl.load(rows_ptr + local)
        head = row // nb
        query_pos = ((row % nb) * BLOCK + (tile % (BLOCK // BLOCK_M)) * BLOCK_M
                     + tl.arange(0, BLOCK_M))
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
        x = tl.dot(q, tl.trans(keys), input_precision=PRECISION).to(tl.float32) * scaling
        allowed = key_ok[None, :] & (query_pos < n)[:, None]
        ahead = key_pos[None, :] - query_pos[:, None]  # j − i
        if CAUSAL:
            allowed = allowed & (ahead <= 0)
        if WINDOW > 0:
            allowed = allowed & (ahead > -WINDOW) & (ahead < WINDOW)
        x = tl.where(allowed, x, float("-inf"))
        top = tl.max(x, 1)
        if G_MAX > 0:  # the single keys: a second tile, solved together with the first
            extra_slot = tl.arange(0, G_MAX)
            extra_pos = tl.load(extra_ptr + local * G_MAX + extra_slot)
            extra_ok = extra_slot < tl.load(extra_counts_ptr + local)
            extra_keys = tl.load(k_ptr + (head * padded + extra_pos[:, None]) * D
                                 + dims[None, :], mask=extra_ok[:, None], other=0.0)
            y = tl.dot(q, tl.trans(extra_keys), input_precision=PRECISION).to(tl.float32)
            extra_allowed = extra_ok[None, :] & (query_pos < n)[:, None]
            extra_ahead = extra_pos[None, :] - query_pos[:, None]
            if CAUSAL:
                extra_allowed = extra_allowed & (extra_ahead <= 0)
            if WINDOW > 0:
                extra_allowed = extra_allowed & (extra_ahead > -WINDOW) & (extra_ahead < WINDOW)
            y = tl.where(extra_allowed, y * scaling, float("-inf"))
            top = tl.maximum(top, tl.max(y, 1))
        top = tl.where(top == float("-inf"), 0.0, top)  # padding rows: all masked
        z = (x - top[:, None]) * 0.5
        if G_MAX > 0:
            w = (y - top[:, None]) * 0.5
        tau = tl.zeros([BLOCK_M], dtype=tl.float32) - 1.0
        for _ in range(ITERS):
            gap = tl.maximum(z - tau[:, None], 0.0)
            excess = tl.sum(gap * gap, 1) - 1.0
            slope = tl.sum(gap, 1)
            if G_MAX > 0:
                extra_gap = tl.maximum(w - tau[:, None], 0.0)
                excess += tl.sum(extra_gap * extra_gap, 1)
                slope += tl.sum(extra_gap, 1)
            tau = tau + excess / (2.0 * tl.maximum(slope, 1e-30))
        gap = tl.maximum(z - tau[:, None], 0.0)
        probs = gap * gap
        total = tl.sum(probs, 1)
        if G_MAX > 0:
            extra_gap = tl.maximum(w - tau[:, None], 0.0)
            extra_probs = extra_gap * extra_gap
            total += tl.sum(extra_probs, 1)
        norm = 1.0 / tl.maximum(total, 1e-30)
        values = tl.load(v_ptr + (head * padded + key_pos[:, None]) * DV + dims_v[None, :],
                         mask=key_ok[:, None], other=0.0)
        out = tl.dot((probs * norm[:, None]).to(values.dtype), values,
                     input_precision=PRECISION)
        if G_MAX > 0:
            extra_values = tl.load(v_ptr + (head * padded + extra_pos[:, None]) * DV
                                   + dims_v[None, :], mask=extra_ok[:, None], other=0.0)
            out += tl.dot((extra_probs * norm[:, None]).to(extra_values.dtype), extra_values,
                          input_precision=PRECISION)
        real = query_pos < n
        tl.store(out_ptr + (head * padded + query_pos[:, None]) * DV + dims_v[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=real[:, None])
        if THRESHOLDS:
            tl.store(thresholds_ptr + head * padded + query_pos, top + 2.0 * tau, mask=real)

    return block_entmax15


def _pow2(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


def width_classes(extra_keys: Tensor | None, selected: Tensor, heads: int, n: int,
                  block: int) -> list[tuple[Tensor, Tensor, Tensor, int]]:
    """The launches: rows grouped by how many single keys they add to their blocks, each
    group as (int32 row ids, int32 (rows, G_MAX) positions (the kept ones first, ascending;
    then 0), int32 counts, G_MAX), G_MAX the group's power of two (≥ 16, or 0 for rows that
    add none). Why groups: ``G_MAX`` sizes every program's score tile and registers, so one
    crowded block (``BlockKeySparsefinder.wide_keys``) would otherwise widen them all.
    Dropped, as the tensor path drops them: a repeat, and a key inside a selected block."""
    rows, nb = selected.shape
    extra = check_extra_keys(extra_keys, heads, nb, n, selected.device)
    if extra is None:
        none = selected.new_zeros(1, dtype=torch.int32)
        return [(torch.arange(rows, dtype=torch.int32, device=selected.device), none, none, 0)]
    single, counts = compact_single_keys(extra.view(rows, -1), selected, block)
    # log2 of each row's G_MAX: the bit length of count − 1 (≥ 16 keys), 0 for no key
    tiers = torch.frexp((counts - 1).clamp(min=MIN_TILE - 1).double()).exponent
    tiers = tiers.masked_fill_(counts == 0, 0)
    launches = []
    for tier in torch.unique(tiers).tolist():
        ids = (tiers == tier).nonzero()[:, 0]
        g_max = 1 << tier if tier else 0
        group = torch.nn.functional.pad(single[ids], (0, max(g_max - single.shape[1], 0)))
        launches.append((ids.to(torch.int32), group[:, :max(g_max, 1)].to(torch.int32)
                         .contiguous(), counts[ids].to(torch.int32), g_max))
    return launches


def default_num_warps(scores: int) -> int:
    """Warps for a program holding ``scores`` fp32 scores: the fewest that compiled without
    spills for sm_90 (the module docstring's register budget)."""
    return 4 if scores <= 2048 else 8 if scores <= 10240 else 16


def triton_block_sparse_entmax(query: Tensor, key: Tensor, value: Tensor, block_graph: Tensor,
                               block: int, **options: Any) -> Tensor:
    """1.5-entmax attention (heads, n, dv) on the selected key blocks and single keys, in one
    Triton kernel: the same result as
    :func:`~sparsefinder.attention.block_sparse.block_sparse_entmax` (same arguments; the
    options of :func:`triton_block_sparse_rows`)."""
    return triton_block_sparse_rows(query, key, value, block_graph, block,
                                    with_thresholds=False, **options)[0]


def triton_block_sparse_rows(
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
    extra_keys: Tensor | None = None,
    with_thresholds: bool = True,
    query_tile: int | None = None,
    num_warps: int | None = None,
    tf32: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """The kernel's output (heads, n, dv), the repaired block graph and each row's threshold
    ``x* = max x + 2τ`` in score units (float64 (heads, n); NaN without ``with_thresholds``),
    as :func:`~sparsefinder.attention.block_sparse.block_sparse_rows` returns them.

    ``block`` a power of two ≥ 16 (Triton's matrix tiles); ``extra_keys`` int64 (heads,
    query blocks, G) single keys; ``query_tile`` rows per program (a power of two in [16,
    block], default 16), ``num_warps`` (default :func:`default_num_warps`) and ``tf32``
    (fp32 products on tensor cores, less precise) tune the launch (module docstring)."""
    if block < MIN_TILE or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16 for the kernel, got {block}")
    query_tile = min(block, MIN_TILE) if query_tile is None else int(query_tile)
    if query_tile < MIN_TILE or query_tile > block or query_tile & (query_tile - 1):
        raise ValueError(f"query_tile must be a power of two in [16, block={block}], "
                         f"got {query_tile}")
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
    dims, dims_v = max(_pow2(d), MIN_TILE), max(_pow2(value.shape[-1]), MIN_TILE)

    def prepare(t: Tensor, width: int) -> Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[-1], 0, padded - n)).contiguous()

    q, k, v = prepare(query, dims), prepare(key, dims), prepare(value, dims_v)
    out = torch.empty(heads, padded, dims_v, dtype=value.dtype, device=value.device)
    thresholds = torch.full((heads, padded), torch.nan, dtype=torch.float32,
                            device=query.device)
    kernel = _kernel()  # first: without triton, the error that names the tensor path
    from triton.runtime.errors import OutOfResources

    too_wide = []
    for ids, extra, extra_counts, g_max in width_classes(extra_keys, selected, heads, n,
                                                         block):
        warps = default_num_warps(query_tile * (k_max * block + g_max)) if num_warps is None \
            else int(num_warps)
        try:
            kernel[(ids.numel() * (block // query_tile),)](
                q, k, v, slots, counts.contiguous(), ids, extra, extra_counts, out,
                thresholds, n, nb, padded, float(scaling), D=dims, DV=dims_v, BLOCK=block,
                BLOCK_M=query_tile, K_MAX=k_max, G_MAX=g_max, CAUSAL=bool(causal),
                WINDOW=int(sliding_window or 0), ITERS=N_ITER,
                PRECISION="tf32" if tf32 else "ieee", THRESHOLDS=bool(with_thresholds),
                num_warps=warps)
        except OutOfResources:  # this launch's key tiles exceed the GPU's shared memory
            too_wide.append(ids)
    out, thresholds = out[:, :n, :value.shape[-1]], thresholds[:, :n].double()
    if too_wide:
        _on_tensor_path(out, thresholds, torch.cat(too_wide).long(), query, key, value, graph,
                        block, scaling=scaling, causal=causal, sliding_window=sliding_window,
                        extra_keys=extra_keys, with_thresholds=with_thresholds)
    return out, graph, thresholds


def _on_tensor_path(out: Tensor, thresholds: Tensor, ids: Tensor, query: Tensor, key: Tensor,
                    value: Tensor, graph: Tensor, block: int, **options: Any) -> None:
    """Write into ``out`` (heads, n, dv) and ``thresholds`` (heads, n) the query blocks
    ``ids`` (``head · nb + query block``) as the tensor path computes them: the rows of the
    launches Triton refused for want of shared memory (module docstring), with the same
    result."""
    heads, n = out.shape[:2]
    nb = graph.shape[1]
    rest, _, rest_thresholds = block_sparse_rows(query, key, value, graph, block, alpha=1.5,
                                                 warn_empty=False, only=ids, **options)
    mine = torch.zeros(heads * nb, dtype=torch.bool, device=out.device)
    mine[ids] = True
    mine = mine.view(heads, nb).repeat_interleave(block, 1)[:, :n]
    out[mine] = rest[mine].to(out.dtype)
    thresholds[mine] = rest_thresholds[mine]
