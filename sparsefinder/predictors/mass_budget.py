"""Per-row key budgets from predicted mass, each head's total budget unchanged.

Why: :class:`~sparsefinder.predictors.row_fraction.RowFraction` gives every row of a head the
same share of its keys, but a row whose attention sits on two keys loses little when it keeps
few, and a row whose attention is spread loses much. Here the head keeps exactly as many pairs
as the row fraction would (``Σ_i ⌊f_h · allowed_i⌋``: the calibrated, model-level budget), but
splits them over its rows in proportion to each row's predicted number of keys that matter:
the perplexity ``exp(H(p_i))`` of ``p_i = softmax(−d_i / 2)`` over the row's allowed keys, ``d``
the projected squared distances. For projections trained with a logistic loss on the bilinear
logit (``lowrank-logistic``, ``lowrank-mass``) ``−d / 2`` is that logit up to a per-row
constant, so ``p_i`` is the predictor's own guess of the row's attention.

Cost: the distances, one softmax per row and a per-row partial sort, as the row fraction's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sparsefinder.attention.masks import allowed_key_range, layer_allowed
from sparsefinder.predictors.base import check_shapes
from sparsefinder.predictors.distance import pairwise_sq_dist
from sparsefinder.predictors.row_fraction import check_fractions

_BISECTION_STEPS = 64


def split_budget(need: Tensor, total: Tensor, cap: Tensor) -> Tensor:
    """Each head's ``total`` keys split over its rows in proportion to ``need``.

    ``need`` (heads, rows) ≥ 0, ``total`` (heads,) integers, ``cap`` (rows,) or (heads, rows):
    the most keys each row can take. Returns counts (heads, rows), long, in ``[0, cap]``, that
    sum to ``min(total, Σ cap)`` for every head exactly (the budget is kept), each row taking at
    least one key where the total covers one per row. Counts are ``⌊λ · need⌋`` clamped to the
    row's bounds, ``λ`` the largest scale keeping the sum within the total (bisection); the rest
    goes one key each to the rows with the largest remainders."""
    need = need.double().clamp_min(0.0)
    heads, rows = need.shape
    cap = cap.long().expand(heads, rows)
    total = torch.minimum(total.long(), cap.sum(-1))
    lo = (total >= (cap > 0).sum(-1)).long()[:, None].expand(heads, rows).minimum(cap)

    def counts(scale: Tensor) -> tuple[Tensor, Tensor]:
        raw = scale[:, None] * need
        return torch.maximum(raw.floor().long(), lo).minimum(cap), raw - raw.floor()

    low = torch.zeros(heads, dtype=torch.float64, device=need.device)
    positive = need > 0
    smallest = torch.where(positive, need, torch.inf).amin(-1).clamp_min(1e-300)
    high = (cap.amax(-1).double() + 1.0) / smallest  # every positive row at its cap
    high = torch.where(positive.any(-1), high, low)
    for _ in range(_BISECTION_STEPS):
        mid = (low + high) / 2
        fits = counts(mid)[0].sum(-1) <= total
        low, high = torch.where(fits, mid, low), torch.where(fits, high, mid)
    out, remainder = counts(low)
    missing = total - out.sum(-1)
    while bool((missing > 0).any()):
        room = out < cap
        order = torch.where(room, remainder, -torch.inf).argsort(-1, descending=True)
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(
            rows, device=need.device).expand(heads, rows).contiguous())
        out = out + (room & (rank < missing[:, None])).long()
        missing = total - out.sum(-1)
    return out


def predicted_need(dist: Tensor) -> Tensor:
    """``exp(H(softmax(−dist / 2)))`` per row (the predicted number of keys that matter), over
    the finite entries of ``dist`` (heads, n, m); rows with no finite entry read 0."""
    logits = -dist.double() / 2
    finite = torch.isfinite(logits)
    p = torch.softmax(logits.masked_fill(~finite, -torch.inf), -1).nan_to_num(0.0)
    entropy = -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)
    return torch.where(finite.any(-1), entropy.exp(), torch.zeros_like(entropy))


@dataclass
class MassRowBudget:
    """Head ``h`` keeps ``Σ_i ⌊fractions[h] · allowed_i⌋`` pairs (the row fraction's total),
    split over its rows by :func:`predicted_need`; each row keeps its nearest keys."""

    fractions: Tensor  # (heads,) in [0, 1]

    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput
    honours_window: ClassVar[bool] = True  # see base.WindowAware

    def __post_init__(self) -> None:
        check_fractions(self.fractions)

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False,
                sliding_window: int | None = None) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m)."""
        check_shapes(q, k)
        heads, n, m = q.shape[0], q.shape[1], k.shape[1]
        if heads != self.fractions.shape[0]:
            raise ValueError(f"fitted for {self.fractions.shape[0]} heads, got q with {heads}")
        _, allowed = allowed_key_range(n, m, causal=causal, sliding_window=sliding_window,
                                       device=q.device)
        allowed_mask = layer_allowed(n, m, causal=causal, sliding_window=sliding_window,
                                     device=q.device)
        fractions = self.fractions.to(q.device).double()[:, None]
        total = (fractions * allowed + 1e-9).floor().long().sum(-1)  # the row fraction's
        dist = pairwise_sq_dist(q, k)
        if allowed_mask is not None:
            dist = dist.masked_fill(~allowed_mask, torch.inf)
        keep = split_budget(predicted_need(dist), total, allowed.long())
        mask = torch.zeros(heads, n, m, dtype=torch.bool, device=q.device)
        widest = int(keep.max()) if keep.numel() else 0
        if widest == 0:
            return mask
        nearest = dist.topk(widest, dim=-1, largest=False, sorted=True).indices
        mask.scatter_(-1, nearest, torch.arange(widest, device=q.device) < keep[..., None])
        return mask if allowed_mask is None else mask & allowed_mask
