"""Top-p (nucleus) selection over the attention probabilities: an oracle.

Every query keeps its keys in decreasing probability until they hold a share ``p`` of the
row's probability mass (the key that crosses ``p`` is kept; keys with probability 0 never
are). Like :class:`~sparsefinder.predictors.topk.TopK` it reads the ORIGINAL queries and
keys (heads, n, d) and computes all n·m scores, so it saves no work: it is an oracle showing
what a method that keeps "the keys carrying most of the attention" could reach. Flags for
callers: ``needs_full_scores = True``, ``uses_projections = False``.

Which probabilities: the gold graph is the support of α-entmax, so top-p runs over the
α-entmax probabilities (α = 1.5 by default, the default model's), computed here from
``q·kᵀ·scale`` with ``scale = 1/√d`` (the standard attention scaling; ``scale`` overrides
it). With the model's own vectors, α and scaling, ``p = 1`` gives back exactly the gold
graph, and a smaller ``p`` drops the low-probability tail first: recall against the gold
graph then falls while the kept attention mass stays ≥ p (by construction). ``alpha = 1``
(softmax) is allowed; its probabilities are dense, so ``p = 1`` keeps every key.

Ties are broken towards lower key indices. With ``causal=True`` future keys get probability
0 and are never kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sparsefinder.attention.entmax_ops import entmax_normalize, validate_alpha
from sparsefinder.attention.masks import causal_mask
from sparsefinder.predictors.base import check_shapes
from sparsefinder.predictors.routed_kmeans import descending_order


@dataclass
class TopP:
    """Edge iff key j is in the smallest top-probability set of query i holding mass ``p``."""

    p: float
    alpha: float = 1.5
    scale: float | None = None
    needs_full_scores: ClassVar[bool] = True
    uses_projections: ClassVar[bool] = False
    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput

    def __post_init__(self) -> None:
        if isinstance(self.p, bool) or not isinstance(self.p, int | float) or not (
            0.0 < self.p <= 1.0
        ):
            raise ValueError(f"p must be a probability mass in (0, 1], got {self.p!r}")
        self.alpha = validate_alpha(self.alpha)
        if self.scale is not None and not (
            isinstance(self.scale, int | float) and math.isfinite(self.scale) and self.scale > 0
        ):
            raise ValueError(f"scale must be None (1/√d) or a positive number, got {self.scale!r}")

    def probabilities(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """α-entmax probabilities (heads, n, m) of ``q·kᵀ·scale`` (future masked if causal)."""
        check_shapes(q, k)
        dtype = torch.promote_types(q.dtype, torch.float32)
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        scores = torch.matmul(q.to(dtype), k.to(dtype).transpose(-1, -2)) * scale
        allowed = causal_mask(q.shape[1], k.shape[1], q.device) if causal else None
        return entmax_normalize(scores, self.alpha, allowed)

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, d), k: (heads, m, d) ORIGINAL vectors → bool (heads, n, m)."""
        check_shapes(q, k)
        heads, n, m = q.shape[0], q.shape[1], k.shape[1]
        if n == 0 or m == 0:
            return torch.zeros(heads, n, m, dtype=torch.bool, device=q.device)
        probs = self.probabilities(q, k, causal=causal)
        order = descending_order(probs)
        ranked = probs.gather(-1, order)
        before = ranked.cumsum(-1) - ranked  # mass of the strictly better-ranked keys
        keep = (before < self.p) & (ranked > 0)
        return torch.zeros_like(keep).scatter_(-1, order, keep)
