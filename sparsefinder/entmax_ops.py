"""α-entmax over attention scores, with exactly-zero probabilities outside ``allowed``.

The public entry point is :func:`entmax_normalize`. It dispatches on α exactly as the
``entmax`` package suggests: α=1 → softmax (dense), α=1.5 → ``entmax15``, α=2 → ``sparsemax``,
any other α>1 → ``entmax_bisect``.
"""

from __future__ import annotations

import math

import torch
from entmax import entmax15, entmax_bisect, sparsemax
from torch import Tensor

# A finite "minus infinity": entmax's sort-and-cumsum threshold algorithm turns -inf into NaN,
# and any score this far below the row maximum is outside every α>1 support anyway.
_MASKED = -1e9


def validate_alpha(alpha: object) -> float:
    """Return α as a float or raise a ValueError that says what is accepted."""
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise ValueError(f"alpha must be a number >= 1 (1 = softmax, 1.5 = entmax15), got {alpha!r}")
    value = float(alpha)
    if not math.isfinite(value) or value < 1.0:
        raise ValueError(
            f"alpha must be >= 1 (1 = softmax, 1.5 = entmax15, 2 = sparsemax), got {alpha!r}"
        )
    return value


def entmax_normalize(scores: Tensor, alpha: float, allowed: Tensor | None = None) -> Tensor:
    """α-entmax over the last axis; entries where ``allowed`` is False get probability 0.

    ``allowed`` broadcasts against ``scores`` (e.g. padding/causal mask of shape (b, 1, n, m)).
    """
    if allowed is not None:
        scores = scores.masked_fill(~allowed, _MASKED)
    if alpha == 1.0:
        probs = torch.softmax(scores, dim=-1)
    elif alpha == 1.5:
        probs = entmax15(scores, dim=-1)
    elif alpha == 2.0:
        probs = sparsemax(scores, dim=-1)
    else:
        probs = entmax_bisect(scores, alpha=alpha, dim=-1)
    if allowed is not None:
        # Exact zeros for masked keys, whatever the rounding of the normaliser.
        probs = probs.masked_fill(~allowed, 0.0)
    return probs
