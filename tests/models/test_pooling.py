"""mean_pool: the mean over real tokens, padding ignored, batched over any leading axes."""

from __future__ import annotations

import pytest
import torch
from tolerances import tol_for

from sparsefinder.models.pooling import mean_pool

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


def test_mean_over_real_tokens_only_and_zeros_for_an_empty_row():
    states = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [5.0, 5.0]],
                           [[3.0, 3.0], [9.0, 9.0], [9.0, 9.0]]])
    mask = torch.tensor([[True, True, False], [False, False, False]])
    pooled = mean_pool(states, mask)
    assert torch.equal(pooled, torch.tensor([[0.5, 1.0], [0.0, 0.0]]))  # exact: halves


def test_it_matches_sentence_transformers_pooling_on_a_padded_batch():
    g = torch.Generator().manual_seed(0)
    states = torch.randn(3, 5, 4, generator=g)
    lengths = [5, 2, 4]
    mask = torch.arange(5)[None] < torch.tensor(lengths)[:, None]
    expected = torch.stack([states[i, :n].mean(0) for i, n in enumerate(lengths)])
    # a mean of at most 5 values, summed in any order, then divided
    torch.testing.assert_close(mean_pool(states, mask), expected,
                               **tol_for(expected, terms=5 + 1, scale=float(states.abs().max())))
