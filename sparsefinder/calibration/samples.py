"""Samples of TRAIN pairs and gold edges per head: what a per-head calibration reads.

Sparsity and recall are averaged per head over texts, each text weighing the same
(:mod:`sparsefinder.metrics.scorer`). So from every train text we draw the same number ``K`` of
uniformly random allowed pairs and of gold edges per head (:class:`DistanceSamples`); the
empirical CDF of the pooled pair distances at ``t²`` is then an unbiased estimate of the macro
density ``1 − sparsity_h(t)`` and that of the gold-edge distances of the macro recall
``recall_h(t)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from sparsefinder.attention.masks import layer_allowed
from sparsefinder.data.records import AttentionRecord
from sparsefinder.predictors.distance import _partial_sq_dist


@dataclass
class DistanceSamples:
    """Sorted squared distances of sampled train pairs, per layer and head.

    ``pairs`` (layers, heads, T·K): uniformly drawn allowed pairs, ``K`` per text;
    ``gold`` (layers, heads, T·K): uniformly drawn gold edges, ``K`` per text (``-inf`` for a
    text whose head has no gold edge: its recall is 1 by convention, at any threshold);
    ``gold_fraction`` (optional, same shape): the rank of each sampled gold edge in its row,
    as ``(rank + 1) / allowed`` (``-inf`` as above). All sorted ascending along the last axis.
    """

    pairs: Tensor
    gold: Tensor
    n_texts: int
    gold_fraction: Tensor | None = None
    #: with ``row_ranks``: each sampled pair's / gold edge's rank among its row's allowed keys
    #: by projected distance (0 = nearest), capped at :data:`RANK_CAP`; aligned with
    #: ``pairs`` / ``gold`` (uint8). What a per-row floor's calibration reads.
    pair_rank: Tensor | None = None
    gold_rank: Tensor | None = None
    #: with ``row_ranks``: how many keys the row of each sampled pair / gold edge may attend
    #: to (int32, aligned with ``pairs`` / ``gold``): what a floor capped by the row's
    #: length (:func:`~sparsefinder.predictors.row_floor.floor_counts`) reads.
    pair_allowed: Tensor | None = None
    gold_allowed: Tensor | None = None

    @classmethod
    def from_records(
        cls,
        records: Sequence[AttentionRecord],
        projections,
        samples_per_text: int = 1024,
        seed: int = 0,
        rank_fractions: bool = False,
        row_ranks: bool = False,
    ) -> DistanceSamples:
        """Project every train record and sample ``samples_per_text`` pairs/edges per head
        (with ``rank_fractions``, also the in-row rank of each sampled gold edge; with
        ``row_ranks``, the capped in-row rank of every sampled pair and gold edge, and how
        many keys its row may attend to)."""
        if not records:
            raise ValueError("calibration needs at least one TRAIN record (a text's gold graphs)")
        if isinstance(samples_per_text, bool) or not isinstance(samples_per_text, int) or (
            samples_per_text < 1
        ):
            raise ValueError(f"samples_per_text must be an integer >= 1, got {samples_per_text!r}")
        generator = torch.Generator().manual_seed(seed)
        layers = records[0].num_layers
        pairs: list[list[Tensor]] = [[] for _ in range(layers)]
        gold: list[list[Tensor]] = [[] for _ in range(layers)]
        fraction: list[list[Tensor]] = [[] for _ in range(layers)]
        pair_rank: list[list[Tensor]] = [[] for _ in range(layers)]
        gold_rank: list[list[Tensor]] = [[] for _ in range(layers)]
        pair_allowed: list[list[Tensor]] = [[] for _ in range(layers)]
        gold_allowed: list[list[Tensor]] = [[] for _ in range(layers)]
        for record in records:
            projected = projections.project_record(record)
            for layer, ((q, k), graph) in enumerate(zip(projected, record.layers, strict=True)):
                p, g, f, ranks = _sample_text(q, k, graph.gold, record.causal,
                                              samples_per_text, generator, rank_fractions,
                                              graph.sliding_window, row_ranks)
                pairs[layer].append(p)
                gold[layer].append(g)
                fraction[layer].append(f)
                if ranks is not None:
                    pair_rank[layer].append(ranks[0])
                    gold_rank[layer].append(ranks[1])
                    pair_allowed[layer].append(ranks[2])
                    gold_allowed[layer].append(ranks[3])

        def pooled(parts: list[list[Tensor]]) -> Tensor:
            # float32 halves the memory (354 texts × 1024 samples × 72 heads ≈ 100 MB each)
            return torch.stack([torch.cat(p, 1) for p in parts]).float().sort(-1).values

        if not row_ranks:
            return cls(pairs=pooled(pairs), gold=pooled(gold), n_texts=len(records),
                       gold_fraction=pooled(fraction) if rank_fractions else None)

        def with_ranks(parts: list[list[Tensor]], *aligned: list[list[Tensor]]
                       ) -> tuple[Tensor, ...]:  # sorted values, the rest in the same order
            values = torch.stack([torch.cat(p, 1) for p in parts]).float()
            values, order = values.sort(-1)
            return values, *(torch.stack([torch.cat(a, 1) for a in each]).gather(-1, order)
                             for each in aligned)

        pair_d, pair_r, pair_a = with_ranks(pairs, pair_rank, pair_allowed)
        gold_d, gold_r, gold_a = with_ranks(gold, gold_rank, gold_allowed)
        return cls(pairs=pair_d, gold=gold_d, n_texts=len(records),
                   gold_fraction=pooled(fraction) if rank_fractions else None,
                   pair_rank=pair_r, gold_rank=gold_r, pair_allowed=pair_a, gold_allowed=gold_a)

    @property
    def shape(self) -> tuple[int, int]:
        """(layers, heads)."""
        return int(self.pairs.shape[0]), int(self.pairs.shape[1])

    def density(self, sq_thresholds: Tensor) -> Tensor:
        """Estimated macro density ``1 − sparsity`` at thresholds (layers, heads, ...)."""
        return _cdf(self.pairs, sq_thresholds)

    def recall(self, sq_thresholds: Tensor) -> Tensor:
        """Estimated macro recall at thresholds (layers, heads, ...)."""
        return _cdf(self.gold, sq_thresholds)


def _cdf(sorted_values: Tensor, at: Tensor) -> Tensor:
    """Fraction of ``sorted_values`` (L, H, N) that are ≤ ``at`` (L, H, G) → (L, H, G)."""
    squeeze = at.dim() == 2
    at = at[..., None] if squeeze else at
    count = torch.searchsorted(sorted_values, at.to(sorted_values.dtype).contiguous(), right=True)
    out = count.double() / sorted_values.shape[-1]
    return out[..., 0] if squeeze else out


def _sample_text(
    q: Tensor, k: Tensor, gold: Tensor, causal: bool, num: int, generator: torch.Generator,
    rank_fractions: bool = False, sliding_window: int | None = None, row_ranks: bool = False,
) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, ...] | None]:
    """Squared distances of ``num`` uniform allowed pairs and ``num`` uniform gold edges per
    head of one text → (heads, num) each, and the gold edges' in-row rank fractions (empty
    unless ``rank_fractions``); gold is ``-inf`` for a head without gold edges. Pairs are
    drawn among the layer's allowed pairs (a local layer: its window), the denominator of
    the sparsity a target is set against. With ``row_ranks`` also (pair ranks, gold ranks,
    pair rows' allowed counts, gold rows' allowed counts)."""
    heads, n, m = gold.shape
    mask = layer_allowed(n, m, causal=causal, sliding_window=sliding_window)
    if mask is not None:
        gold = gold & mask
        flat_allowed = mask.reshape(-1).nonzero()[:, 0]
    else:
        flat_allowed = torch.arange(n * m)
    pick = flat_allowed[torch.randint(0, flat_allowed.numel(), (heads, num), generator=generator)]
    weights = gold.reshape(heads, -1).float()
    empty = weights.sum(-1) == 0
    weights[empty] = 1.0  # any column; overwritten with -inf below
    edges = torch.multinomial(weights, num, replacement=True, generator=generator)

    def sq_dist(flat: Tensor) -> Tensor:
        qi = q.gather(1, (flat // m)[..., None].expand(-1, -1, q.shape[-1]))
        kj = k.gather(1, (flat % m)[..., None].expand(-1, -1, k.shape[-1]))
        return (qi.double() - kj.double()).square().sum(-1)

    gold_d = sq_dist(edges)
    fraction = torch.empty(heads, 0, dtype=torch.float64)
    if rank_fractions:
        rows = edges // m  # (heads, num): rank each edge among its row's allowed keys
        partial, qq = _partial_sq_dist(q, k)
        dist = (partial + qq).double()
        if mask is not None:
            dist = dist.masked_fill(~mask, torch.inf)
        row_d = dist.gather(1, rows[..., None].expand(-1, -1, m))  # (heads, num, m)
        own = row_d.gather(2, (edges % m)[..., None])
        rank = (row_d < own).sum(-1)
        per_row = mask.sum(-1) if mask is not None else torch.full((n,), m)
        fraction = (rank + 1).double() / per_row[rows].clamp(min=1)
        fraction[empty] = -torch.inf
    gold_d[empty] = -torch.inf
    ranks = None
    if row_ranks:
        per_row = (mask.sum(-1) if mask is not None else torch.full((n,), m)).int()
        ranks = (_capped_ranks(q, k, mask, pick), _capped_ranks(q, k, mask, edges),
                 per_row[pick // m], per_row[edges // m])
        ranks[1][empty] = 0  # a head without gold edges has recall 1 at any setting
    return sq_dist(pick), gold_d, fraction, ranks


#: Ranks of sampled pairs are counted up to this many nearer keys (the largest floor a
#: per-row floor can be calibrated for).
RANK_CAP = 64


def _capped_ranks(q: Tensor, k: Tensor, mask: Tensor | None, flat: Tensor) -> Tensor:
    """uint8 (heads, num): how many allowed keys of its row are strictly nearer (projected)
    than each sampled pair ``flat`` (indices into n·m), capped at :data:`RANK_CAP`."""
    heads, m = q.shape[0], k.shape[1]
    partial, _ = _partial_sq_dist(q, k)  # the row term ||q||² does not change a ranking
    if mask is not None:
        partial.masked_fill_(~mask, torch.inf)
    cap = min(RANK_CAP, m)
    nearest = partial.topk(cap, dim=-1, largest=False, sorted=True).values  # (heads, n, cap)
    rows = flat // m
    own = partial.reshape(heads, -1).gather(1, flat)  # (heads, num), same arithmetic
    near = nearest.gather(1, rows[..., None].expand(-1, -1, cap))
    return (near < own[..., None]).sum(-1).clamp(max=RANK_CAP).to(torch.uint8)
