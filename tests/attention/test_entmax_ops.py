"""The sort-free α-entmax solvers against the ``entmax`` package, α dispatch, sparse-consistency.

References are the package's own functions. Values are compared with the package run in
float64: in float32 its prefix cumsums are themselves ~1e-6 off on long rows (the fast path's
shifted sums are closer to the truth, not further), so a float32 reference would test the
package's rounding rather than ours.

Supports are compared exactly, with one exception: a key lying *exactly on* the threshold
(z_j = τ*, e.g. the zeros of ``[0, 0, 0, 0, 2]``) has probability 0, which the fast path
returns, while the package's rounded τ may give it 1e-14 (float32) or 1e-32 (float64). Such
keys are allowed to differ only when both probabilities are at rounding level
(:func:`on_threshold`).

Tolerances come from the numbers, not from one CPU's kernels: tests/tolerances.py derives
how far two correct solvers' τ (:func:`tau_err`), probabilities (:func:`prob_tol`), row sums
(:func:`sum_tol`) and keys on the threshold (:func:`on_threshold`) may be apart on an n-key row.
"""

from __future__ import annotations

import math

import pytest
import torch
from entmax import entmax15, entmax_bisect, sparsemax
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from tolerances import bound, eps, on_threshold, prob_tol, sum_tol, support_size

from sparsefinder.attention import entmax_ops
from sparsefinder.attention.entmax_blocks import _block_bound
from sparsefinder.attention.entmax_ops import (
    SolverStats,
    entmax15_fast,
    entmax_normalize,
    reference_mode,
    sparsemax_fast,
    validate_alpha,
)

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

