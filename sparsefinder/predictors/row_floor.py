"""A per-row floor: any predicted graph united with each query's ``m`` nearest keys.

Why: a threshold (raw or calibrated per head) keeps whatever lies within it, so a query
whose keys are all far in the projected space keeps nothing, and the restricted model
falls back to the diagonal for that row. The top-k oracle never leaves a row without
support, which is why it moves the model's output less than a threshold keeping more gold
edges. The floor gives every query its ``m`` nearest keys in the learned space (all of
them when fewer are allowed) on top of the base graph.

Only allowed keys are counted and chosen: a decoder row ``i`` has ``i + m_keys − n + 1``
candidates; a local (sliding-window) layer's row only those in its window
(:func:`~sparsefinder.attention.masks.layer_allowed`). The choice is one ``topk`` over the
rows (no loop), on ``‖k‖² − 2 q·k``: the row term ``‖q‖²`` does not change a row's ranking.

A floor of ``m`` keys costs ``m / n`` of a row of ``n`` allowed keys, so on short texts the
floor alone can be denser than a target sparsity allows. ``row_share`` caps it: row ``i``
keeps at most ``min(m, max(1, ⌊row_share · allowed_i⌋))`` floor keys (:func:`floor_counts`).
A calibrated floor passes ``row_share = floor_share · (1 − target_sparsity)``: the floor
never takes more than the share ``floor_share`` of the keys the target leaves each row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sparsefinder.attention.masks import allowed_key_range, layer_allowed
from sparsefinder.predictors import distance_pass
from sparsefinder.predictors.base import Predictor, check_shapes, honours_window, owns_output
from sparsefinder.predictors.distance import Distance, _partial_sq_dist
from sparsefinder.predictors.threshold_distance import ThresholdDistance


def floor_counts(floor: int, row_share: float | None, per_row: Tensor) -> Tensor:
    """Floor keys of each row: ``min(floor, max(1, ⌊row_share · allowed⌋), allowed)`` for the
    rows' allowed key counts ``per_row`` (any shape, integers); ``row_share`` None: no cap,
    ``min(floor, allowed)``. The predictor and its calibration both count with this."""
    per_row = per_row.long()
    if row_share is None:
        return per_row.clamp(max=int(floor))
    # the share is c · (1 − target) in floating point: 0.2 reads 0.19999999999999996, which
    # would floor 0.2 · 30 to 5; a rounding slack keeps ⌊(1 − t) · n⌋ exact
    capped = torch.floor(per_row.double() * float(row_share) + 1e-9).long().clamp(min=1)
    return capped.clamp(max=int(floor)).minimum(per_row)


def _check_row_share(row_share: float | None) -> None:
    if row_share is None:
        return
    if isinstance(row_share, bool) or not isinstance(row_share, int | float) or not (
            0 < row_share <= 1):
        raise ValueError(f"row_share must be None or a number in (0, 1], got {row_share!r}")


def add_row_floor(mask: Tensor, partial: Tensor, floor: int, allowed: Tensor | None, *,
                  short_rows_only: bool = False, row_share: float | None = None) -> Tensor:
    """``mask`` (heads, n, m) with each row's ``floor`` smallest ``partial`` entries among
    its allowed keys set True (in place; ``partial`` may be overwritten where not allowed).

    ``short_rows_only``: ``mask`` is a threshold on ``partial`` itself, so a row that already
    keeps ``floor`` keys keeps its ``floor`` nearest; only the rows keeping fewer are ranked
    (at a usual target, a few rows: the ``topk`` is then on those rows alone).
    ``row_share``: each row takes :func:`floor_counts` keys instead of ``floor``."""
    count = min(int(floor), partial.shape[-1])
    if count == 0 or partial.shape[-2] == 0:
        return mask
    counts: int | Tensor = count  # keys per row: one number, or (n,) with a row share
    if row_share is not None:
        n, m = partial.shape[-2:]
        per_row = (torch.full((n,), m, device=partial.device) if allowed is None
                   else allowed.sum(-1))
        counts = floor_counts(floor, row_share, per_row)
    if short_rows_only:
        # kept keys per row: bytes summed into int32 (a bool sum widens to int64 first,
        # ~4x slower on a CPU: it is a third of a slider move's floor)
        kept_per_row = mask.view(torch.uint8).sum(-1, dtype=torch.int32)
        heads, rows = (kept_per_row < counts).nonzero(as_tuple=True)
        if heads.numel() == 0:
            return mask
        sub = partial[heads, rows]  # (short rows, m)
        sub_allowed = None if allowed is None else allowed[rows]
        if sub_allowed is not None:
            sub.masked_fill_(~sub_allowed, torch.inf)
        wanted = counts if isinstance(counts, int) else counts[rows, None]
        kept = mask[heads, rows].scatter_(-1, _nearest(sub, wanted), True)
        mask[heads, rows] = kept if sub_allowed is None else kept & sub_allowed
        return mask
    if allowed is not None:
        partial.masked_fill_(~allowed, torch.inf)
    wanted = counts if isinstance(counts, int) else counts[:, None]
    mask.scatter_(-1, _nearest(partial, wanted), True)
    # rows with fewer than ``floor`` allowed keys took some +inf (disallowed) entries
    return mask if allowed is None else mask.logical_and_(allowed)


def _nearest(values: Tensor, counts: int | Tensor) -> Tensor:
    """Indices of each row's ``counts`` smallest ``values`` (last axis). A count per row
    (a tensor broadcasting against the rows): one sorted ``topk`` of the widest, and the
    positions past a row's own count point at its nearest key (always kept, every count
    being >= 1), so one ``scatter_`` sets them all."""
    if isinstance(counts, int):
        return values.topk(counts, dim=-1, largest=False, sorted=False).indices
    width = int(counts.max())
    nearest = values.topk(width, dim=-1, largest=False, sorted=True).indices
    position = torch.arange(width, device=values.device)
    return torch.where(position < counts, nearest, nearest[..., :1])


def _sq_thresholds(base: ThresholdDistance | Distance, heads: int) -> Tensor:
    """(heads,) squared thresholds of a distance predictor."""
    if isinstance(base, Distance):
        return torch.full((heads,), float(base.threshold) ** 2)
    if base.sq_thresholds.shape[0] != heads:
        raise ValueError(f"calibrated for {base.sq_thresholds.shape[0]} heads, got q with {heads}")
    return base.sq_thresholds


@dataclass
class RowFloor:
    """Edge iff ``base`` predicts it or key j is among the ``floor`` nearest allowed keys of
    query i in the projected space (``base`` None: the floor alone). ``row_share``: row i
    takes at most ``max(1, ⌊row_share · allowed_i⌋)`` floor keys (None: no cap)."""

    base: Predictor | None
    floor: int
    row_share: float | None = None

    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput
    honours_window: ClassVar[bool] = True  # see base.WindowAware

    def __post_init__(self) -> None:
        if isinstance(self.floor, bool) or not isinstance(self.floor, int) or self.floor < 1:
            raise ValueError(f"floor (keys per row) must be an integer >= 1, got {self.floor!r}")
        if self.base is not None and not isinstance(self.base, Predictor):
            raise TypeError(f"base must have a predict(q, k, causal=...) method; got {self.base!r}")
        _check_row_share(self.row_share)

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False,
                sliding_window: int | None = None) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) projected → bool (heads, n, m)."""
        check_shapes(q, k)
        n, m = q.shape[1], k.shape[1]
        if isinstance(self.base, ThresholdDistance | Distance) and distance_pass.applies(q, k):
            # the threshold, the row counts and the short rows' nearest keys in one pass
            _, per_row = allowed_key_range(n, m, causal=causal, sliding_window=sliding_window)
            return distance_pass.threshold_pass(
                q, k, _sq_thresholds(self.base, q.shape[0]), causal=causal,
                sliding_window=sliding_window,
                floor=floor_counts(self.floor, self.row_share, per_row))
        allowed = layer_allowed(n, m, causal=causal, sliding_window=sliding_window,
                                device=q.device)
        partial, qq = _partial_sq_dist(q, k)
        if isinstance(self.base, ThresholdDistance | Distance):  # one distance pass for both
            t2 = _sq_thresholds(self.base, q.shape[0]).to(partial.device, partial.dtype)
            mask = partial <= t2[:, None, None] - qq
            mask = mask if allowed is None else mask.logical_and_(allowed)
            return add_row_floor(mask, partial, self.floor, allowed, short_rows_only=True,
                                 row_share=self.row_share)
        elif self.base is None:
            mask = torch.zeros(q.shape[0], n, m, dtype=torch.bool, device=q.device)
        else:
            mask = (self.base.predict(q, k, causal=causal, sliding_window=sliding_window)
                    if sliding_window and honours_window(self.base)
                    else self.base.predict(q, k, causal=causal))
            if allowed is not None:
                mask = mask & allowed
            elif not owns_output(self.base):
                mask = mask.clone()  # never modify a member's output we do not own
        return add_row_floor(mask, partial, self.floor, allowed, row_share=self.row_share)
