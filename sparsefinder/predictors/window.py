"""Local window pattern (paper §4.7): many heads attend mostly to nearby tokens."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from sparsefinder.predictors.base import apply_causal, check_shapes


def band_mask(n: int, m: int, size: int, device: torch.device | None = None) -> Tensor:
    """Bool (n, m): True where ``|i - (j - (m - n))| <= size // 2``; all False for size 0.

    Query i is aligned with key ``i + (m - n)``, the same convention as ``base.causal_mask``
    (keys may include a prefix).
    """
    # A copy of a cached band: a slider move rebuilds the same band for every layer.
    return _cached_band(n, m, max(size, 0), torch.device(device or "cpu")).clone()


@lru_cache(maxsize=64)
def _cached_band(n: int, m: int, size: int, device: torch.device) -> Tensor:
    if size == 0:
        return torch.zeros(n, m, dtype=torch.bool, device=device)
    half = size // 2
    offset = m - n
    ones = torch.ones(n, m, dtype=torch.bool, device=device)
    return ones.tril(diagonal=offset + half).triu(diagonal=offset - half)


@dataclass
class Window:
    """Edge iff ``|i - j| <= size // 2``: a sliding window of ``size`` tokens centred on i.

    ``size=0`` predicts nothing, ``size=1`` the diagonal, ``size=3`` one neighbour each side.
    An even size behaves like the next odd size. Only shapes matter, not the q/k values.
    """

    size: int

    _fresh_mask = True  # predict() returns a new tensor the caller owns (see Union)

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"size must be an integer >= 0, got {self.size!r}")

    def shared_pattern(self, n: int, m: int, device: torch.device | None = None) -> Tensor:
        """The same-for-every-head mask, bool (n, m); lets ``Union`` skip a per-head copy."""
        return band_mask(n, m, self.size, device)

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m)."""
        check_shapes(q, k)
        band = apply_causal(self.shared_pattern(q.shape[1], k.shape[1], q.device), causal)
        # A real copy per head, so that callers may modify one head in place.
        return band.expand(q.shape[0], -1, -1).contiguous()
