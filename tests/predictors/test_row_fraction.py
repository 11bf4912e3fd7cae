"""RowFraction: each row keeps its fraction of the keys it may attend to, nearest first."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.attention.masks import layer_allowed
from sparsefinder.predictors.row_fraction import RowFraction


def _vectors(heads=2, n=20, r=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(heads, n, r, generator=g), torch.randn(heads, n, r, generator=g)


def test_each_row_keeps_the_floor_of_its_fraction_of_the_nearest_keys():
    q, k = _vectors()
    mask = RowFraction(torch.tensor([0.25, 0.5])).predict(q, k)
    assert (mask[0].sum(-1) == 5).all() and (mask[1].sum(-1) == 10).all()
    dist = torch.cdist(q, k)
    for h in range(2):
        kept = dist[h].masked_fill(~mask[h], -1).amax(-1)
        dropped = dist[h].masked_fill(mask[h], float("inf")).amin(-1)
        assert (kept <= dropped).all()  # nothing dropped is nearer than what is kept


@pytest.mark.parametrize("window", [None, 6])
def test_causal_and_local_rows_spend_their_fraction_inside_what_they_may_see(window):
    q, k = _vectors(n=30)
    n = q.shape[1]
    allowed = layer_allowed(n, n, causal=True, sliding_window=window)
    mask = RowFraction(torch.tensor([0.5, 1.0])).predict(q, k, causal=True,
                                                          sliding_window=window)
    assert not (mask & ~allowed).any()
    counts = allowed.sum(-1)
    assert torch.equal(mask[1].sum(-1), counts)  # fraction 1: every allowed key
    assert torch.equal(mask[0].sum(-1), (0.5 * counts + 1e-9).floor().long())


def test_bad_fractions_are_named():
    with pytest.raises(ValueError, match=r"fractions must lie in \[0, 1\]"):
        RowFraction(torch.tensor([1.5]))
    with pytest.raises(ValueError, match="fitted for 3 heads, got q with 2"):
        RowFraction(torch.ones(3)).predict(*_vectors())


def test_fractions_that_are_not_one_per_head_in_0_1_are_named():
    for bad in ([0.5, 0.5], torch.ones(2, 2), torch.tensor(0.5)):
        with pytest.raises(ValueError, match="^fractions must be a 1-d tensor with one keep "
                                             "fraction per head$"):
            RowFraction(bad)
    for bad in ([-0.1, 0.5], [float("nan"), 0.5], [0.5, 1.01]):
        with pytest.raises(ValueError, match=r"fractions must lie in \[0, 1\]"):
            RowFraction(torch.tensor(bad))


def test_a_fraction_of_zero_keeps_nothing_and_one_key_per_row_is_kept():
    q, k = _vectors(n=10)
    mask = RowFraction(torch.tensor([0.0, 0.1])).predict(q, k)  # 0 and 1 of 10 keys
    assert not mask[0].any()
    nearest = ((q[1][:, None] - k[1][None]) ** 2).sum(-1).argmin(-1)
    assert (mask[1].sum(-1) == 1).all() and mask[1][torch.arange(10), nearest].all()
    assert not RowFraction(torch.zeros(2)).predict(q, k).any()



def test_a_text_without_query_rows_gets_an_empty_mask():
    q, k = _vectors()
    mask = RowFraction(torch.tensor([0.5, 0.5])).predict(q[:, :0], k)
    assert mask.shape == (2, 0, 20) and mask.dtype == torch.bool


@pytest.mark.cuda
@pytest.mark.parametrize("window", [None, 4])
def test_on_a_gpu_the_mask_is_built_there_and_equals_the_cpus(window):
    q, k = _vectors()
    fractions = torch.tensor([0.25, 0.5])
    cpu = RowFraction(fractions).predict(q, k, causal=True, sliding_window=window)
    gpu = RowFraction(fractions).predict(q.cuda(), k.cuda(), causal=True, sliding_window=window)
    assert gpu.device.type == "cuda" and torch.equal(gpu.cpu(), cpu)
