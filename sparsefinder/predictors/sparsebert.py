"""SparseBERT baselines (Shi et al., "SparseBERT: Rethinking the importance analysis in
self-attention"): no diagonal, and a static per-head mask learned from training graphs.

``NoDiagonal(predictor)`` — the paper finds attention of a token to itself the least
important and drops it (§3.2). It wraps any predictor and removes query i's own key
``i + (m - n)`` (the diagonal i == j for self-attention, where m == n).

``StaticMask(kind, target_sparsity)`` — a fixed mask per head, the same for every text,
in the spirit of the Differentiable Attention Mask (DAM, §4):

- ``kind="structured"`` (DAMs): one decision per relative offset δ = j − i, shared along
  each diagonal, for δ ∈ [−(L−1), L−1] with L the longest training text;
- ``kind="unstructured"`` (DAMu): one decision per absolute position pair (i, j) < L.

How this differs from the paper: there the mask is a learned gate (Gumbel-sigmoid of a
parameter per position) trained *end to end with BERT pre-training*, its sparsity steered
indirectly by an L1 penalty λ‖M‖₁, and DAMs also forces the first/last rows and columns on.
Here nothing is trained with the model: ``fit`` reads gold α-entmax graphs of a training
sample and ranks positions by their training *edge frequency* — edges seen at that
position/offset divided by how often the position/offset occurs (e.g. offset δ occurs
n − |δ| times in an n-token text) — and keeps the most frequent ones until the target is
reached, so sparsity is set directly instead of through λ. Global first/last tokens are left
to ``Union(StaticMask(...), GlobalTokens())``, the same way window/global patterns are added
to every method.

The target, precisely: positions are kept in decreasing frequency (ties: smaller |j − i|
first, then lower index) until the *kept fraction* reaches ``1 - target_sparsity``, where the
kept fraction is the mean over the training graphs of the fraction of each graph's own grid
covered by kept positions (each graph weighs the same, as in ``metrics.macro_average``; the
grid is n_t × n_t, or its n_t(n_t+1)/2 non-future pairs when fitted with ``causal=True``).
With one training length n this is exactly the kept fraction of the n × n grid, and the
predicted sparsity at length n lies in ``(target − w, target]`` where w is one position's
share of the grid (1/n for an offset near 0, 1/n² for a pair). Positions never seen in
training (offsets or pairs beyond L) are never kept. The ranking does not depend on the
target, so ``target_sparsity`` may be changed after ``fit`` (a sweep needs one fit).

``predict(q, k)`` uses only the shapes of q and k. A ``StaticMask`` is fitted per layer:
gold masks (heads, n, n) of one layer, one tensor per text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from sparsefinder.attention.masks import apply_causal
from sparsefinder.predictors.base import Fittable, Predictor, check_shapes

_KINDS = ("structured", "unstructured")
_EPS = 1e-9  # slack on the cumulative kept fraction (float64 sums of many small shares)


class NoDiagonal:
    """Edge iff the wrapped predictor predicts it and j is not query i's own key."""

    def __init__(self, predictor: Predictor) -> None:
        if not isinstance(predictor, Predictor):
            raise ValueError(
                f"predictor must have a predict(q, k, causal=...) method, got {predictor!r}; "
                f"wrap a predictor instance, e.g. NoDiagonal(Window(3))"
            )
        self.predictor = predictor

    def __repr__(self) -> str:
        return f"NoDiagonal({self.predictor!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NoDiagonal) and self.predictor == other.predictor

    __hash__ = None  # mutable container, like the dataclass predictors

    def fit(self, *args: Any, **kwargs: Any) -> NoDiagonal:
        """Fits the wrapped predictor (same arguments as its own ``fit``)."""
        if not isinstance(self.predictor, Fittable):
            raise AttributeError(f"{type(self.predictor).__name__} has no fit(); nothing to fit")
        self.predictor.fit(*args, **kwargs)
        return self

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m)."""
        check_shapes(q, k)
        # A copy: the wrapped predictor's output is never modified in place.
        mask = self.predictor.predict(q, k, causal=causal).clone()
        n, m = mask.shape[-2:]
        mask.diagonal(offset=m - n, dim1=-2, dim2=-1).fill_(False)
        return mask


@dataclass(eq=False)
class StaticMask:
    """A fixed per-head mask: the training-frequent offsets (``structured``) or position
    pairs (``unstructured``), kept until ``target_sparsity`` is reached (see module doc).

    Learned attributes after ``fit``: ``max_length_`` (L), ``frequency_`` (heads, P) edge
    frequency per position (P = 2L−1 offsets, index δ + L − 1; or L² pairs, index i·L + j),
    ``share_`` (P,) each position's share of the mean training grid, ``rank_`` (heads, P)
    position's place in the keep order (P for positions never seen), ``cum_share_`` (heads,
    P) share kept before each place, and ``causal_``.
    """

    kind: str
    target_sparsity: float
    max_length_: int | None = field(default=None, init=False)
    frequency_: Tensor | None = field(default=None, init=False, repr=False)
    share_: Tensor | None = field(default=None, init=False, repr=False)
    rank_: Tensor | None = field(default=None, init=False, repr=False)
    cum_share_: Tensor | None = field(default=None, init=False, repr=False)
    causal_: bool | None = field(default=None, init=False)
    _keep_cache: tuple[float, Tensor] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"kind must be 'structured' or 'unstructured', got {self.kind!r}")
        self._check_target()

    def _check_target(self) -> None:
        t = self.target_sparsity
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t < 1:
            raise ValueError(
                f"target_sparsity must be a number in [0, 1), got {t!r}; "
                f"e.g. 0.9 keeps about 10% of the positions"
            )

    # -- fit -----------------------------------------------------------------------------

    def fit(self, gold_masks: Sequence[Tensor] | Tensor, *, causal: bool = False) -> StaticMask:
        """Learn the ranking from gold graphs of one layer: a list of bool (heads, n, n), one
        per text (lengths may differ), or one tensor (heads, n, n) / (texts, heads, n, n).

        ``causal=True`` for decoder graphs: only non-future positions are candidates and the
        grid of a text is its n(n+1)/2 non-future pairs.
        """
        golds = self._check_golds(gold_masks)
        heads = golds[0].shape[0]
        length = max(g.shape[-1] for g in golds)
        structured = self.kind == "structured"
        n_pos = 2 * length - 1 if structured else length * length
        edges = torch.zeros(heads, n_pos, dtype=torch.float64)
        occurs = torch.zeros(n_pos, dtype=torch.float64)
        share = torch.zeros(n_pos, dtype=torch.float64)
        for gold in golds:
            n = gold.shape[-1]
            allowed = torch.ones(n, n, dtype=torch.bool)
            if causal:
                allowed = allowed.tril()
            g = (gold.detach().to("cpu") & allowed).flatten(1).to(torch.float64)
            pos = self._positions(n, length).flatten()
            edges.index_add_(1, pos, g)
            occ = torch.zeros(n_pos, dtype=torch.float64)
            occ.index_add_(0, pos, allowed.flatten().to(torch.float64))
            occurs += occ
            share += occ / (n * (n + 1) // 2 if causal else n * n)
        share /= len(golds)
        frequency = torch.where(occurs > 0, edges / occurs.clamp(min=1), 0.0)

        # Keep order: frequency descending, ties by |δ| then index; unseen positions last.
        delta = self._deltas(length)
        base = torch.argsort(delta.abs() * (n_pos + 1) + torch.arange(n_pos), stable=True)
        key = torch.where(share > 0, frequency, -1.0)[:, base]
        order = base[torch.argsort(-key, dim=1, stable=True)]  # (heads, P) positions
        cum = torch.cumsum(share[order], dim=1)
        rank = torch.empty_like(order)
        rank.scatter_(1, order, torch.arange(n_pos).expand(heads, -1).contiguous())
        # Positions that never occur in training are never kept: rank P is past any prefix.
        rank = rank.masked_fill(share == 0, n_pos).to(torch.int32)

        self.max_length_ = length
        self.frequency_ = frequency
        self.share_ = share
        self.rank_ = rank
        self.cum_share_ = cum - share[order]  # share kept before each place
        self.causal_ = causal
        self._keep_cache = None
        return self

    @staticmethod
    def _check_golds(gold_masks: Sequence[Tensor] | Tensor) -> list[Tensor]:
        if isinstance(gold_masks, Tensor):
            gold_masks = [gold_masks] if gold_masks.dim() == 3 else list(gold_masks)
        golds = list(gold_masks)
        if not golds:
            raise ValueError("gold_masks is empty; pass at least one bool (heads, n, n) graph")
        heads = None
        for i, g in enumerate(golds):
            if not isinstance(g, Tensor) or g.dtype != torch.bool:
                got = g.dtype if isinstance(g, Tensor) else type(g).__name__
                raise ValueError(
                    f"gold_masks[{i}] must be a bool tensor (heads, n, n), got {got}; "
                    f"for probabilities pass `probs > 0`"
                )
            if g.dim() != 3 or g.shape[1] != g.shape[2] or g.shape[1] == 0:
                raise ValueError(
                    f"gold_masks[{i}] must have shape (heads, n, n) with n >= 1, "
                    f"got {tuple(g.shape)}"
                )
            if heads is None:
                heads = g.shape[0]
            elif g.shape[0] != heads:
                raise ValueError(
                    f"gold_masks[{i}] has {g.shape[0]} heads but gold_masks[0] has {heads}; "
                    f"fit one StaticMask per layer"
                )
        return golds

    def _deltas(self, length: int) -> Tensor:
        """Offset j − i of every position index."""
        if self.kind == "structured":
            return torch.arange(2 * length - 1) - (length - 1)
        ij = torch.arange(length)
        return (ij[None, :] - ij[:, None]).flatten()

    def _positions(self, n: int, length: int) -> Tensor:
        """Position index of every cell of an n × n grid: LongTensor (n, n)."""
        ij = torch.arange(n)
        if self.kind == "structured":
            return ij[None, :] - ij[:, None] + (length - 1)
        return ij[:, None] * length + ij[None, :]

    # -- predict -------------------------------------------------------------------------

    def keep(self) -> Tensor:
        """Kept positions at the current ``target_sparsity``: bool (heads, P)."""
        if self.rank_ is None:
            raise RuntimeError("this StaticMask is not fitted; call fit(gold_masks) first")
        self._check_target()
        target = float(self.target_sparsity)
        if self._keep_cache is not None and self._keep_cache[0] == target:
            return self._keep_cache[1]  # read-only by convention, like the learned attributes
        goal = torch.full((self.cum_share_.shape[0], 1), 1.0 - target - _EPS, dtype=torch.float64)
        # Places whose share-before is below the goal: the shortest prefix reaching it.
        n_keep = torch.searchsorted(self.cum_share_, goal).to(torch.int32)  # (heads, 1)
        keep = self.rank_ < n_keep
        self._keep_cache = (target, keep)
        return keep

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m). Only shapes are used."""
        check_shapes(q, k)
        keep = self.keep()
        heads, n, m = q.shape[0], q.shape[1], k.shape[1]
        if heads != keep.shape[0]:
            raise ValueError(
                f"this StaticMask was fitted on {keep.shape[0]} heads but q has {heads}; "
                f"fit one StaticMask per layer"
            )
        length = self.max_length_
        if self.kind == "structured":
            mask = self._toeplitz(keep, n, m, length)
        else:
            mask = torch.zeros(heads, n, m, dtype=torch.bool)
            grid = keep.view(heads, length, length)
            # Query i is absolute position a = i + (m - n); keys are 0..m-1.
            lo, hi, cols = max(0, m - n), min(m, length), min(m, length)
            if hi > lo and cols > 0:
                mask[:, lo - (m - n) : hi - (m - n), :cols] = grid[:, lo:hi, :cols]
        return apply_causal(mask.to(q.device), causal)

    @staticmethod
    def _toeplitz(keep: Tensor, n: int, m: int, length: int) -> Tensor:
        """mask[h, i, j] = keep[h, δ + L − 1] with δ = j − (i + m − n), False for |δ| ≥ L."""
        heads = keep.shape[0]
        if n == 0 or m == 0:
            return torch.zeros(heads, n, m, dtype=torch.bool)
        # v[t] is offset δ = t − (m − 1), t = 0 .. n + m − 2.
        deltas = torch.arange(n + m - 1) - (m - 1)
        inside = deltas.abs() <= length - 1
        v = torch.zeros(heads, n + m - 1, dtype=torch.bool)
        v[:, inside] = keep[:, deltas[inside] + length - 1]
        # Row i' = n − 1 − i reads v[i' + j]: a strided view, then flip the rows (one copy).
        flipped = v.as_strided((heads, n, m), (v.stride(0), 1, 1))
        return flipped.flip(1)
