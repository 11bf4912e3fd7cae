"""The compiled row solver: exact against the package, split over threads identically, and
the engine choice of entmax_ops (rows on a CPU by default, a clear error where it cannot run)."""

from __future__ import annotations

import pytest
import torch
from entmax import entmax15, sparsemax
from tolerances import assert_same_support, eps, on_threshold, prob_tol, support_size

from sparsefinder.attention import entmax_ops, entmax_rows
from sparsefinder.attention.entmax_ops import SolverStats, entmax15_fast, solver_engine

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


def _attention_rows(seed: int = 0, n: int = 300) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(4, n, 32, generator=gen), torch.randn(4, n, 32, generator=gen)
    return (q @ k.transpose(-1, -2) / 32**0.5 * 3).reshape(-1, n).contiguous()


@pytest.mark.parametrize("squared", [True, False])
def test_rows_are_certified_and_equal_the_float64_package(squared):
    x = _attention_rows()
    probs, certified, evaluations, kept = entmax_rows.solve_rows(x, squared, 12)
    ref = (entmax15 if squared else sparsemax)(x.double(), dim=-1)
    assert bool(certified.all())
    # float64 inside, one float32 rounding of p ≤ 1 at the end: within eps32 (and a float64 τ)
    alpha, n = (1.5 if squared else 2.0), support_size(probs, ref)
    assert_same_support(probs, ref, slack=on_threshold(alpha, n, torch.float64))
    torch.testing.assert_close(probs.double(), ref, atol=eps(torch.float32)
                               + prob_tol(n, alpha, torch.float64), rtol=0)
    assert int(evaluations.min()) >= 1 and float(evaluations.float().mean()) < 4
    assert int(kept.min()) > 0 and int(kept.max()) <= -(-x.shape[1] // 16)


def test_split_over_threads_gives_the_same_bits(monkeypatch):
    x = _attention_rows(1)
    monkeypatch.setattr(entmax_rows, "_SPLIT_MIN_SCORES", 1 << 40)  # never split
    whole = entmax_rows.solve_rows(x, True, 12)
    monkeypatch.setattr(entmax_rows, "_SPLIT_MIN_SCORES", 1)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    split = entmax_rows.solve_rows(x, True, 12)
    for a, b in zip(whole, split, strict=True):
        assert torch.equal(a, b)


def test_uncertified_rows_come_back_as_zeros_and_flagged():
    x = _attention_rows(2, n=64)
    x[3, 5] = float("nan")
    x[7, 1] = float("inf")
    probs, certified, _, _ = entmax_rows.solve_rows(x, True, 12)
    assert not certified[3] and not certified[7] and int(certified.sum()) == x.shape[0] - 2
    assert (probs[3] == 0).all() and (probs[7] == 0).all()
    nothing, none_certified, _, _ = entmax_rows.solve_rows(x, True, 0)
    assert not bool(none_certified.any()) and (nothing == 0).all()


def test_plus_and_minus_infinity_in_one_row_are_not_mistaken_for_nan():
    """The NaN screen is the row sum: +inf and -inf together make it NaN, yet the row holds
    no NaN; a +inf maximum still goes to the fallback (the package's answer is undefined)."""
    x = torch.zeros(1, 40)
    x[0, 0] = float("-inf")
    x[0, 1] = 3.0
    probs, certified, _, _ = entmax_rows.solve_rows(x, True, 12)
    assert bool(certified.all())
    torch.testing.assert_close(probs.double(), entmax15(x.masked_fill(x.isinf(), -1e9).double(),
                                                       dim=-1),
                               atol=eps(torch.float32) + prob_tol(40, 1.5, torch.float64), rtol=0)


def test_cpu_default_engine_is_rows(monkeypatch):
    calls = []
    real = entmax_rows.solve_rows
    monkeypatch.setattr(entmax_rows, "solve_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = _attention_rows(3)
    entmax15_fast(x)
    assert calls == [1]
    with solver_engine("blocks"):
        entmax15_fast(x)
    entmax15_fast(x, engine="blocks")
    assert calls == [1]


def test_engine_errors_name_the_fix(monkeypatch):
    x = _attention_rows(4, n=40)
    with pytest.raises(ValueError, match="engine must be one of"):
        entmax15_fast(x, engine="fastest")
    with pytest.raises(ValueError, match="engine must be one of"), solver_engine("gpu"):
        pass
    monkeypatch.setattr(entmax_rows, "available", lambda: False)
    with pytest.raises(ValueError, match="pip install numba"):
        entmax15_fast(x, engine="rows")
    stats = SolverStats()  # auto without numba: the block solver, same answer
    torch.testing.assert_close(entmax15_fast(x, stats=stats).double(),
                               entmax15(x.double(), dim=-1), atol=prob_tol(40, 1.5), rtol=0)
    assert stats.rows == x.shape[0]
    assert entmax_ops.ENGINES == ("auto", "rows", "blocks")
