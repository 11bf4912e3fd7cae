"""Longformer baseline (Beltagy et al., 2020; Sparsefinder paper §5 and appendix C).

A sliding window plus a few *global* tokens: a global token attends to every key and every
query attends to it, so its whole row and column are edges. Longformer picks global tokens
by task (e.g. [CLS]); as a content-free baseline, Sparsefinder draws them at random and sweeps
their number, ``n_global`` ∈ {4, 8, 12, 16, 20} (appendix C), with a window added to every
method.

Choices made here:

- The global tokens are drawn *without* replacement (exactly ``min(n_global, m)`` of them;
  the authors' simulation draws with replacement, so collisions give fewer) with a
  ``torch.Generator`` seeded by ``seed``: the same seed and length always give the same
  tokens, and a different seed gives (almost surely) different ones.
- They are the same in every head, as in Longformer, where being global is a property of
  the token (the authors' simulation also draws once per text, shared by the heads).
- Global token p is key ``p`` and query ``p - (m - n)``: queries are aligned with the last
  n keys, the convention of ``masks.causal_mask`` (for self-attention, m == n).
- ``window`` has the meaning of ``Window(size)``: edge iff ``|i - j| <= window // 2``.
- ``causal=True`` cuts the future afterwards: a global query still sees only its past.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sparsefinder.attention.masks import apply_causal, window_band
from sparsefinder.predictors.base import check_shapes


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass
class Longformer:
    """Edge iff ``|i - j| <= window // 2``, or query i or key j is one of ``n_global``
    random global tokens (the same tokens in every head)."""

    window: int
    n_global: int
    seed: int = 0

    def __post_init__(self) -> None:
        _check_int("window", self.window, 0)
        _check_int("n_global", self.n_global, 0)
        _check_int("seed", self.seed, 0)

    def global_tokens(self, m: int) -> Tensor:
        """Sorted positions (keys) of the ``min(n_global, m)`` global tokens of an m-token text."""
        gen = torch.Generator().manual_seed(self.seed)
        return torch.randperm(m, generator=gen)[: min(self.n_global, m)].sort().values

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m). Only shapes matter."""
        check_shapes(q, k)
        heads, n, m = q.shape[0], q.shape[1], k.shape[1]
        base = window_band(n, m, self.window, q.device)
        cols = self.global_tokens(m).to(q.device)
        rows = cols - (m - n)
        rows = rows[(rows >= 0) & (rows < n)]
        base[:, cols] = True
        base[rows, :] = True
        # A real copy per head, so that callers may modify one head in place.
        mask = base.expand(heads, n, m).contiguous()
        return apply_causal(mask, causal)
