"""α-entmax over attention scores, with exactly-zero probabilities outside ``allowed``.

The public entry point is :func:`entmax_normalize`. It dispatches on α exactly as the
``entmax`` package suggests: α=1 → softmax (dense), α=1.5 → 1.5-entmax, α=2 → sparsemax,
any other α>1 → ``entmax_bisect``.

Why not just call the package for α=1.5 and α=2: its functions sort every row (``torch.sort``
over n keys per query), which on a CPU costs ~6× the whole rest of a forward pass at n=512.
:func:`entmax15_fast` and :func:`sparsemax_fast` compute the *same* functions without sorting.

The solvers: :mod:`sparsefinder.attention.entmax_rows` (compiled, one row at a time, the CPU
default) and :mod:`sparsefinder.attention.entmax_blocks` (tensor ops, any device), both
certified exact; rows they cannot certify go to the package's sort-based functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from entmax import entmax15, entmax_bisect, sparsemax
from torch import Tensor

from sparsefinder.attention import entmax_rows
from sparsefinder.attention.entmax_blocks import (
    _BLOCK,
    _BOUND_STEPS,
    _MAX_ITER,
    SolverStats,
    _block_bound,
    _gather_blocks,
    _solve_blocks,
)

# A finite "minus infinity": entmax's sort-and-cumsum threshold algorithm turns -inf into NaN,
# and any score this far below the row maximum is outside every α>1 support anyway.
_MASKED = -1e9


# Below this many scores the sort-based functions are cheaper than the solver's ~200 small
# operations (measured break-even: ~35K scores, e.g. 12 heads × 54²), so entmax_normalize
# uses them there.
_FAST_MIN_SCORES = 1 << 15


# On a GPU the block solver's ~200 small kernels and the syncs that size its gathers cost
# ~3 ms a call whatever the size, while the package's sort is a few large kernels: the sort
# is faster for rows shorter than this many keys (measured on an H200, 12 heads of real
# q/k: sort 1.27 vs blocks 3.18 ms at n = 1024, 4.40 vs 2.64 ms at 2048;
# ``benchmarks/gpu_solver.py``), so ``auto`` on CUDA sorts below it.
_GPU_SORT_BELOW_KEYS = 2048


#: Solvers: ``rows`` — the compiled per-row solver (:mod:`sparsefinder.attention.entmax_rows`, CPU,
#: needs numba); ``blocks`` — the tensor-op block solver below (any device); ``auto`` —
#: rows where it applies, else blocks (through :func:`entmax_normalize`, CUDA
#: rows shorter than ``_GPU_SORT_BELOW_KEYS`` go to the package's sort, which is faster there).
ENGINES = ("auto", "rows", "blocks")


_reference_mode: ContextVar[bool] = ContextVar("sparsefinder_entmax_reference", default=False)


_engine: ContextVar[str] = ContextVar("sparsefinder_entmax_engine", default="auto")


@contextmanager
def reference_mode(enabled: bool = True) -> Iterator[None]:
    """Within this block, α=1.5 and α=2 use the ``entmax`` package's sort-based functions.

    For benchmarks and tests that compare the fast solver against the reference.
    """
    token = _reference_mode.set(enabled)
    try:
        yield
    finally:
        _reference_mode.reset(token)


@contextmanager
def solver_engine(engine: str) -> Iterator[None]:
    """Within this block, the fast functions use ``engine`` (:data:`ENGINES`) unless a call
    names one. For benchmarks and tests that compare the two solvers."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    token = _engine.set(engine)
    try:
        yield
    finally:
        _engine.reset(token)




def validate_alpha(alpha: object) -> float:
    """Return α as a float or raise a ValueError that says what is accepted."""
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise ValueError(
            f"alpha must be a number >= 1 (1 = softmax, 1.5 = entmax15), got {alpha!r}"
        )
    value = float(alpha)
    if not math.isfinite(value) or value < 1.0:
        raise ValueError(
            f"alpha must be >= 1 (1 = softmax, 1.5 = entmax15, 2 = sparsemax), got {alpha!r}"
        )
    return value


