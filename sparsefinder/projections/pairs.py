"""Training pairs of one layer: gold edges as positives and per-row negatives.

A negative ``k_N`` is drawn uniformly from the non-edges of the SAME query row (only past keys
for causal records), so it is exactly what a predictor must leave out of that row. The
negatives of an epoch are drawn up front, vectorised: a uniform column of the row is rejected
if it is an edge and redrawn (a few rounds); the few rows still unlucky (rows that are nearly
all edges) are sampled exactly among their non-edges; rows without any non-edge are skipped.
Heads differ a lot in their number of edges (x20 in MiniLM), so an epoch is
``ceil(max_h P_h / batch)`` steps and heads with fewer positives cycle through theirs. A
near-dense layer (a random or barely sparse model) has ~n² edges per text, so its epoch can be
a hundred times longer than a sparse one's; ``max_steps`` bounds it: a head with more than
``max_steps · batch`` positives trains on a uniform sample of that many, drawn afresh each
epoch (:func:`subsample_pairs`). Where the bound does not bind nothing is drawn, so the result
is the same as without it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from sparsefinder.attention.masks import allowed_key_range, apply_causal
from sparsefinder.data.records import AttentionRecord

_REJECTION_ROUNDS = 8


_EXACT_CHUNK = 16_384  # rows sampled exactly at once after rejection sampling gave up


@dataclass
class _LayerPairs:
    """All gold edges of one layer over many texts, indexed into flat token tables."""

    q_table: Tensor  # (heads * Tq, d): row h * Tq + t
    k_table: Tensor  # (heads * Tk, d)
    head: Tensor  # (P,) long
    q_row: Tensor  # (P,) row into q_table
    k_row: Tensor  # (P,) row into k_table (the positive key)
    k_base: Tensor  # (P,) row into k_table of the first key this query may see
    n_allowed: Tensor  # (P,) keys this query may see (m, the past, or its local window)
    gold_base: Tensor  # (P,) index into gold_flat of (head, query, its first allowed key)
    gold_flat: Tensor  # bool: every text's gold mask of this layer, flattened
    gold_edges: Tensor  # (heads,) all gold edges of each head, with or without a non-edge
    mass: Tensor | None = None  # (P,) each positive's entmax probability (mass objectives)

    def first_negative_differences(self, ids: Tensor, neg_rows: Tensor) -> tuple[Tensor, Tensor]:
        """q − k of the positives ``ids`` (heads, S) and of each one's first negative:
        two (heads, S, d) tensors (what the initialisations average over)."""
        heads, size = ids.shape
        flat = ids.reshape(-1)
        q = self.q_table.index_select(0, self.q_row[flat])
        dp = (q - self.k_table.index_select(0, self.k_row[flat])).view(heads, size, -1)
        dn = (q - self.k_table.index_select(0, neg_rows[flat, 0])).view(heads, size, -1)
        return dp, dn

    def batch_differences(self, q_rows: Tensor, k_rows: Tensor, n_rows: Tensor
                          ) -> tuple[Tensor, Tensor]:
        """q − k of a batch's positives (heads, B, d) and of their ``num`` negatives each
        (heads, B·num, d), from table rows (heads, B) and (heads, B, num)."""
        heads, size, num = n_rows.shape
        d = self.q_table.shape[1]
        q = self.q_table.index_select(0, q_rows.reshape(-1)).view(heads, size, 1, d)
        diff_pos = q[:, :, 0] - self.k_table.index_select(0, k_rows.reshape(-1)).view(
            heads, size, d)
        diff_neg = (q - self.k_table.index_select(0, n_rows.reshape(-1)).view(
            heads, size, num, d)).view(heads, size * num, d)
        return diff_pos, diff_neg


def _layer_pairs(records: Sequence[AttentionRecord], layer: int) -> _LayerPairs:
    """Gathers the positives of one layer; rows without any non-edge are dropped."""
    graphs = [r.layers[layer] for r in records]
    heads = int(graphs[0].queries.shape[0])
    tq = sum(int(g.queries.shape[1]) for g in graphs)
    tk = sum(int(g.keys.shape[1]) for g in graphs)
    parts: dict[str, list[Tensor]] = {k: [] for k in ("h", "q", "k", "kb", "na", "gb", "p")}
    q_off = k_off = g_off = 0
    gold_edges = torch.zeros(heads, dtype=torch.long)
    # the edges' probabilities, where every record kept them (gold-only records have none)
    with_mass = all(g.prob_values.numel() > 0 for g in graphs)
    for record, g in zip(records, graphs, strict=True):
        n, m = int(g.gold_shape[1]), int(g.gold_shape[2])
        first, allowed = allowed_key_range(n, m, causal=record.causal,
                                           sliding_window=g.sliding_window)
        gold = apply_causal(g.gold, record.causal)
        gold_edges += gold.sum((-2, -1))
        has_negative = gold.sum(-1) < allowed  # (heads, n)
        h, i, j = (gold & has_negative[..., None]).nonzero(as_tuple=True)
        parts["h"].append(h)
        parts["q"].append(h * tq + q_off + i)
        parts["k"].append(h * tk + k_off + j)
        parts["kb"].append(h * tk + k_off + first[i])
        parts["na"].append(allowed[i])
        parts["gb"].append(g_off + (h * n + i) * m + first[i])  # the run's first key
        if with_mass:
            parts["p"].append(g.probs()[h, i, j].float())
        q_off, k_off, g_off = q_off + n, k_off + m, g_off + heads * n * m
    cat = {k: torch.cat(v) for k, v in parts.items() if v}
    q_table = torch.cat([g.queries for g in graphs], dim=1).reshape(heads * tq, -1)
    k_table = torch.cat([g.keys for g in graphs], dim=1).reshape(heads * tk, -1)
    gold_flat = torch.cat([g.gold.reshape(-1) for g in graphs])
    return _LayerPairs(
        q_table=q_table.float(),
        k_table=k_table.float(),
        head=cat["h"],
        q_row=cat["q"],
        k_row=cat["k"],
        k_base=cat["kb"],
        n_allowed=cat["na"],
        gold_base=cat["gb"],
        gold_flat=gold_flat,
        gold_edges=gold_edges,
        mass=cat["p"] if with_mass else None,
    )


def subsample_pairs(pairs: _LayerPairs, heads: int, cap: int,
                    generator: torch.Generator) -> _LayerPairs:
    """At most ``cap`` positives of each head, a uniform sample without replacement (kept in
    their order); ``pairs`` itself when no head has more (then nothing is drawn)."""
    counts = torch.bincount(pairs.head, minlength=heads)
    if int(counts.max()) <= cap:
        return pairs
    order = torch.argsort(pairs.head, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    keep = []
    for h in range(heads):
        count = int(counts[h])
        chosen = torch.randperm(count, generator=generator)[:cap] if count > cap else \
            torch.arange(count)
        keep.append(order[starts[h] + chosen])
    index = torch.sort(torch.cat(keep)).values
    return replace(pairs, **{name: getattr(pairs, name)[index] for name in _PER_PAIR
                             if getattr(pairs, name) is not None})


_PER_PAIR = ("head", "q_row", "k_row", "k_base", "n_allowed", "gold_base", "mass")


def sample_negatives(
    gold_flat: Tensor,
    gold_base: Tensor,
    n_allowed: Tensor,
    num: int,
    generator: torch.Generator,
) -> Tensor:
    """Column of a uniform non-edge in the row of each positive: (P,) → long (P, num).

    ``gold_flat[gold_base[p] + j]`` is the gold bit of the ``j``-th key the row of positive
    ``p`` may attend to, ``j < n_allowed[p]`` (the row's contiguous run of allowed keys:
    all, the past, or a local window); the result counts from the run's first key. Every
    row must hold a non-edge.
    Rejection sampling (vectorised, ``_REJECTION_ROUNDS`` rounds), then exact sampling for
    the rows still unlucky — so the result is exactly uniform over the row's non-edges.
    """
    base = gold_base[:, None].expand(-1, num).reshape(-1)
    allowed = n_allowed[:, None].expand(-1, num).reshape(-1)
    cols = torch.zeros(base.shape[0], dtype=torch.long)
    todo = torch.arange(base.shape[0])
    for _ in range(_REJECTION_ROUNDS):
        if todo.numel() == 0:
            break
        draw = (torch.rand(todo.shape[0], generator=generator) * allowed[todo]).long()
        draw = torch.minimum(draw, allowed[todo] - 1)  # guard against rand() rounding to 1
        ok = ~gold_flat[base[todo] + draw]
        cols[todo[ok]] = draw[ok]
        todo = todo[~ok]
    for part in todo.split(_EXACT_CHUNK) if todo.numel() else ():  # memory: chunk × row
        width = int(allowed[part].max())
        j = torch.arange(width)
        idx = (base[part][:, None] + j).clamp(max=gold_flat.numel() - 1)
        free = (~gold_flat[idx]) & (j < allowed[part][:, None])
        cols[part] = torch.multinomial(free.float(), 1, generator=generator)[:, 0]
    return cols.view(-1, num)


def _check_records(records: Sequence[AttentionRecord], rank: int) -> tuple[int, int, int]:
    if not records:
        raise ValueError("train_projections needs at least one record (a text's gold graphs)")
    shapes = set()
    for record in records:
        if not record.layers:
            raise ValueError("a record has no layers; extract it with graphs.extract()")
        q = record.layers[0].queries
        shapes.add((record.num_layers, int(q.shape[0]), int(q.shape[2])))
    if len(shapes) != 1:
        raise ValueError(f"records come from differently shaped models: {sorted(shapes)}")
    layers, heads, d = shapes.pop()
    if rank > d:
        raise ValueError(f"rank must be <= the head dimension {d}, got {rank}")
    return layers, heads, d


def softmax_layer(records: Sequence[AttentionRecord], layer: int) -> bool:
    """Whether ``layer`` ran softmax (α = 1) in the records: its gold graph is dense, so
    there is nothing to predict and nothing to learn (trainers leave its maps at zero, which
    predicts every key: the softmax layer's own graph)."""
    flags = {r.layers[layer].is_softmax for r in records}
    if len(flags) > 1:
        raise ValueError(f"layer {layer} ran softmax in some records and entmax in others; "
                         "extract every record with the same α per layer")
    return flags == {True}


def dense_heads_of(pairs: _LayerPairs, heads: int) -> list[int]:
    """Heads with gold edges but no (edge, non-edge) pair in any row: nothing to contrast."""
    counts = torch.bincount(pairs.head, minlength=heads)
    return [h for h in range(heads) if int(counts[h]) == 0 and int(pairs.gold_edges[h]) > 0]


def _schedule(pairs: _LayerPairs, heads: int, batch_size: int, generator: torch.Generator,
              steps: int | None = None, borrow: Sequence[int] = ()) -> tuple[Tensor, int]:
    """Positive ids (heads, steps * batch_size): a shuffled epoch per head, cycled.

    ``steps`` overrides the epoch length (data-parallel ranks agree on the longest one).
    Heads in ``borrow`` without positives take the ids of the head with the most (only so
    that every head has a batch: the caller keeps their weights at zero, which zeroes their
    gradient)."""
    counts = torch.bincount(pairs.head, minlength=heads)
    borrowed = [h for h in borrow if int(counts[h]) == 0]
    if borrowed and int(counts.max()) > 0:
        counts = counts.clone()
        counts[borrowed] = -1  # filled from the donor below
    if int(counts.min()) == 0:
        empty = (counts == 0).nonzero()[:, 0].tolist()
        dense = [h for h in empty if int(pairs.gold_edges[h]) > 0]
        if dense:
            raise ValueError(
                f"heads {dense} attend to every key in every row of the training records: "
                "they have no non-edge, and the contrastive loss needs one (a gold edge "
                "against a non-edge of its row); such heads are dense at this α — raise α or "
                "train on texts where they are sparse"
            )
        raise ValueError(
            f"heads {empty} have no gold edge at all in the training records; train on "
            "more (or longer) texts"
        )
    donor = int(counts.argmax())
    counts = torch.where(counts < 0, 0, counts)
    steps = steps if steps is not None else math.ceil(int(counts.max()) / batch_size)
    order = torch.argsort(pairs.head, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    length = steps * batch_size
    ids = torch.empty(heads, length, dtype=torch.long)
    for row in range(heads):
        h = donor if row in borrowed else row  # the donor's positives, see the docstring
        count = int(counts[h])
        reps = math.ceil(length / count)
        perms = torch.cat([torch.randperm(count, generator=generator) for _ in range(reps)])
        ids[row] = order[starts[h] + perms[:length]]
    return ids, steps


_HELD_OUT_PAIRS = 20_000  # held-out positives per head scored after every epoch
_HELD_OUT_SEED = 1_000_003  # held-out negatives: their own generator per (seed, layer)

#: Table rows of a batch: queries (heads, B), positive keys (heads, B), negatives (heads, B, num).
Rows = tuple[Tensor, Tensor, Tensor]


class PairsObjective:
    """The data half of a contrastive :class:`~sparsefinder.training.Objective`.

    Per layer, the gold edges of the records (:func:`_layer_pairs`); per epoch, a negative per
    positive and a shuffled schedule from ONE generator (negatives first, then the schedule, then
    whatever ``init`` draws; with ``max_steps``, a binding epoch first draws its sample of
    positives, :func:`subsample_pairs`); batch ``s`` of an epoch is slice ``s`` of its rows. A
    subclass supplies ``init``, ``batch_gradients`` (the gradients and loss of a batch of rows)
    and ``finish``. With early stopping, the held-out records' positives of each layer (at most
    ``_HELD_OUT_PAIRS`` per head) and one negative each are drawn once from a generator of their
    own, so the training draws are the same with or without it.
    """

    def __init__(self, records: Sequence[AttentionRecord], *, heads: int, batch_size: int,
                 negatives_per_positive: int, seed: int, held_out: Sequence[AttentionRecord] = (),
                 max_steps: int | None = None) -> None:
        self.records, self.held = list(records), list(held_out)
        self.heads, self.batch_size, self.num = heads, batch_size, negatives_per_positive
        self.seed, self.max_steps = seed, max_steps
        self.generator = torch.Generator().manual_seed(seed)
        self.generators = [self.generator]
        self.zero_dense = False  # True: dense heads train nothing (see dense_heads_of)
        self.softmax = False  # the current layer ran softmax (see softmax_layer)
        self.borrow: Sequence[int] = ()  # this layer's dense heads (their batches borrowed)
        self.device = torch.device("cpu")

    def start(self, layer: int, device: torch.device) -> bool:
        """The layer's pairs; False when the layer ran softmax (nothing to learn, see
        :func:`softmax_layer`) or every head is dense (with ``zero_dense``)."""
        self.layer, self.device = layer, device
        self.softmax = softmax_layer(self.records + self.held, layer)
        if self.softmax:
            self.borrow = []
            return False
        self.pairs = _layer_pairs(self.records, layer)
        self.borrow = dense_heads_of(self.pairs, self.heads) if self.zero_dense else []
        if len(self.borrow) == self.heads:
            return False
        self.on_device = self.pairs if device.type == "cpu" else replace(
            self.pairs, q_table=self.pairs.q_table.to(device),
            k_table=self.pairs.k_table.to(device))
        if self.held:
            self.held_pairs, self.held_rows = self._held_out_rows(layer)
        return True

    def draw(self, epoch: int) -> int:
        p = self.pairs
        if self.max_steps is not None:
            p = subsample_pairs(p, self.heads, self.max_steps * self.batch_size, self.generator)
        self.drawn = p  # the epoch's positives: what ``ids`` and ``neg_rows`` index
        negs = sample_negatives(p.gold_flat, p.gold_base, p.n_allowed, self.num, self.generator)
        self.neg_rows = p.k_base[:, None] + negs  # (P, num) rows into k_table
        self.ids, steps = _schedule(p, self.heads, self.batch_size, self.generator,
                                    borrow=self.borrow)
        # Table rows of the whole epoch, gathered once: (heads, L) and (heads, L, num).
        self.rows = tuple(r.to(self.device) for r in (p.q_row[self.ids], p.k_row[self.ids],
                                                       self.neg_rows[self.ids]))
        self.mass_rows = p.mass[self.ids].to(self.device) if p.mass is not None else None
        return steps

    def gradients(self, params: list[Tensor], step: int) -> tuple[list[Tensor], Tensor]:
        cut = slice(step * self.batch_size, (step + 1) * self.batch_size)
        return self.batch_gradients(params, self.on_device, *(r[:, cut] for r in self.rows))

    def held_out_loss(self, params: list[Tensor]) -> Tensor:
        return self.batch_gradients(params, self.held_pairs, *self.held_rows)[1]

    def batch_gradients(self, params: list[Tensor], pairs: _LayerPairs, q_rows: Tensor,
                        k_rows: Tensor, n_rows: Tensor) -> tuple[list[Tensor], Tensor]:
        raise NotImplementedError

    def _held_out_rows(self, layer: int) -> tuple[_LayerPairs, Rows]:
        pairs = _layer_pairs(self.held, layer)
        generator = torch.Generator().manual_seed(self.seed + _HELD_OUT_SEED * (layer + 1))
        counts = torch.bincount(pairs.head, minlength=self.heads)
        size = max(1, min(int(counts.max()), _HELD_OUT_PAIRS))
        try:
            ids, _ = _schedule(pairs, self.heads, size, generator, steps=1, borrow=self.borrow)
        except ValueError as error:
            raise ValueError(f"layer {layer}, held-out records: {error}; hold out more records "
                             "(a larger early-stop fraction) or train on more texts") from None
        negs = sample_negatives(pairs.gold_flat, pairs.gold_base, pairs.n_allowed, self.num,
                                generator)
        neg_rows = pairs.k_base[:, None] + negs
        if self.device.type != "cpu":
            pairs = replace(pairs, q_table=pairs.q_table.to(self.device),
                            k_table=pairs.k_table.to(self.device))
        rows = tuple(r.to(self.device) for r in (pairs.q_row[ids], pairs.k_row[ids],
                                                  neg_rows[ids]))
        self.held_mass = pairs.mass[ids].to(self.device) if pairs.mass is not None else None
        return pairs, rows
