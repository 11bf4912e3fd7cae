"""HashAttention-style learned binary codes (Desai et al., 2024, "HashAttention: Semantic
Sparsity for Faster Inference"): a cheap learned bucketing baseline.

Per head, two learned linear maps send queries and keys to ``bits``-bit signatures
``c(q) = sign(q·W_q)`` and ``c(k) = sign(k·W_k)``; a query keeps the keys whose signature is
within Hamming distance ``max_distance`` of its own. Comparing signatures costs O(n·m·bits)
bit operations (here one ±1 matmul, ``c(q)·c(k) = bits − 2·Hamming``), far less than QKᵀ in a
kernel with packed bits; the maps read the model's ORIGINAL q/k, as HashAttention does.

Training (:func:`sparsefinder.projections.hash_fit.fit_hash_codes`) uses the same gold graphs
as the projections: for every head, gold edges are positives and random allowed (non-future)
pairs negatives, and a logistic loss on the relaxed similarity
``s = mean_b tanh(q·W_q)_b · tanh(k·W_k)_b`` (a smooth stand-in for ``1 − 2·Hamming/bits``;
logit ``a_h·s + c_h``) is minimised with Adam.
HashAttention trains small MLPs with a similar relaxation and keeps the top-k keys by
Hamming similarity; we keep one linear map per side (a ``bits × d`` matrix, the cheapest
learned hash) and a distance threshold, which sweeps sparsity the same way.
The maps start from one shared Gaussian matrix (SimHash of the q·k angle), so even before
training queries and keys with a large inner product tend to share bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sparsefinder.attention.masks import apply_causal
from sparsefinder.predictors.base import check_shapes

HASH_BITS = 16


@dataclass
class HammingCodes:
    """Edge iff the Hamming distance of the query's and the key's signatures is small."""

    w_query: Tensor  # (heads, d, bits)
    w_key: Tensor  # (heads, d, bits)
    max_distance: int
    returns_fresh_mask = True

    def __post_init__(self) -> None:
        if self.w_query.shape != self.w_key.shape or self.w_query.dim() != 3:
            raise ValueError(f"w_query {tuple(self.w_query.shape)} and w_key "
                             f"{tuple(self.w_key.shape)} must both be (heads, d, bits)")
        bits = self.w_query.shape[-1]
        value = self.max_distance
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= bits:
            raise ValueError(f"max_distance must be an integer in [0, {bits}], got {value!r}")

    def signatures(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """±1 codes of queries (heads, n, bits) and keys (heads, m, bits)."""
        check_shapes(q, k)
        if q.shape[0] != self.w_query.shape[0] or q.shape[-1] != self.w_query.shape[1]:
            raise ValueError(f"hash maps are for (heads, d) = {tuple(self.w_query.shape[:2])}, "
                             f"got q of shape {tuple(q.shape)}; fit them on this model")
        wq, wk = self.w_query.to(q.device, torch.float32), self.w_key.to(q.device, torch.float32)
        one = torch.ones((), device=q.device)
        return (torch.where(q.float() @ wq >= 0, one, -one),
                torch.where(k.float() @ wk >= 0, one, -one))

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, d), k: (heads, m, d) → bool (heads, n, m)."""
        cq, ck = self.signatures(q, k)
        bits = cq.shape[-1]
        agreement = cq @ ck.transpose(-1, -2)  # bits − 2·Hamming, exact in float32
        return apply_causal(agreement >= bits - 2 * self.max_distance, causal)
