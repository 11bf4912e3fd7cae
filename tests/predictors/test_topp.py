"""Top-p over α-entmax probabilities of the ORIGINAL q/k: an oracle."""

from __future__ import annotations

import math

import pytest
import torch
from entmax import entmax15
from tolerances import (
    assert_same_support,
    bound,
    entmax_prob_tol,
    score_bound,
    support_bound,
    support_size,
)

from sparsefinder.attention.masks import causal_mask
from sparsefinder.predictors.topp import TopP

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


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
    # logs rounded to float32, 3 exps, their sum, a division: a few roundings of p ≤ 1
    assert probs[0, 0].tolist() == pytest.approx([0.5, 0.3, 0.2], abs=bound(1.0, terms=8))
    assert TopP(0.4, alpha=1.0, scale=1.0).predict(q, k)[0, 0].tolist() == [True, False, False]
    assert TopP(0.6, alpha=1.0, scale=1.0).predict(q, k)[0, 0].tolist() == [True, True, False]
    assert TopP(1.0, alpha=1.0, scale=1.0).predict(q, k).all()


def test_p_one_is_the_entmax_support():
    """Edge for edge, except keys the scores' rounding (the product, the scale: ×d^-½ there,
    ÷√d here) can move across the threshold (tests/tolerances.py)."""
    q, k = _qk()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    reference = entmax15(scores, dim=-1)
    model = TopP(1.0)
    ours = model.predict(q, k) * model.probabilities(q, k)  # > 0 exactly where predicted
    score_err = score_bound(q, k, 1 / math.sqrt(q.shape[-1]))
    kept = support_size(ours, reference)
    assert_same_support(ours, reference, slack=support_bound(score_err, 1.5, kept))


def test_kept_mass_reaches_p_minimally_and_grows_with_p():
    q, k = _qk(n=12, m=15)
    previous = None
    for p in (0.2, 0.5, 0.8, 0.95, 1.0):
        model = TopP(p)
        probs = model.probabilities(q, k)
        mask = model.predict(q, k)
        kept = (probs * mask).sum(-1)
        slack = bound(1.0, terms=k.shape[1] + 1)  # a sum of ≤ m probabilities ≤ 1
        assert (kept >= p - slack).all()
        # dropping the smallest kept probability of a row falls below p (minimal set)
        smallest = torch.where(mask, probs, torch.inf).amin(-1)
        assert (kept - smallest < p + slack).all() or p == 1.0
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


def test_a_key_whose_better_ranked_keys_already_hold_p_is_dropped():
    # sparsemax (α = 2) of [0.75, 0.5, 0.5] is exactly [0.5, 0.25, 0.25] (τ = 0.25)
    q, k = torch.ones(1, 1, 1), torch.tensor([[[0.75], [0.5], [0.5]]])
    assert TopP(0.5, alpha=2.0, scale=1.0).probabilities(q, k)[0, 0].tolist() == [0.5, 0.25,
                                                                                  0.25]
    assert TopP(0.5, alpha=2.0, scale=1.0).predict(q, k)[0, 0].tolist() == [True, False, False]
    # the tie goes to the lower index; the third key's better-ranked mass is exactly 0.75
    assert TopP(0.75, alpha=2.0, scale=1.0).predict(q, k)[0, 0].tolist() == [True, True, False]
    assert TopP(0.76, alpha=2.0, scale=1.0).predict(q, k)[0, 0].tolist() == [True, True, True]


def test_probabilities_use_the_given_scale_or_one_over_root_d():
    q, k = _qk(heads=2, n=5, m=6, d=16)
    scores = q @ k.transpose(-1, -2)
    default = TopP(0.9).probabilities(q, k)
    tol = entmax_prob_tol(score_bound(q, k, 0.25), 1.5, 6)
    torch.testing.assert_close(default, entmax15(scores / 4.0, dim=-1), rtol=0,
                               atol=tol)  # √16 = 4
    given = TopP(0.9, scale=0.05).probabilities(q, k)
    torch.testing.assert_close(given, entmax15(scores * 0.05, dim=-1), rtol=0,
                               atol=entmax_prob_tol(score_bound(q, k, 0.05), 1.5, 6))
    assert float((default - given).abs().max()) > tol
    with pytest.raises(ValueError, match="scale"):
        TopP(0.9, scale=0.0)


def test_half_precision_inputs_are_scored_in_float32():
    q, k = _qk(heads=2, n=5, m=6, d=8)
    probs = TopP(0.9).probabilities(q.bfloat16(), k.bfloat16())
    assert probs.dtype == torch.float32
    exact = TopP(0.9).probabilities(q.bfloat16().float(), k.bfloat16().float())
    torch.testing.assert_close(probs, exact, rtol=0,  # the same float32 maths
                               atol=entmax_prob_tol(score_bound(q, k, 8**-0.5), 1.5, 6))
    assert torch.equal(TopP(0.9).predict(q.bfloat16(), k.bfloat16()),
                       TopP(0.9).predict(q.bfloat16().float(), k.bfloat16().float()))


def test_edge_shapes():
    none = TopP(0.9).predict(torch.zeros(2, 3, 4), torch.zeros(2, 0, 4))  # no key
    assert none.shape == (2, 3, 0) and none.dtype == torch.bool
    empty = TopP(0.9).predict(torch.zeros(2, 0, 4), torch.zeros(2, 3, 4))
    assert empty.dtype == torch.bool
    q, k = _qk(heads=2, n=3, m=1)  # one key holds all the mass
    assert TopP(0.5).predict(q, k).all()
    # d = 0: every score is 0, the probabilities uniform: p = 1 keeps every key
    flat = TopP(1.0, scale=1.0).predict(torch.zeros(2, 3, 0), torch.zeros(2, 4, 0))
    assert flat.shape == (2, 3, 4) and flat.all()


def test_the_empty_mask_stays_on_the_inputs_device():
    """The meta device stands in for a GPU (entmax itself cannot run there: it reads values)."""
    for n, m in ((0, 3), (3, 0)):
        out = TopP(0.9).predict(torch.zeros(2, n, 4, device="meta"),
                                torch.zeros(2, m, 4, device="meta"))
        assert out.device.type == "meta" and out.shape == (2, n, m) and out.dtype == torch.bool
