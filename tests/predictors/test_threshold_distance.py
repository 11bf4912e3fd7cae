"""ThresholdDistance: one squared-distance threshold per head, ties kept (``≤``)."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.predictors import Distance
from sparsefinder.predictors.threshold_distance import ThresholdDistance


def _vectors(heads=3, n=7, m=9, r=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(heads, n, r, generator=g), torch.randn(heads, m, r, generator=g)


def test_each_head_uses_its_own_threshold_and_matches_the_paper_distance():
    q, k = _vectors()
    t = torch.tensor([0.5, 1.5, 3.0])
    mask = ThresholdDistance(t**2).predict(q, k)
    for h in range(3):
        paper = Distance(float(t[h])).predict(q[h : h + 1], k[h : h + 1])
        assert torch.equal(mask[h : h + 1], paper)
    assert mask[0].sum() < mask[1].sum() < mask[2].sum()


def test_a_key_exactly_on_the_threshold_is_kept_and_causal_cuts_the_future():
    q = torch.zeros(1, 3, 2)
    k = torch.tensor([[[1.0, 0.0], [2.0, 0.0], [0.5, 0.0]]])
    mask = ThresholdDistance(torch.tensor([1.0])).predict(q, k)  # ‖q−k₀‖² = 1 exactly
    assert mask[0, :, 0].all() and not mask[0, :, 1].any() and mask[0, :, 2].all()
    assert torch.equal(mask, Distance(1.0).predict(q, k))  # the paper's predictor agrees
    causal = ThresholdDistance(torch.tensor([1.0])).predict(q, k, causal=True)
    assert torch.equal(causal[0], mask[0] & torch.ones(3, 3, dtype=torch.bool).tril())


def test_negative_threshold_keeps_nothing_and_bad_inputs_are_named():
    q, k = _vectors(heads=2)
    assert not ThresholdDistance(torch.tensor([-1.0, -0.5])).predict(q, k).any()
    with pytest.raises(ValueError, match="one squared distance per head"):
        ThresholdDistance(torch.tensor(1.0))
    with pytest.raises(ValueError, match="calibrated for 3 heads, got q with 2"):
        ThresholdDistance(torch.ones(3)).predict(q, k)


def test_bad_thresholds_are_refused_with_what_was_given_and_the_fix():
    with pytest.raises(ValueError, match=r"^sq_thresholds must be a 1-d tensor with one squared "
                                         r"distance per head, got torch\.Size\(\[2, 3\]\)$"):
        ThresholdDistance(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r", got list$"):
        ThresholdDistance([1.0, 2.0])
    with pytest.raises(ValueError, match=r"^sq_thresholds contains NaN; calibrate on train "
                                         r"records first$"):
        ThresholdDistance(torch.tensor([1.0, float("nan")]))
