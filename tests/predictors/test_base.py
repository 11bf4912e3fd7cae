"""The declared predictor protocol: Union relies on SharedPattern, Fittable and FreshOutput."""

from __future__ import annotations

import torch

from sparsefinder.predictors import Distance, GlobalTokens, KMeans, Union, Window
from sparsefinder.predictors.base import (
    Fittable,
    FreshOutput,
    Predictor,
    SharedPattern,
    owns_output,
)


def test_built_in_predictors_declare_their_parts():
    for p in (Window(3), GlobalTokens()):
        assert isinstance(p, SharedPattern) and isinstance(p, Predictor)
    assert not isinstance(Distance(1.0), SharedPattern)
    assert isinstance(KMeans(4), Fittable) and not isinstance(Window(3), Fittable)
    assert all(owns_output(p) for p in (Distance(1.0), KMeans(4), Window(3), GlobalTokens()))


class _Diagonal:
    """A third-party shared pattern: declares shared_pattern, nothing else."""

    calls = 0

    def shared_pattern(self, n, m, device=None):
        _Diagonal.calls += 1
        return torch.eye(n, m, dtype=torch.bool, device=device)

    def predict(self, q, k, *, causal=False):
        raise AssertionError("Union must use shared_pattern, not predict")


class _Borrowed:
    """Returns the same tensor every time: no FreshOutput, so Union must not write into it."""

    def __init__(self, mask):
        self.mask = mask

    def predict(self, q, k, *, causal=False):
        return self.mask


def test_union_uses_the_protocol_not_attribute_probing():
    q = torch.randn(2, 4, 3)
    mask = Union(_Diagonal(), Window(1)).predict(q, q)
    assert torch.equal(mask, torch.eye(4, dtype=torch.bool).expand(2, -1, -1))
    assert _Diagonal.calls == 1
    borrowed = torch.zeros(2, 4, 4, dtype=torch.bool)
    assert not isinstance(_Borrowed(borrowed), FreshOutput)
    out = Union(_Borrowed(borrowed), Window(3)).predict(q, q)
    assert out.any() and not borrowed.any()  # the member's tensor was not modified


def test_union_fits_only_fittable_members():
    q = torch.randn(1, 30, 2)
    union = Union(KMeans(n_clusters=2, n_init=1), Window(3)).fit(q, q)
    assert union.predictors[0].centroids_ is not None
