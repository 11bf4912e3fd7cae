"""Per-row keep fraction: each query keeps the nearest ``⌊f_h · allowed⌋`` keys.

Why: a threshold shared by all rows of a head ignores that α-entmax thresholds every query
row at its own ``τ_i``, and its sparsity drifts with text length. Keeping a fixed FRACTION of
each row's allowed keys makes the sparsity of head ``h`` at least ``1 − f_h`` on every text,
whatever its length (just above: counts are rounded down), and follows each row's own
scale, which suits projections trained to rank a row's keys (the paper's hinge). The
fractions per head come from :class:`~sparsefinder.calibration.estimators.CalibratedRowFraction`
(fitted on train).

Cost: the ``O(n·m·r)`` distances plus a per-row partial sort (``topk``) — no bucketing, so
like :class:`~sparsefinder.predictors.Distance` it is a probe of the projected space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sparsefinder.attention.masks import allowed_key_range, layer_allowed
from sparsefinder.predictors.base import check_shapes
from sparsefinder.predictors.distance import pairwise_sq_dist


def check_fractions(fractions: Tensor) -> None:
    """One keep fraction per head, each in [0, 1], or an error saying which rule it breaks."""
    if not isinstance(fractions, Tensor) or fractions.dim() != 1:
        raise ValueError("fractions must be a 1-d tensor with one keep fraction per head")
    if torch.isnan(fractions).any() or (fractions < 0).any() or (fractions > 1).any():
        raise ValueError(f"fractions must lie in [0, 1], got {fractions.tolist()}")


@dataclass
class RowFraction:
    """Query ``i`` of head ``h`` keeps its ``⌊fractions[h] · allowed_i⌋`` nearest keys."""

    fractions: Tensor  # (heads,) in [0, 1]

    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput
    honours_window: ClassVar[bool] = True  # see base.WindowAware

    def __post_init__(self) -> None:
        check_fractions(self.fractions)

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False,
                sliding_window: int | None = None) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m); a local layer's rows keep
        their fraction of the window's keys, chosen inside it."""
        check_shapes(q, k)
        heads, n, m = q.shape[0], q.shape[1], k.shape[1]
        if heads != self.fractions.shape[0]:
            raise ValueError(f"fitted for {self.fractions.shape[0]} heads, got q with {heads}")
        mask = torch.zeros(heads, n, m, dtype=torch.bool, device=q.device)
        _, allowed = allowed_key_range(n, m, causal=causal, sliding_window=sliding_window,
                                       device=q.device)
        allowed_mask = layer_allowed(n, m, causal=causal, sliding_window=sliding_window,
                                     device=q.device)
        # floor: a row never keeps more than its fraction (sparsity >= 1 - f on every text)
        keep = (self.fractions.to(q.device).double()[:, None] * allowed + 1e-9).floor().long()
        widest = int(keep.max()) if keep.numel() else 0
        if widest == 0:
            return mask
        dist = pairwise_sq_dist(q, k)
        if allowed_mask is not None:
            dist = dist.masked_fill(~allowed_mask, torch.inf)
        nearest = dist.topk(widest, dim=-1, largest=False, sorted=True).indices
        chosen = torch.arange(widest, device=q.device) < keep[..., None]
        mask.scatter_(-1, nearest, chosen)
        return mask if allowed_mask is None else mask & allowed_mask
