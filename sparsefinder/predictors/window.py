"""Local window pattern (paper §4.7): many heads attend mostly to nearby tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sparsefinder.attention.masks import apply_causal, window_band
from sparsefinder.predictors.base import check_shapes


@dataclass
class Window:
    """Edge iff ``|i - j| <= size // 2``: a sliding window of ``size`` tokens centred on i.

    ``size=0`` predicts nothing, ``size=1`` the diagonal, ``size=3`` one neighbour each side.
    An even size behaves like the next odd size. Only shapes matter, not the q/k values.
    """

    size: int

    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"size must be an integer >= 0, got {self.size!r}")

    def shared_pattern(self, n: int, m: int, device: torch.device | None = None) -> Tensor:
        """The same-for-every-head mask, bool (n, m); lets ``Union`` skip a per-head copy."""
        return window_band(n, m, self.size, device)

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m)."""
        check_shapes(q, k)
        band = apply_causal(self.shared_pattern(q.shape[1], k.shape[1], q.device), causal)
        # A real copy per head, so that callers may modify one head in place.
        return band.expand(q.shape[0], -1, -1).contiguous()
