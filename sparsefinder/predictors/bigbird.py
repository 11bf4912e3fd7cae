"""BigBird baseline (Zaheer et al., 2020; Sparsefinder paper §5 and appendix C).

Window + global + random: a sliding window, the first and last tokens as global tokens
(their whole rows and columns), and ``n_random`` random keys per query. Sparsefinder uses
blocks of size 1 (single tokens) and sweeps ``n_random`` ∈ {2, 4, 6, 8, 10} (appendix C).

Choices made here:

- Random keys are drawn independently for every head and every query, uniformly *without*
  replacement from the whole sequence (Floyd's algorithm, vectorized over heads and queries),
  with a ``torch.Generator`` seeded by ``seed``. Each query thus gets exactly
  ``min(n_random, #candidates)`` distinct random keys; since they may land on window or
  global keys (the original excludes those), a row has *at most* ``n_random`` edges beyond
  the window/global pattern.
- With ``causal=True`` the candidates of query i are the keys it may see (``j <= i + m - n``),
  so a decoder row still gets ``min(n_random, i + m - n + 1)`` random keys instead of losing
  about half of them to the future; the future is then cut from the window/global part.
- ``window`` has the meaning of ``Window(size)``: edge iff ``|i - j| <= window // 2``.
- Same seed and shapes → same graph; a different seed → (almost surely) a different graph.
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


def sample_distinct(gen: torch.Generator, heads: int, population: Tensor, size: int) -> Tensor:
    """For every head and row i, ``min(size, population[i])`` distinct integers drawn
    uniformly from ``[0, population[i])``, as LongTensor (heads, rows, size), -1 in unused slots.

    Floyd's algorithm: for s = 0..size-1, with j = N - size + s, draw t uniform in [0, j]; take
    t unless already taken, else take j. The loop runs over the ``size`` draws, never over
    tokens. Rows with N < size skip the steps with j < 0 and end up with all N integers.
    """
    rows = population.shape[0]
    if size <= 0 or rows == 0:
        return torch.full((heads, rows, max(size, 0)), -1, dtype=torch.long)
    # Step s draws t uniform in [0, j_s], j_s = N - size + s: all draws at once, then the loop
    # only resolves collisions, in (size, heads, rows) so each step reads a contiguous slab.
    j = population.to(torch.long)[None, :] - size + torch.arange(size)[:, None]  # (size, rows)
    u = torch.rand((size, heads, rows), generator=gen, dtype=torch.float64)
    t = torch.minimum((u * (j + 1).clamp(min=1)[:, None, :]).long(), j.clamp(min=0)[:, None, :])
    t, j = t.to(torch.int32), j.to(torch.int32)  # half the bytes for the comparisons below
    chosen = torch.empty((size, heads, rows), dtype=torch.int32)
    skipped = j < 0  # rows with N < size skip their first steps
    for s in range(size):
        draw = t[s]
        if s:
            taken = (chosen[:s] == draw).any(0)
            draw = torch.where(taken, j[s], draw)  # j_s is never taken before step s
        if skipped[s].any():
            draw = draw.masked_fill(skipped[s], -1)
        chosen[s] = draw
    return chosen.permute(1, 2, 0).long()


@dataclass
class BigBird:
    """Edge iff ``|i - j| <= window // 2``, or i or j is the first/last token, or j is one of
    query i's ``n_random`` random keys (drawn per head and query)."""

    window: int
    n_random: int
    seed: int = 0

    def __post_init__(self) -> None:
        _check_int("window", self.window, 0)
        _check_int("n_random", self.n_random, 0)
        _check_int("seed", self.seed, 0)

    def _population(self, n: int, m: int, causal: bool) -> Tensor:
        if causal:
            return (torch.arange(n) + (m - n) + 1).clamp(0, m)
        return torch.full((n,), m, dtype=torch.long)

    def random_keys(self, heads: int, n: int, m: int, *, causal: bool = False) -> Tensor:
        """The random keys: LongTensor (heads, n, n_random), -1 where a row has fewer
        candidates than ``n_random``. Deterministic given (seed, heads, n, m, causal)."""
        gen = torch.Generator().manual_seed(self.seed)
        return sample_distinct(gen, heads, self._population(n, m, causal), self.n_random)

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m). Only shapes matter."""
        check_shapes(q, k)
        heads, n, m = q.shape[0], q.shape[1], k.shape[1]
        base = window_band(n, m, self.window, q.device)
        if n and m:
            base[0, :] = True
            base[-1, :] = True
            base[:, 0] = True
            base[:, -1] = True
        # A real copy per head: the random keys differ between heads.
        mask = base.expand(heads, n, m).contiguous()
        if n and m and self.n_random:
            keys = self.random_keys(heads, n, m, causal=causal).to(q.device)
            # Unused slots (-1) point at key 0, which every row already has (global); a
            # future key 0 (only when m < n) is cut below with the rest of the future.
            mask.scatter_(2, keys.clamp(min=0), True)
        return apply_causal(mask, causal)