FAST = {1.5: (entmax15_fast, entmax15), 2.0: (sparsemax_fast, sparsemax)}
SETTINGS = settings(
    max_examples=150, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
KINDS = ["normal", "ties", "huge", "equal", "masked", "spiky", "mixed"]


@st.composite
def score_tensors(draw, max_n: int = 80) -> torch.Tensor:
    """Attention-like score tensors (b, h, rows, n) of many shapes, scales and structures.

    ``ties`` draws from a coarse grid so equal values (and thresholds landing exactly on a
    value) happen; ``huge`` puts one dominating value in some rows; ``equal`` makes whole
    rows constant; ``masked`` sets keys (and sometimes whole rows) to attention.py's finite
    -1e9; ``spiky`` has a handful of keys standing out of a flat background.
    """
    n = draw(st.integers(1, max_n))
    b, h, rows = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 6))
    kind = draw(st.sampled_from(KINDS))
    scale = draw(st.sampled_from([1e-3, 0.1, 1.0, 3.0, 10.0, 100.0]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    shape = (b, h, rows, n)
    x = torch.randn(shape, generator=gen) * scale
    if kind in ("ties", "mixed"):
        x = torch.randint(-4, 5, shape, generator=gen).float() * draw(
            st.sampled_from([0.25, 0.5, 1.0, 2.0])
        )
    if kind in ("huge", "mixed"):
        pick = torch.rand(shape[:-1], generator=gen) < 0.5
        col = torch.randint(0, n, shape[:-1], generator=gen)
        x[pick, col[pick]] = 1e4
    if kind in ("equal", "mixed"):
        rows_equal = torch.rand(shape[:-1], generator=gen) < 0.5
        x[rows_equal] = float(draw(st.sampled_from([0.0, 1.0, -7.5])))
    if kind in ("masked", "mixed"):
        x = x.masked_fill(torch.rand(shape, generator=gen) < 0.4, -1e9)
        x[torch.rand(shape[:-1], generator=gen) < 0.2] = -1e9
    if kind == "spiky":
        x = torch.randn(shape, generator=gen) * 0.05
        x = x + (torch.rand(shape, generator=gen) < 0.05) * scale * 3
    return x


# A tied row found by hypothesis (block=1): z = x - 2 puts the seven 1.5s exactly on
# τ* = -0.5, and float32 rounding of τ_S = (Σ_S z - 1)/|S| leaves them 2^-24 each.
TIED_ROW = [2.0, 1.5, 2.0, 1.5, 1.5, 0.5, 1.5, 1.5, 1.5, 1.5]


def _same_support(a: torch.Tensor, b: torch.Tensor, slack: float = 0.0) -> bool:
    """a > 0 exactly where b > 0, except keys where both are at most ``slack``."""
    differ = (a > 0) != (b > 0)
    tiny = (a.double() <= slack) & (b.double() <= slack)
    return not bool((differ & ~tiny).any())


def _check_equal(fast: torch.Tensor, ref64: torch.Tensor, alpha: float) -> None:
    """Same support (up to keys on the threshold) and probabilities within :func:`prob_tol`."""
    assert fast.dtype == torch.float32 and fast.shape == ref64.shape
    s = support_size(fast, ref64)
    assert _same_support(fast, ref64, on_threshold(alpha, s)), \
        "support differs from the entmax package"
    torch.testing.assert_close(fast.double(), ref64, atol=prob_tol(s, alpha), rtol=0)
    torch.testing.assert_close(fast.sum(-1).double(), torch.ones_like(ref64[..., 0]),
                               atol=sum_tol(s), rtol=0)


@pytest.fixture(autouse=True, params=["rows", "blocks"])
def engine(request):
    """Every test runs on both solvers: the compiled rows (the CPU default) and the tensor-op
    blocks (the GPU path, run here on the CPU)."""
    with entmax_ops.solver_engine(request.param):
        yield request.param


# (a) the fast path is the package's function --------------------------------------------


@SETTINGS
@given(
    x=score_tensors(),
    alpha=st.sampled_from([1.5, 2.0]),
    block=st.sampled_from([1, 3, 8, 16, 64]),
)
@example(x=torch.tensor([[TIED_ROW]]), alpha=2.0, block=1)
@example(x=torch.tensor([[TIED_ROW]]), alpha=1.5, block=1)
def test_fast_path_equals_package(x, alpha, block):
    """Every block size: 1 (per key), ones that do not divide n (right-aligned last block)
    and ones larger than n (one block per row)."""
    fast_fn, ref_fn = FAST[alpha]
    stats = SolverStats()
    _check_equal(fast_fn(x, stats=stats, block=block), ref_fn(x.double(), dim=-1), alpha)
    assert stats.rows == x[..., 0].numel()


@SETTINGS
@given(
    row=st.lists(
        st.floats(-50, 50, allow_nan=False, width=32) | st.sampled_from([0.0, 1.0, -1.0, 2.0]),
        min_size=1, max_size=40,
    ),
    alpha=st.sampled_from([1.5, 2.0]),
)
def test_fast_path_equals_package_on_drawn_rows(row, alpha):
    """Plain float lists, so hypothesis can shrink to the smallest failing row."""
    fast_fn, ref_fn = FAST[alpha]
    x = torch.tensor([row], dtype=torch.float32)
    _check_equal(fast_fn(x), ref_fn(x.double(), dim=-1), alpha)


@pytest.mark.parametrize("alpha", [1.5, 2.0])
@pytest.mark.parametrize("n", [1, 2, 3, 33, 512])
def test_fast_path_special_rows(alpha, n):
    fast_fn, ref_fn = FAST[alpha]
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(6, n, generator=gen)
    x[1] = 0.0  # all equal: uniform
    x[2, 0] = 1e6  # one huge value: one-hot
    x[3] = -1e9  # fully masked (attention.py's fill): uniform, re-zeroed by entmax_normalize
    x[4, : n // 2] = 2.0  # a block of ties
    x[5] = torch.arange(n, dtype=torch.float32) * 0.5  # evenly spaced: threshold on a grid
    out = fast_fn(x)
    _check_equal(out, ref_fn(x.double(), dim=-1), alpha)
    torch.testing.assert_close(out[1], torch.full((n,), 1.0 / n), atol=prob_tol(n, alpha),
                               rtol=0)
    assert out[2, 0] == 1.0 and (n == 1 or out[2, 1:].abs().max() == 0)


@pytest.mark.parametrize("n", [512, 500])
def test_fast_path_on_long_attention_like_rows(n):
    """Many long rows: block compaction, the early exit and the fallback of the last rows."""
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 4, n, 32, generator=gen), torch.randn(2, 4, n, 32, generator=gen)
    x = q @ k.transpose(-1, -2) / 32**0.5 * 3
    for alpha, (fast_fn, ref_fn) in FAST.items():
        stats = SolverStats()
        _check_equal(fast_fn(x, stats=stats), ref_fn(x.double(), dim=-1), alpha)
        assert stats.fallback_rows <= 8 and stats.evaluations_per_row < 4, (alpha, stats)
        assert 0 < stats.block_fraction < 0.5


def test_minus_infinity_gets_zero_probability():
    x = torch.tensor([[0.5, float("-inf"), 0.1, float("-inf")]])
    for alpha, (fast_fn, ref_fn) in FAST.items():
        expected = ref_fn(torch.tensor([[0.5, -1e9, 0.1, -1e9]]), dim=-1)
        torch.testing.assert_close(fast_fn(x), expected, atol=prob_tol(4, alpha), rtol=0)


def test_half_precision_and_non_contiguous_inputs():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 40, 50, generator=gen).transpose(-1, -2)  # (3, 50, 40), not contiguous
    for alpha, (fast_fn, ref_fn) in FAST.items():
        _check_equal(fast_fn(x), ref_fn(x.double(), dim=-1), alpha)
        half = fast_fn(x.to(torch.bfloat16))
        assert half.dtype == torch.bfloat16
        # the output rounded to bfloat16 (one rounding of p ≤ 1) on top of the float32 solve
        torch.testing.assert_close(half.float(), ref_fn(x.to(torch.bfloat16).float(), dim=-1),
                                   atol=eps(torch.bfloat16) + prob_tol(40, alpha), rtol=0)


def test_empty_inputs():
    for fast_fn, _ in FAST.values():
        assert fast_fn(torch.empty(0, 5)).shape == (0, 5)
        assert fast_fn(torch.empty(2, 0)).shape == (2, 0)


def test_requires_grad_defers_to_the_package_and_backpropagates():
    x = torch.randn(4, 10, requires_grad=True)
    for alpha, (fast_fn, ref_fn) in FAST.items():
        out = fast_fn(x)
        assert out.grad_fn is not None
        torch.testing.assert_close(out, ref_fn(x, dim=-1), atol=prob_tol(10, alpha), rtol=0)
        (out * torch.arange(10.0)).sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()
        x.grad = None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_fast_path_on_cuda(engine):
    """The block solver runs on the GPU and matches the package; the compiled row solver is
    CPU-only, so asking for it on CUDA scores fails with the fix in the message."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 12, 256, 256, generator=gen) * 4
    for alpha, (fast_fn, ref_fn) in FAST.items():
        if engine == "rows":
            with pytest.raises(ValueError, match="on the CPU.*use engine='auto' or 'blocks'"):
                fast_fn(x.cuda())
            continue
        out = fast_fn(x.cuda())
        assert out.is_cuda
        _check_equal(out.cpu(), ref_fn(x.double(), dim=-1), alpha)


# (b) the fallback is exercised and exact -----------------------------------------------


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_fallback_when_forced(alpha):
    """max_iter=0 certifies nothing: every row goes through the sort-based fallback."""
    fast_fn, ref_fn = FAST[alpha]
    x = torch.randn(3, 7, 64, generator=torch.Generator().manual_seed(4)) * 5
    stats = SolverStats()
    _check_equal(fast_fn(x, max_iter=0, stats=stats), ref_fn(x.double(), dim=-1), alpha)
    assert stats.fallback_rows == stats.rows == 21


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_fallback_for_some_rows_only(alpha):
    """Two evaluations certify rows whose first closed form is exact (e.g. one-hot rows).

    The rest go to the fallback; both kinds of row end up exact, in place.
    """
    fast_fn, ref_fn = FAST[alpha]
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(5))
    x[::2, 0] = 100.0  # one-hot rows: the first evaluation finds S = {0}, the second certifies
    stats = SolverStats()
    # One block per row: the block bound is just -1, so flat rows need more evaluations.
    _check_equal(fast_fn(x, max_iter=2, stats=stats, block=64), ref_fn(x.double(), dim=-1),
                 alpha)
    assert 0 < stats.fallback_rows <= 20


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_rows_that_cannot_be_certified_fall_back(alpha):
    """NaN and +inf rows are never certified: they come back as NaN (the package raises an
    index error on them), and the other rows are unaffected."""
    fast_fn, ref_fn = FAST[alpha]
    x = torch.randn(4, 50, generator=torch.Generator().manual_seed(6))
    x[1, 3] = float("nan")
    x[2, 4] = float("inf")
    stats = SolverStats()
    out = fast_fn(x, stats=stats)
    assert stats.fallback_rows == 2
    assert out[1:3].isnan().all()
    keep = torch.tensor([0, 3])
    _check_equal(out[keep], ref_fn(x[keep].double(), dim=-1), alpha)


# (c) α dispatch and validation ---------------------------------------------------------


def _scores(seed: int = 7) -> torch.Tensor:
    return torch.randn(2, 3, 40, 40, generator=torch.Generator().manual_seed(seed)) * 3


def test_alpha_dispatch():
    x = _scores()
    n = x.shape[-1]
    # softmax: the same n-term normaliser on both sides, probabilities ≤ 1
    torch.testing.assert_close(entmax_normalize(x, 1.0), torch.softmax(x, -1),
                               atol=bound(1.0, terms=n), rtol=0)
    for alpha, package in ((1.5, entmax15), (2.0, sparsemax)):
        torch.testing.assert_close(entmax_normalize(x, alpha), package(x, dim=-1),
                                   atol=prob_tol(n, alpha), rtol=0)
    torch.testing.assert_close(entmax_normalize(x, 1.3), entmax_bisect(x, alpha=1.3, dim=-1),
                               atol=prob_tol(n, 1.3), rtol=0)
    assert torch.equal(entmax_normalize(x, 1.5) > 0, entmax15(x, dim=-1) > 0)
    assert torch.equal(entmax_normalize(x, 2.0) > 0, sparsemax(x, dim=-1) > 0)


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_normalize_uses_the_fast_path_on_large_inputs(alpha, monkeypatch):
    x = torch.randn(1, 4, 96, 96, generator=torch.Generator().manual_seed(10)) * 3
    assert x.numel() >= entmax_ops._FAST_MIN_SCORES
    calls = []
    fast_name = "entmax15_fast" if alpha == 1.5 else "sparsemax_fast"
    real = getattr(entmax_ops, fast_name)
    monkeypatch.setattr(entmax_ops, fast_name, lambda s: calls.append(s.shape) or real(s))
    out = entmax_normalize(x, alpha)
    assert calls == [x.shape]
    _check_equal(out, FAST[alpha][1](x.double(), dim=-1), alpha)
    with reference_mode():
        entmax_normalize(x, alpha)
    assert len(calls) == 1


def test_reference_mode_uses_the_package():
    x = _scores(8)
    with reference_mode():
        ref = entmax_normalize(x, 1.5)
    assert torch.equal(ref, entmax15(x, dim=-1))
    assert torch.equal(entmax_normalize(x, 1.5) > 0, ref > 0)


def test_allowed_mask_gives_exact_zeros_and_all_true_is_a_no_op():
    x = _scores(9)
    allowed = torch.rand(2, 1, 40, 40, generator=torch.Generator().manual_seed(9)) < 0.7
    allowed[1, :, 5] = False  # a fully masked row
    for alpha in (1.0, 1.5, 2.0, 1.3):
        out = entmax_normalize(x, alpha, allowed)
        assert (out.masked_select(~allowed.expand_as(out)) == 0).all()
        assert (out[1, :, 5] == 0).all()
        open_rows = allowed.any(-1, keepdim=True)
        torch.testing.assert_close(out.sum(-1, keepdim=True), open_rows.expand(2, 3, 40, 1).float(),
                                   atol=sum_tol(40), rtol=0)
        every = torch.ones(1, 1, 40, 40, dtype=torch.bool)
        torch.testing.assert_close(entmax_normalize(x, alpha, every), entmax_normalize(x, alpha),
                                   atol=prob_tol(40, alpha) if alpha > 1 else sum_tol(40), rtol=0)


@pytest.mark.parametrize("bad", [0.5, math.nextafter(1.0, 0.0), math.nan, math.inf, "1.5", True])
def test_validate_alpha_rejects(bad):
    with pytest.raises(ValueError, match="alpha"):
        validate_alpha(bad)


@pytest.mark.parametrize("good", [1, 1.0, 1.5, 2, 3.7])
def test_validate_alpha_accepts(good):
    assert validate_alpha(good) == float(good)


# (d) sparse-consistency (paper, Proposition 1) -----------------------------------------


@SETTINGS
@given(
    x=score_tensors(max_n=64),
    alpha=st.sampled_from([1.5, 2.0, 1.25, 1.7]),
    extra=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_sparse_consistency(x, alpha, extra, seed):
    """Masking any keys outside the support leaves α-entmax unchanged.

    Proposition 1: for a binary mask m that dominates the support b of p* = entmax(x)
    (m ⊙ b = b), entmax over the keys of m alone equals p*. The mask here is the support
    plus a random fraction ``extra`` of the other keys; the masked keys are removed both
    through ``entmax_normalize``'s ``allowed`` (finite fill) and, for the sort-free solvers,
    by setting them to -inf. (Keys exactly on the threshold may carry rounding-level mass in
    the package's sort-based results, see the module docstring.)
    """
    full = entmax_normalize(x, alpha)
    # entmax_bisect cannot resolve a row of -1e9 alone (its bracket [max - 1, max) is below
    # float32 resolution there) and returns NaN; that is the package's limit, not masking's.
    assume(alpha in FAST or bool(torch.isfinite(full).all()))
    extra_keys = torch.rand(x.shape, generator=torch.Generator().manual_seed(seed)) < extra
    mask = (full > 0) | extra_keys
    masked = entmax_normalize(x, alpha, mask)
    n = support_size(masked, full)
    torch.testing.assert_close(masked, full, atol=prob_tol(n, alpha), rtol=0)
    assert _same_support(masked, full, on_threshold(alpha, n))
    if alpha in FAST:  # the sort-free solver, whatever the size: finite fill and -inf
        fast_fn = FAST[alpha][0]
        fast_full = fast_fn(x)
        for fill in (-1e9, float("-inf")):
            fast_masked = fast_fn(x.masked_fill(~mask, fill)).masked_fill(~mask, 0.0)
            assert _same_support(fast_masked, fast_full, on_threshold(alpha, n))
            torch.testing.assert_close(fast_masked, fast_full, atol=prob_tol(n, alpha), rtol=0)


# (e) pinned rows, boundaries and the work the solver does --------------------------------


def test_tied_row_keys_on_the_threshold_carry_only_rounding():
    """The row hypothesis found: a rounding fact, not a bug (see :func:`on_threshold`)."""
    x = torch.tensor([TIED_ROW])
    for block in (1, 16):
        out = sparsemax_fast(x, block=block)
        ref = sparsemax(x.double(), dim=-1)
        assert ref[0, 1] == 0 and ref[0, 0] == ref[0, 2] == 0.5  # τ* = -0.5: 1.5s on it
        on = x[0] == 1.5
        slack = on_threshold(2.0, x.shape[-1])
        assert float(out[0, on].max()) <= slack
        torch.testing.assert_close(out.double(), ref, atol=slack, rtol=0)


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_adversarial_rows_near_the_threshold(alpha):
    """Many keys a hair below τ*, ties exactly at it, and one key a hair above it."""
    fast_fn, ref_fn = FAST[alpha]
    scale = 2.0 if alpha == 1.5 else 1.0  # z = (x - max)/2 for 1.5-entmax
    rows = []
    # Two top keys at 0: τ* = -1/√2 (1.5-entmax) or -1/2 (sparsemax); the rest around it.
    tau = -(0.5**0.5) if alpha == 1.5 else -0.5
    for offset in (-1e-3, -1e-5, 0.0, 1e-6, 1e-4):
        row = [0.0, 0.0] + [(tau + offset) * scale] * 30 + [tau * scale - 0.3] * 32
        rows.append(row)
    x = torch.tensor(rows)
    for block in (1, 3, 16, 64):
        out = fast_fn(x, block=block)
        ref = ref_fn(x.double(), dim=-1)
        _check_equal(out, ref, alpha)
    # Keys below τ* get exactly 0: the thresholds are certified, not approximated.
    assert (fast_fn(x)[0, 2:] == 0).all() and (fast_fn(x)[1, 2:] == 0).all()
    assert (fast_fn(x)[4, 2:32] > 0).all()


@pytest.mark.parametrize("alpha", [1.5, 2.0])
@pytest.mark.parametrize(("n", "block"), [(33, 32), (65, 64), (64, 32), (32, 32), (96, 48)])
def test_blocks_of_32_keys_and_more(alpha, n, block):
    """Block sizes ≥ 32 take a plain reduction when they divide n, max-pooling otherwise."""
    fast_fn, ref_fn = FAST[alpha]
    x = torch.randn(5, n, generator=torch.Generator().manual_seed(n)) * 3
    _check_equal(fast_fn(x, block=block), ref_fn(x.double(), dim=-1), alpha)


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_float64_input_is_solved_in_float64(alpha):
    fast_fn, ref_fn = FAST[alpha]
    x = torch.randn(4, 100, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 4
    out = fast_fn(x)
    assert out.dtype == torch.float64
    ref = ref_fn(x, dim=-1)
    assert torch.equal(out > 0, ref > 0)
    torch.testing.assert_close(out, ref, atol=prob_tol(100, alpha, torch.float64), rtol=0)


@pytest.mark.parametrize("squared", [True, False])
def test_block_bound_is_a_tight_lower_bound(squared):
    """lo ≤ τ* on every row, and close to it (step 1 prunes most blocks)."""
    n = 512
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(8, n, 32, generator=gen), torch.randn(8, n, 32, generator=gen)
    rows = (q @ k.transpose(-1, -2) / 32**0.5 * 3).reshape(-1, n)
    _, _, lo = _block_bound(rows.clone(), squared, 16)
    ref = (entmax15 if squared else sparsemax)(rows.double(), dim=-1)
    z = (rows.double() - rows.double().amax(-1, keepdim=True)) * (0.5 if squared else 1.0)
    top = ref.argmax(-1, keepdim=True)
    p_top = ref.gather(-1, top)
    tau = z.gather(-1, top) - (p_top.sqrt() if squared else p_top)
    gap = tau - lo.double()
    assert (gap > 0).all()  # a lower bound, with its ~1e-6 rounding margin
    assert float((gap / tau.abs()).mean()) < 0.03  # measured 0.007 (1.5) and 0.010 (2)


@pytest.mark.parametrize(("alpha", "evaluations", "blocks"), [(1.5, 2.2, 0.14), (2.0, 2.2, 0.07)])
def test_solver_work_and_counters_accumulate(alpha, evaluations, blocks):
    """Counts, not times: ~2 evaluations a row, few blocks kept (measured 2.04 / 0.125 for
    1.5-entmax, 2.01 / 0.062 for sparsemax), and the counters add up over calls."""
    fast_fn, _ = FAST[alpha]
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 4, 512, 32, generator=gen), torch.randn(2, 4, 512, 32, generator=gen)
    x = q @ k.transpose(-1, -2) / 32**0.5 * 3
    once = SolverStats()
    fast_fn(x, stats=once)
    assert once.calls == 1 and once.rows == 8 * 512
    assert 1.5 < once.evaluations_per_row < evaluations
    assert 0 < once.block_fraction < blocks
    twice = SolverStats()
    fast_fn(x, stats=twice)
    fast_fn(x, stats=twice, max_iter=0)
    assert twice.calls == 2 and twice.rows == 2 * once.rows
    assert twice.evaluations == once.evaluations
    assert twice.fallback_rows == once.fallback_rows + once.rows
    assert twice.block_fraction_sum == pytest.approx(2 * once.block_fraction_sum)
    assert SolverStats().fallback_rate == 0.0 and SolverStats().evaluations_per_row == 0.0
    assert SolverStats().block_fraction == 0.0
    assert twice.fallback_rate == pytest.approx((once.fallback_rows + once.rows) / twice.rows)


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_fallback_on_mixed_rows_with_minus_infinity(alpha):
    """All rows forced to the fallback: -inf keys get 0 whatever the row's scale, NaN/+inf
    rows come back as NaN and leave the other rows alone."""
    fast_fn, ref_fn = FAST[alpha]
    x = torch.tensor([
        [100.0, 99.5, float("-inf"), 98.0, float("-inf")],
        [-50.0, float("-inf"), -50.5, -51.0, -60.0],
        [0.5, float("-inf"), 0.25, 0.0, float("-inf")],
        [10.0, 9.0, float("-inf"), 9.5, 8.0],
        [1.0, float("nan"), 0.0, 0.0, 0.0],
        [1.0, float("inf"), 0.0, 0.0, 0.0],
    ])
    stats = SolverStats()
    out = fast_fn(x, max_iter=0, stats=stats)
    assert stats.fallback_rows == 6
    finite = x[:4].masked_fill(torch.isneginf(x[:4]), -1e9)
    _check_equal(out[:4], ref_fn(finite.double(), dim=-1), alpha)
    assert (out[:4][torch.isneginf(x[:4])] == 0).all()
    assert out[4:].isnan().all()


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_requires_grad_on_batched_input_and_masks(alpha):
    """The differentiable path: last axis of a 3-D input, masked keys 0, gradients flow."""
    fast_fn, ref_fn = FAST[alpha]
    x = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(11), requires_grad=True)
    torch.testing.assert_close(fast_fn(x), ref_fn(x.detach(), dim=-1), atol=prob_tol(7, alpha),
                               rtol=0)
    allowed = torch.rand(2, 5, 7, generator=torch.Generator().manual_seed(12)) < 0.6
    allowed[..., 0] = True
    out = entmax_normalize(x, alpha, allowed)
    assert (out[~allowed] == 0).all()
    torch.testing.assert_close(out.sum(-1), torch.ones(2, 5), atol=sum_tol(7), rtol=0)
    (out * torch.arange(7.0)).sum().backward()
    assert x.grad is not None and (x.grad[~allowed] == 0).all()


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_fast_path_from_exactly_the_size_threshold(alpha, monkeypatch):
    """entmax_normalize takes the fast path from _FAST_MIN_SCORES scores on, not before."""
    fast_name = "entmax15_fast" if alpha == 1.5 else "sparsemax_fast"
    calls = []
    real = getattr(entmax_ops, fast_name)
    monkeypatch.setattr(entmax_ops, fast_name, lambda s: calls.append(s.numel()) or real(s))
    assert entmax_ops._FAST_MIN_SCORES == 8 * 64 * 64
    entmax_normalize(torch.randn(1, 8, 64, 64), alpha)
    entmax_normalize(torch.randn(7, 31, 151), alpha)  # 32767 scores: the package
    assert calls == [8 * 64 * 64]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_on_cuda_auto_sorts_short_rows_and_solves_long_ones(monkeypatch):
    """Under ``auto`` on a GPU, rows shorter than _GPU_SORT_BELOW_KEYS go to the package's sort
    (faster there), longer ones to the block solver; both exact."""
    calls = []
    real = entmax_ops.entmax15_fast
    monkeypatch.setattr(entmax_ops, "entmax15_fast", lambda s: calls.append(s.shape[-1]) or real(s))
    short, long = entmax_ops._GPU_SORT_BELOW_KEYS - 1, entmax_ops._GPU_SORT_BELOW_KEYS
    gen = torch.Generator().manual_seed(5)
    with entmax_ops.solver_engine("auto"):
        for n in (short, long):
            x = torch.randn(1, 2, 64, n, generator=gen) * 4
            _check_equal(entmax_normalize(x.cuda(), 1.5).cpu(), entmax15(x.double(), dim=-1),
                         1.5)
    assert calls == [long]


def test_the_gpu_sort_rule_reads_device_row_length_and_engine():
    """The rule alone, on stand-ins for CUDA scores (this machine may have no GPU): CUDA rows
    shorter than the bound under ``auto`` sort; at the bound, on a CPU, or under a named
    engine they do not."""
    from types import SimpleNamespace

    bound = entmax_ops._GPU_SORT_BELOW_KEYS
    assert bound == 2048  # the measured H200 crossover (benchmarks/gpu_solver.py)

    def cuda_scores(n):
        return SimpleNamespace(is_cuda=True, shape=(1, 2, 64, n))

    with entmax_ops.solver_engine("auto"):
        assert entmax_ops._gpu_prefers_sort(cuda_scores(bound - 1))
        assert not entmax_ops._gpu_prefers_sort(cuda_scores(bound))
        assert not entmax_ops._gpu_prefers_sort(torch.randn(1, 2, 64, 512))
    with entmax_ops.solver_engine("blocks"):
        assert not entmax_ops._gpu_prefers_sort(cuda_scores(512))


def test_float16_scores_with_a_mask_are_solved_in_float32():
    """−1e9 (the mask) overflows float16: the scores are solved in float32 and given back in
    float16, so the result is the float32 one rounded once."""
    x = _scores(4).to(torch.float16)
    allowed = torch.rand(2, 1, 40, 40, generator=torch.Generator().manual_seed(4)) < 0.6
    allowed[..., 0] = True
    for alpha in (1.0, 1.5, 2.0, 1.3):
        out = entmax_normalize(x, alpha, allowed)
        assert out.dtype == torch.float16
        assert torch.equal(out, entmax_normalize(x.float(), alpha, allowed).to(torch.float16))
        assert (out.masked_select(~allowed.expand_as(out)) == 0).all()
