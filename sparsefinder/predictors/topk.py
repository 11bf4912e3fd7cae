"""Top-k selective attention (Zhao et al., "Explicit Sparse Transformer"): an oracle.

Every query keeps its k highest-scoring keys of the *full* score matrix QKᵀ (Zhao et al.
§4.1: the mask keeps the k largest entries of each row). Unlike the other predictors this
one needs the ORIGINAL queries and keys (heads, n, d), not the low-dimensional projections,
and it computes all n·m scores, so it saves no work: it is an oracle, bounded only by the
score matrix itself, showing how well *any* method that keeps a fixed number of keys per
query could do. The method registry (``sparsefinder.methods.spec``) declares that it reads the
original vectors (``inputs="original"``).

Ties are broken deterministically: scores strictly above the k-th largest are kept, and
among the keys tied with it the lowest key indices are kept, so every row has exactly
``min(k, allowed)`` keys. With ``causal=True`` only the keys a query may see are candidates
(a decoder row i keeps ``min(k, i + m - n + 1)`` keys). The scale 1/√d of attention does not
change a ranking and is left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sparsefinder.attention.masks import layer_allowed
from sparsefinder.predictors.base import check_shapes


@dataclass
class TopK:
    """Edge iff key j is among the k highest scores ``q_i · k_j`` of query i (an oracle)."""

    k: int
    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput
    honours_window: ClassVar[bool] = True  # see base.WindowAware

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k must be an integer >= 1, got {self.k!r}")

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False,
                sliding_window: int | None = None) -> Tensor:
        """q: (heads, n, d), k: (heads, m, d) ORIGINAL vectors → bool (heads, n, m); the k
        keys are chosen among those the row may attend to (past, local window)."""
        check_shapes(q, k)
        heads, n, m = q.shape[0], q.shape[1], k.shape[1]
        if n == 0 or m == 0:
            return torch.zeros(heads, n, m, dtype=torch.bool, device=q.device)
        dtype = torch.promote_types(q.dtype, torch.float32)
        scores = q.to(dtype) @ k.to(dtype).transpose(-1, -2)
        allowed = layer_allowed(n, m, causal=causal, sliding_window=sliding_window,
                                device=q.device)
        if allowed is not None:
            scores.masked_fill_(~allowed, float("-inf"))
        kk = min(self.k, m)
        kth = scores.topk(kk, dim=-1, sorted=True).values[..., -1:]  # (heads, n, 1)
        mask = scores > kth
        tied = scores == kth
        need = kk - mask.sum(-1, keepdim=True)  # slots left for keys tied with the k-th
        over = tied.sum(-1, keepdim=True) > need
        if over.any():  # only rows with surplus ties need the (costly) running count
            rows = over[..., 0].nonzero(as_tuple=True)
            sub = tied[rows]
            sub &= sub.cumsum(-1) <= need[rows]
            tied[rows] = sub
        mask |= tied
        # Rows with fewer than k allowed keys took some -inf entries: cut them.
        return mask if allowed is None else mask & allowed