def _use_rows(engine: str | None, x: Tensor) -> bool:
    """Whether ``x`` goes to the compiled row solver (:mod:`sparsefinder.attention.entmax_rows`)."""
    engine = engine or _engine.get()
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "blocks":
        return False
    usable = x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
    if engine == "rows" and not (usable and entmax_rows.available()):
        raise ValueError("engine='rows' needs float32/float64 scores on the CPU and the numba "
                         "package (pip install numba); use engine='auto' or 'blocks'")
    return usable and entmax_rows.available()


def _fast_rows(
    x: Tensor, squared: bool, max_iter: int, stats: SolverStats | None, block: int
) -> Tensor:
    """The row solver on contiguous CPU (rows, n) ``x``, the fallback on its open rows."""
    probs, certified, evaluations, kept = entmax_rows.solve_rows(
        x, squared, max_iter, block, _BOUND_STEPS)
    if stats is not None:
        stats.evaluations += int(evaluations.sum())
    kept_fraction = float(kept.sum()) / (x.shape[0] * -(-x.shape[1] // block))
    return _fall_back_open_rows(x, probs, certified, squared, stats, kept_fraction)


def _fall_back_open_rows(
    x: Tensor, probs: Tensor, certified: Tensor, squared: bool, stats: SolverStats | None,
    kept_fraction: float,
) -> Tensor:
    """Both solvers' last step: the package on the rows not certified, and the counters."""
    open_rows = (~certified).nonzero().squeeze(1)
    if stats is not None:
        stats.calls += 1
        stats.rows += x.shape[0]
        stats.fallback_rows += int(open_rows.numel())
        stats.block_fraction_sum += kept_fraction
    if open_rows.numel():
        probs[open_rows] = _fallback(x[open_rows], entmax15 if squared else sparsemax)
    return probs


def _fast(
    scores: Tensor,
    squared: bool,
    max_iter: int,
    stats: SolverStats | None,
    block: int,
    engine: str | None = None,
) -> Tensor:
    """Shared body of :func:`entmax15_fast` and :func:`sparsemax_fast` (last axis)."""
    if scores.numel() == 0:
        return torch.empty_like(scores)
    shape = scores.shape
    n = shape[-1]
    compute_dtype = torch.promote_types(scores.dtype, torch.float32)
    x = scores.reshape(-1, n).to(compute_dtype).contiguous()
    rows = x.shape[0]
    block = max(1, min(block, n))
    if _use_rows(engine, x):
        return _fast_rows(x, squared, max_iter, stats, block).to(scores.dtype).view(shape)
    row_max, zb, lo = _block_bound(x, squared, block)
    brow, z, top, where_to = _gather_blocks(x, row_max, zb, lo, squared, block)
    tau, certified = _solve_blocks(brow, z, top, lo.squeeze(1), squared, max_iter, stats)
    values = z.sub_(tau.index_select(0, brow).unsqueeze(1)).clamp_(min=0)
    if squared:
        values.square_()
    # Step 4: everything outside the kept blocks is exactly 0.
    if n % block == 0:  # where_to: block ids, blocks tile the rows
        probs = x.new_zeros(rows, n)
        probs.view(-1, block).index_copy_(0, where_to, values)
    else:  # where_to: flat key positions, plus a dummy slot for keys shared by two blocks
        flat = x.new_zeros(rows * n + 1)
        flat.scatter_(0, where_to.view(-1), values.view(-1))
        probs = flat[: rows * n].view(rows, n)
    probs = _fall_back_open_rows(x, probs, certified, squared, stats, brow.numel() / zb.numel())
    return probs.to(scores.dtype).view(shape)


def _fallback(x: Tensor, reference: Callable[..., Tensor]) -> Tensor:
    """The package's sort-based function on the rows the solver did not certify.

    ``-inf`` (which the package turns into NaN) is replaced by a value that is certainly
    outside the support — at least 4 below the row maximum — so it gets probability 0. Rows
    holding NaN or +inf, or only -inf, have no defined output (the package fails on them with
    an index error); they come back as NaN.
    """
    if bool(torch.isfinite(x).all()):  # the usual case: a few rows the loop left open
        return reference(x, dim=-1)
    row_max = x.amax(-1, keepdim=True)
    floor = row_max - row_max.abs() - 4
    x = torch.where(torch.isneginf(x), floor, x)
    undefined = (torch.isnan(x) | torch.isinf(x)).any(-1)
    out = torch.full_like(x, math.nan)
    if not bool(undefined.all()):
        out[~undefined] = reference(x[~undefined], dim=-1)
    return out


def entmax15_fast(
    scores: Tensor,
    max_iter: int = _MAX_ITER,
    stats: SolverStats | None = None,
    block: int = _BLOCK,
    engine: str | None = None,
) -> Tensor:
    """1.5-entmax over the last axis, equal to ``entmax.entmax15`` without sorting.

    Same support and probabilities up to float rounding of τ (module docstring: algorithm;
    :func:`_candidates`: why each answer is exact). Inference only: with ``requires_grad``
    inputs it defers to ``entmax15``, which has a backward. ``max_iter=0`` sends every row to
    the fallback, ``block`` sets the pruning granularity (1 = per key); both for tests.
    ``engine`` picks the solver (:data:`ENGINES`; by default that of
    :func:`solver_engine`, ``auto``: compiled rows on a CPU).
    """
    if scores.requires_grad:
        return entmax15(scores, dim=-1)
    return _fast(scores, True, max_iter, stats, block, engine)


def sparsemax_fast(
    scores: Tensor,
    max_iter: int = _MAX_ITER,
    stats: SolverStats | None = None,
    block: int = _BLOCK,
    engine: str | None = None,
) -> Tensor:
    """Sparsemax over the last axis, equal to ``entmax.sparsemax`` without sorting.

    For sparsemax the closed form τ_S is the Newton step on the piecewise-linear f, so this
    is Michelot's projection algorithm, made two-sided and certified like 1.5-entmax.
    """
    if scores.requires_grad:
        return sparsemax(scores, dim=-1)
    return _fast(scores, False, max_iter, stats, block, engine)


def _gpu_prefers_sort(scores: Tensor) -> bool:
    """CUDA scores with short rows under the ``auto`` engine: the sort is the faster exact
    solver there (``_GPU_SORT_BELOW_KEYS``)."""
    return (scores.is_cuda and scores.shape[-1] < _GPU_SORT_BELOW_KEYS
            and _engine.get() == "auto")


def entmax_normalize(scores: Tensor, alpha: float, allowed: Tensor | None = None) -> Tensor:
    """α-entmax over the last axis; entries where ``allowed`` is False get probability 0.

    ``allowed`` broadcasts against ``scores`` (e.g. padding/causal mask of shape (b, 1, n, m)).
    Float16 scores are solved in float32 and the probabilities given back in float16: the
    mask value −1e9 and the solvers' sums overflow float16 (largest 65504).
    """
    if scores.dtype == torch.float16:
        return entmax_normalize(scores.float(), alpha, allowed).to(torch.float16)
    if allowed is not None and bool(allowed.all()):
        allowed = None  # nothing masked: skip two full passes over the scores
    if allowed is not None:
        scores = scores.masked_fill(~allowed, _MASKED)
    reference = (_reference_mode.get() or scores.numel() < _FAST_MIN_SCORES
                 or _gpu_prefers_sort(scores))
    if alpha == 1.0:
        probs = torch.softmax(scores, dim=-1)
    elif alpha == 1.5:
        probs = entmax15(scores, dim=-1) if reference else entmax15_fast(scores)
    elif alpha == 2.0:
        probs = sparsemax(scores, dim=-1) if reference else sparsemax_fast(scores)
    else:
        probs = entmax_bisect(scores, alpha=alpha, dim=-1)
    if allowed is not None:
        # Exact zeros for masked keys, whatever the rounding of the normaliser.
        probs = probs.masked_fill(~allowed, 0.0) if probs.requires_grad else probs.masked_fill_(
            ~allowed, 0.0
        )
    return probs
