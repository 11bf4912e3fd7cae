"""Top-p over α-entmax probabilities of the ORIGINAL q/k: an oracle."""

from __future__ import annotations

import math

import pytest
import torch
from entmax import entmax15

from sparsefinder.attention.masks import causal_mask
from sparsefinder.predictors.topp import TopP


def _qk(heads: int = 3, n: int = 9, m: int | None = None, d: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    return 2 * torch.randn(heads, n, d, generator=gen), 2 * torch.randn(heads, m, d, generator=gen)


def test_flags():
    assert TopP.needs_full_scores is True and TopP.uses_projections is False


def test_hand_checked_softmax():
    # alpha=1, scale 1: probabilities of one row [ln 5, ln 3, ln 2] → [0.5, 0.3, 0.2]
    q = torch.tensor([[[1.0]]])
    k = torch.tensor([[[math.log(5)], [math.log(3)], [math.log(2)]]])
    probs = TopP(0.5, alpha=1.0, scale=1.0).probabilities(q, k)
    assert probs[0, 0].tolist() == pytest.approx([0.5, 0.3, 0.2])
    assert TopP(0.4, alpha=1.0, scale=1.0).predict(q, k)[0, 0].tolist() == [True, False, False]
    assert TopP(0.6, alpha=1.0, scale=1.0).predict(q, k)[0, 0].tolist() == [True, True, False]
    assert TopP(1.0, alpha=1.0, scale=1.0).predict(q, k).all()


def test_p_one_is_the_entmax_support():
    q, k = _qk()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    support = entmax15(scores, dim=-1) > 0
    assert torch.equal(TopP(1.0).predict(q, k), support)


def test_kept_mass_reaches_p_minimally_and_grows_with_p():
    q, k = _qk(n=12, m=15)
    previous = None
    for p in (0.2, 0.5, 0.8, 0.95, 1.0):
        model = TopP(p)
        probs = model.probabilities(q, k)
        mask = model.predict(q, k)
        kept = (probs * mask).sum(-1)
        assert (kept >= p - 1e-5).all()
        # dropping the smallest kept probability of a row falls below p (minimal set)
        smallest = torch.where(mask, probs, torch.inf).amin(-1)
        assert (kept - smallest < p + 1e-6).all() or p == 1.0
        assert not (mask & (probs == 0)).any()
        if previous is not None:
            assert (mask >= previous).all()
        previous = mask


def test_causal_never_keeps_the_future():
    q, k = _qk(n=10)
    mask = TopP(0.9).predict(q, k, causal=True)
    assert not (mask & ~causal_mask(10, 10)).any()
    assert mask.any(-1).all()


def test_errors_and_empty():
    for bad in (0.0, 1.5, True, "0.5"):
        with pytest.raises(ValueError, match="p must be"):
            TopP(bad)
    with pytest.raises(ValueError, match="alpha"):
        TopP(0.9, alpha=0.5)
    with pytest.raises(ValueError, match="scale"):
        TopP(0.9, scale=-1.0)
    with pytest.raises(ValueError, match="heads"):
        TopP(0.9).predict(torch.zeros(3, 4), torch.zeros(3, 4))
    assert TopP(0.9).predict(torch.zeros(2, 0, 4), torch.zeros(2, 3, 4)).shape == (2, 0, 3)
