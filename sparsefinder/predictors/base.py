"""The one interface every graph predictor shares (scikit-learn spirit).

Shapes: ``q`` is ``(heads, n, r)`` and ``k`` is ``(heads, m, r)`` — projected queries/keys of
one text (no padding inside; a record is one text). ``predict`` returns a bool mask
``(heads, n, m)`` where True means "this query–key pair is kept". With ``causal=True`` the
future (j > i) is always False.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor


@runtime_checkable
class Predictor(Protocol):
    """Predicts an attention graph from (projected) queries and keys."""

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m)."""
        ...


def causal_mask(n: int, m: int, device: torch.device | None = None) -> Tensor:
    """Bool (n, m) with True where key j is not in the future of query i.

    For m > n (keys include a prefix) query i sees keys j <= i + (m - n).
    """
    offset = m - n
    return torch.ones(n, m, dtype=torch.bool, device=device).tril(diagonal=offset)


def apply_causal(mask: Tensor, causal: bool) -> Tensor:
    """Masks the future in a (heads, n, m) prediction when ``causal``."""
    if not causal:
        return mask
    n, m = mask.shape[-2:]
    return mask & causal_mask(n, m, mask.device)


def check_shapes(q: Tensor, k: Tensor) -> None:
    """Fail early with a message naming the bad input, not deep inside a matmul."""
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(
            f"expected q (heads, n, r) and k (heads, m, r), got shapes {tuple(q.shape)} "
            f"and {tuple(k.shape)}; add a leading heads axis for a single head"
        )
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree on heads and dimension"
        )
