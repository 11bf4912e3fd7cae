"""Sentence embeddings by mean pooling: what all-MiniLM-L6-v2 (sentence-transformers) does.

One function for the two places that pool: the adapter's distillation loss and fidelity
measure (:mod:`sparsefinder.adaptation`) and, per unpadded text, the accuracy measures
(:meth:`sparsefinder.evaluation.accuracy.EncodedTexts.embeddings`).
"""

from __future__ import annotations

from torch import Tensor


def mean_pool(states: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``states`` (..., n, dim) over the real tokens of ``mask`` (..., n): (..., dim).

    Not normalised: a cosine between two pooled vectors does not need it, and callers that
    rank by dot products normalise themselves. A row without real tokens pools to zeros.
    """
    weights = mask.to(states.dtype).unsqueeze(-1)
    return (states * weights).sum(-2) / weights.sum(-2).clamp_min(1)
