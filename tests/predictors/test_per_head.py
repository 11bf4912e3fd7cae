"""One raw setting per head (PerHeadSelect) and routed k-means with a per-head key budget."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.predictors import Window
from sparsefinder.predictors.per_head import PerHeadSelect
from sparsefinder.predictors.routed_kmeans import RoutedKMeans


def _qk(heads=3, n=11, d=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(heads, n, d, generator=gen), torch.randn(heads, n, d, generator=gen)


@pytest.mark.parametrize("causal", [False, True])
def test_each_head_gets_its_own_predictors_masks(causal):
    q, k = _qk()
    predictors = [Window(0), Window(2), Window(5)]
    select = PerHeadSelect(predictors, torch.tensor([2, 0, 2]))
    out = select.predict(q, k, causal=causal)
    for head, index in enumerate([2, 0, 2]):
        assert torch.equal(out[head], predictors[index].predict(q, k, causal=causal)[head])


def test_per_head_select_errors():
    with pytest.raises(ValueError, match="index the 2 predictors"):
        PerHeadSelect([Window(0), Window(1)], torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="1-d tensor"):
        PerHeadSelect([Window(0)], torch.zeros(2, 2, dtype=torch.long))
    q, k = _qk(heads=2)
    with pytest.raises(ValueError, match="calibrated for 3 heads"):
        PerHeadSelect([Window(0)], torch.zeros(3, dtype=torch.long)).predict(q, k)


@pytest.mark.parametrize("causal", [False, True])
def test_routed_kmeans_per_head_budget_is_each_heads_own_budget(causal):
    gen = torch.Generator().manual_seed(4)
    centroids = torch.randn(3, 7, 4, generator=gen)
    q, k = _qk(n=20)
    budgets = [0.05, 0.3, 0.8]
    per_head = RoutedKMeans.from_centroids(centroids, budget=torch.tensor(budgets))
    out = per_head.predict(q, k, causal=causal)
    for head, budget in enumerate(budgets):
        alone = RoutedKMeans.from_centroids(centroids, budget=budget).predict(q, k, causal=causal)
        assert torch.equal(out[head], alone[head])
    same = RoutedKMeans.from_centroids(centroids, budget=torch.full((3,), 0.3))
    assert torch.equal(same.predict(q, k, causal=causal),
                       RoutedKMeans.from_centroids(centroids, budget=0.3).predict(
                           q, k, causal=causal))
    with pytest.raises(ValueError, match="per-head budget"):
        RoutedKMeans.from_centroids(centroids, budget=torch.tensor([0.1, 0.0, 1.0]))
    with pytest.raises(ValueError, match="2 per-head budgets for 3 heads"):
        RoutedKMeans.from_centroids(centroids, budget=torch.tensor([0.1, 0.2])).predict(q, k)


def test_per_head_select_defaults_to_non_causal_and_names_the_shapes():
    q, k = _qk()
    select = PerHeadSelect([Window(0), Window(5)], torch.tensor([1, 0, 1]))
    assert torch.equal(select.predict(q, k), select.predict(q, k, causal=False))
    assert not torch.equal(select.predict(q, k), select.predict(q, k, causal=True))
    with pytest.raises(ValueError, match="^choice must be a 1-d tensor with one predictor "
                                         "index per head$"):
        PerHeadSelect([Window(0)], torch.tensor(0))
    q2, k2 = _qk(heads=2, n=5)  # 2 heads of 5 tokens: the message names the heads
    with pytest.raises(ValueError, match="^calibrated for 3 heads, got q with 2$"):
        select.predict(q2, k2)

