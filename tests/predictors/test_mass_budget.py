"""MassRowBudget: per-row budgets from predicted mass, each head's total budget kept."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.attention.masks import layer_allowed
from sparsefinder.predictors.mass_budget import MassRowBudget, predicted_need, split_budget
from sparsefinder.predictors.row_fraction import RowFraction


def _vectors(heads=2, n=24, r=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(heads, n, r, generator=g) * 2, torch.randn(heads, n, r, generator=g) * 2


@pytest.mark.parametrize("seed", range(5))
def test_the_split_keeps_each_heads_total_and_every_rows_bounds(seed):
    g = torch.Generator().manual_seed(seed)
    need = torch.rand(3, 40, generator=g) ** 3 * 10
    need[0, :5] = 0.0  # rows predicting nothing still take their one key
    cap = torch.randint(1, 30, (40,), generator=g)
    total = torch.tensor([40, 300, int(cap.sum()) + 7])  # the last asks for more than fits
    counts = split_budget(need, total, cap)
    assert torch.equal(counts.sum(-1), torch.minimum(total, cap.sum().expand(3)))
    assert (counts >= 1).all() and (counts <= cap).all()


def test_the_split_follows_the_need():
    need = torch.tensor([[1.0, 2.0, 4.0, 8.0, 1.0]])
    counts = split_budget(need, torch.tensor([32]), torch.full((5,), 100))
    assert counts.tolist() == [[2, 4, 8, 16, 2]]
    # a total below one key per row: no row is forced to keep one
    counts = split_budget(need, torch.tensor([3]), torch.full((5,), 100))
    assert int(counts.sum()) == 3 and counts[0, 3] >= counts[0, 0]


def test_a_concentrated_row_needs_fewer_keys_than_a_spread_one():
    dist = torch.tensor([[[0.0, 40.0, 40.0, 40.0], [0.0, 0.0, 0.0, 0.0]]])
    need = predicted_need(dist)
    assert need[0, 0] == pytest.approx(1.0, abs=1e-6) and need[0, 1] == pytest.approx(4.0)
    masked = predicted_need(torch.tensor([[[0.0, 0.0, torch.inf, torch.inf]]]))
    assert masked[0, 0] == pytest.approx(2.0)  # disallowed keys carry no mass


@pytest.mark.parametrize(("causal", "window"), [(False, None), (True, None), (True, 6)])
def test_the_predictor_keeps_the_row_fractions_budget_per_head(causal, window):
    q, k = _vectors()
    fractions = torch.tensor([0.25, 0.1])
    mask = MassRowBudget(fractions).predict(q, k, causal=causal, sliding_window=window)
    plain = RowFraction(fractions).predict(q, k, causal=causal, sliding_window=window)
    assert torch.equal(mask.sum((1, 2)), plain.sum((1, 2)))  # the model-level budget kept
    allowed = layer_allowed(24, 24, causal=causal, sliding_window=window)
    if allowed is not None:
        assert not (mask & ~allowed).any()
    assert not torch.equal(mask.sum(-1), plain.sum(-1))  # but rows differ in what they keep
    dist = torch.cdist(q, k) ** 2
    if allowed is not None:
        dist = dist.masked_fill(~allowed, torch.inf)
    kept = dist.masked_fill(~mask, -1).amax(-1)
    dropped = dist.masked_fill(mask | (dist == torch.inf), torch.inf).amin(-1)
    assert (kept <= dropped).all()  # each row keeps its nearest keys


def test_errors():
    with pytest.raises(ValueError, match="1-d tensor"):
        MassRowBudget(torch.tensor(0.5))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        MassRowBudget(torch.tensor([1.5]))
    q, k = _vectors()
    with pytest.raises(ValueError, match="fitted for 3 heads"):
        MassRowBudget(torch.full((3,), 0.5)).predict(q, k)
