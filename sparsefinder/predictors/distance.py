"""Distance-based pairing (paper §4.3): keep a pair when its projections are close.

Still quadratic in the number of tokens, but each comparison costs ``r`` (e.g. 4) instead of
the head dimension ``d`` (e.g. 64); it is also the cleanest probe of how good the learned
projection space is, since the bucketed variants can only lose recall relative to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sparsefinder.attention.masks import apply_causal
from sparsefinder.predictors import distance_pass
from sparsefinder.predictors.base import check_shapes


def pairwise_sq_dist(q: Tensor, k: Tensor) -> Tensor:
    """Squared Euclidean distances ``(heads, n, m)`` between rows of ``q`` and ``k``.

    Uses the expansion ``||q||² + ||k||² - 2 q·k`` (one batched matmul, in at least float32),
    clamped at 0 because rounding can make it slightly negative. Exposed so that a sweep over
    thresholds can compute the distances once.
    """
    partial, qq = _partial_sq_dist(q, k)
    return partial.add_(qq).clamp_(min=0.0)


def _partial_sq_dist(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """(``||k_j||² - 2 q_i·k_j`` as (heads, n, m), ``||q_i||²`` as (heads, n, 1))."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    q = q.to(dtype)
    k = k.to(dtype)
    qq = q.pow(2).sum(-1)[..., :, None]
    kk = k.pow(2).sum(-1)[..., None, :]
    return torch.baddbmm(kk, q, k.transpose(-1, -2), alpha=-2.0), qq


@dataclass
class Distance:
    """Edge ``(i, j)`` iff ``||q'_i - k'_j||_2 <= threshold``.

    Larger thresholds never remove edges, so sweeping ``threshold`` traces a sparsity–recall
    curve.
    """

    threshold: float

    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput

    def __post_init__(self) -> None:
        if not self.threshold >= 0:  # also rejects NaN
            raise ValueError(
                f"threshold must be >= 0, got {self.threshold}; pass a non-negative distance"
            )

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m)."""
        check_shapes(q, k)
        if distance_pass.applies(q, k):  # one compiled pass on a CPU
            t2 = torch.full((q.shape[0],), float(self.threshold) ** 2)
            return distance_pass.threshold_pass(q, k, t2, causal=causal)
        # d² <= t²  ⇔  ||k||² - 2 q·k <= t² - ||q||²: the per-query term moves to the right,
        # which saves a full (heads, n, m) pass; no clamp needed since t² >= 0.
        partial, qq = _partial_sq_dist(q, k)
        return apply_causal(partial <= float(self.threshold) ** 2 - qq, causal)
