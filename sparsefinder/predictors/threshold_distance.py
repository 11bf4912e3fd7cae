"""Distance with one squared-distance threshold per head: the predictor a per-head calibration
(:mod:`sparsefinder.calibration.estimators`) fits; the same ``O(n·m·r)`` test as
:class:`~sparsefinder.predictors.Distance`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sparsefinder.attention.masks import apply_causal
from sparsefinder.predictors import distance_pass
from sparsefinder.predictors.base import check_shapes
from sparsefinder.predictors.distance import _partial_sq_dist


@dataclass
class ThresholdDistance:
    """Edge ``(i, j)`` of head ``h`` iff ``‖q'_i − k'_j‖² ≤ sq_thresholds[h]``.

    Squared thresholds may be negative (that head keeps nothing).
    """

    sq_thresholds: Tensor  # (heads,)

    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput

    def __post_init__(self) -> None:
        if not isinstance(self.sq_thresholds, Tensor) or self.sq_thresholds.dim() != 1:
            raise ValueError(
                "sq_thresholds must be a 1-d tensor with one squared distance per head, "
                f"got {getattr(self.sq_thresholds, 'shape', type(self.sq_thresholds).__name__)}"
            )
        if torch.isnan(self.sq_thresholds).any():
            raise ValueError("sq_thresholds contains NaN; calibrate on train records first")

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m)."""
        check_shapes(q, k)
        if q.shape[0] != self.sq_thresholds.shape[0]:
            raise ValueError(
                f"calibrated for {self.sq_thresholds.shape[0]} heads, got q with {q.shape[0]}"
            )
        if distance_pass.applies(q, k):  # one compiled pass on a CPU
            return distance_pass.threshold_pass(q, k, self.sq_thresholds, causal=causal)
        partial, qq = _partial_sq_dist(q, k)
        t2 = self.sq_thresholds.to(device=partial.device, dtype=partial.dtype)[:, None, None]
        return apply_causal(partial <= t2 - qq, causal)
