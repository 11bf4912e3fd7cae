"""Global tokens (paper §4.7): the first/last tokens (e.g. [CLS]/[SEP]) attend and are
attended everywhere, a pattern many heads learn as a "no-op" sink."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sparsefinder.attention.masks import apply_causal
from sparsefinder.predictors.base import check_shapes


@dataclass
class GlobalTokens:
    """Whole rows and columns of the first and/or last token are edges.

    The first/last query is query 0 / n-1 and the first/last key is key 0 / m-1; these are
    the real ends of the text, since inputs are unpadded. With both flags False it predicts
    nothing (handy as a toggle).
    """

    first: bool = True
    last: bool = True

    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput

    def __post_init__(self) -> None:
        for name in ("first", "last"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")

    def shared_pattern(self, n: int, m: int, device: torch.device | None = None) -> Tensor:
        """The same-for-every-head mask, bool (n, m); lets ``Union`` skip a per-head copy."""
        mask = torch.zeros(n, m, dtype=torch.bool, device=device)
        if n and m:
            if self.first:
                mask[0, :] = True
                mask[:, 0] = True
            if self.last:
                mask[-1, :] = True
                mask[:, -1] = True
        return mask

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m)."""
        check_shapes(q, k)
        mask = apply_causal(self.shared_pattern(q.shape[1], k.shape[1], q.device), causal)
        # A real copy per head, so that callers may modify one head in place.
        return mask.expand(q.shape[0], -1, -1).contiguous()
