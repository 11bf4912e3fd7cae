"""Data-parallel projection training over record shards (torch.distributed, all-reduce).

The data are ``W`` shards of records (e.g. the chunks a rank of ``sparsefinder extract``
wrote). Each shard is a data-parallel worker with its own generator (seed ``seed + 7919·s``,
so shard 0 draws exactly what :func:`~sparsefinder.projections.hinge.train_projections` draws):
it samples its negatives, shuffles its positives per head and takes ``ceil(batch_size / W)``
of them per head per step. One step of the global model:

    g = (1/W) Σ_s ∇ mean-hinge(batch_s)       — all_reduce(SUM) of the shard gradients / W

i.e. the gradient of the mean loss over the union of the W equal-sized shard batches; every
rank then applies the same Adam step to the same weights. The epoch length is the longest
shard's (all_reduce MAX), the discriminative init is solved from the SUM of the shards'
second moments, the bias centres the mean of ALL tokens (sums all-reduced in float64).

Where this runs does not matter: a process may hold one shard (torchrun, one per rank) or all
of them (one process, no group). The result differs only by the order in which the W shard
gradients are added (float32: ≤ a few ulps per step; with W = 2, a + b = b + a, so 2 ranks
match one process holding both shards bit for bit in our tests). With W = 1 it is
``train_projections`` step for step (same draws, same gradients; the bias is the same mean
summed in float64).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from sparsefinder import distributed
from sparsefinder.data.records import AttentionRecord
from sparsefinder.projections.heads import HeadProjections
from sparsefinder.projections.hinge import (
    _INIT_SAMPLE,
    _check_hyperparameters,
    _hinge_grad,
    _init_moments,
    _solve_init,
    loss_metadata,
)
from sparsefinder.projections.pairs import _check_records, _layer_pairs, _schedule, sample_negatives
from sparsefinder.training import LayerLog, Trainer

SHARD_SEED_STRIDE = 7919


class ShardedHingeObjective:
    """Eq. 7 over the shards this process holds: each shard draws its own negatives and
    schedule from its own generator; ``gradients`` sums the shards' gradients and losses (the
    trainer's ``all_reduce`` hook then sums over ranks and divides by the number of shards);
    the epoch length, the init and the centring are reduced over ranks here."""

    def __init__(self, shards: Sequence[Sequence[AttentionRecord]], shard_ids: Sequence[int],
                 *, heads: int, d: int, rank: int, margin: float, local_batch: int,
                 negatives_per_positive: int, seed: int, init: str) -> None:
        self.shards, self.shard_ids = [list(s) for s in shards], list(shard_ids)
        self.heads, self.d, self.rank, self.margin, self.init_kind = heads, d, rank, margin, init
        self.local_batch, self.num = local_batch, negatives_per_positive
        self.generators = [torch.Generator().manual_seed(seed + SHARD_SEED_STRIDE * s)
                           for s in self.shard_ids]

    def start(self, layer: int, device: torch.device) -> bool:
        self.layer = layer
        # a softmax layer (α = 1) has a dense gold graph: nothing to learn, zero maps
        flags = [record.layers[layer].is_softmax for shard in self.shards for record in shard]
        if flags and all(flags):
            self.pairs = []
            return False
        self.pairs = [_layer_pairs(shard, layer) for shard in self.shards]
        counts = torch.stack([torch.bincount(p.head, minlength=self.heads) for p in self.pairs])
        least = int(distributed.all_reduce(counts.min(0).values, "min").min())
        if least == 0:
            raise ValueError(
                f"layer {layer}: a head has no usable gold edge in some shard; every shard "
                "needs positives of every head — use fewer ranks or larger shards")
        self.steps = int(distributed.all_reduce(
            torch.tensor([math.ceil(int(counts.max()) / self.local_batch)]), "max")[0])
        return True

    def draw(self, epoch: int) -> int:
        self.plans, self.rows = [], []
        for p, gen in zip(self.pairs, self.generators, strict=True):
            negs = sample_negatives(p.gold_flat, p.gold_base, p.n_allowed, self.num, gen)
            neg_rows = p.k_base[:, None] + negs
            ids, _ = _schedule(p, self.heads, self.local_batch, gen, steps=self.steps)
            self.plans.append((neg_rows, ids))
            self.rows.append((p.q_row[ids], p.k_row[ids], neg_rows[ids]))
        return self.steps

    def init(self) -> list[Tensor]:
        return [_initial_weight(self.pairs, self.plans, self.generators, self.shard_ids,
                                self.init_kind, self.rank, self.margin, self.heads, self.d)]

    def gradients(self, params: list[Tensor], step: int) -> tuple[list[Tensor], Tensor]:
        cut = slice(step * self.local_batch, (step + 1) * self.local_batch)
        grad = loss = None
        for p, rows in zip(self.pairs, self.rows, strict=True):
            g, l_ = _hinge_grad(p, *(x[:, cut] for x in rows), params[0], self.margin)
            grad, loss = (g, l_) if grad is None else (grad + g, loss + l_)
        return [grad], loss

    def held_out_loss(self, params: list[Tensor]) -> Tensor:
        raise NotImplementedError("data-parallel training has no early stopping")

    def finish(self, params: list[Tensor] | None, log: LayerLog) -> dict[str, Any]:
        positives = int(distributed.all_reduce(torch.tensor([sum(
            int(p.head.numel()) for p in self.pairs)]))[0])
        w = params[0].detach() if params is not None else torch.zeros(
            self.heads, self.rank, self.d)
        sums = torch.zeros(self.heads, self.d, dtype=torch.float64)
        tokens = 0
        for shard in self.shards:
            for record in shard:
                graph = record.layers[self.layer]
                sums += graph.queries.double().sum(1) + graph.keys.double().sum(1)
                tokens += graph.queries.shape[1] + graph.keys.shape[1]
        packed = distributed.all_reduce(torch.cat([sums.reshape(-1),
                                                   torch.tensor([float(tokens)],
                                                                dtype=torch.float64)]))
        mean = (packed[:-1] / packed[-1]).view(self.heads, self.d).float()
        return {"weight": w, "bias": -(w @ mean[..., None])[..., 0], "positives": positives,
                "log": log}


def train_projections_sharded(
    shards: Sequence[Sequence[AttentionRecord]],
    *,
    shard_ids: Sequence[int] | None = None,
    rank: int = 4,
    margin: float = 1.0,
    lr: float = 0.01,
    epochs: int = 1,
    batch_size: int = 1024,
    negatives_per_positive: int = 1,
    seed: int = 0,
    init: str = "discriminative",
    model_id: str = "",
    alpha: float = 1.5,
    progress: bool = False,
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
    resume: dict[str, Any] | None = None,
) -> HeadProjections:
    """Train per-head projections data-parallel over shards (this process holds ``shards``).

    ``shard_ids`` are the global ids of the held shards (default: the rank when a process
    group is initialised and one shard is held, else ``0 .. len(shards) - 1``). Every rank
    must call this with the same hyperparameters; all ranks return the same projections.
    The loop is :class:`~sparsefinder.training.Trainer` with an all-reduce hook
    (``checkpoint``/``resume``: its state, one per rank).
    """
    _check_hyperparameters(
        rank=rank, margin=margin, lr=lr, epochs=epochs, batch_size=batch_size,
        negatives_per_positive=negatives_per_positive, seed=seed, init=init,
    )
    world = distributed.current_world()
    if shard_ids is None:
        shard_ids = [world.rank] if world.size > 1 and len(shards) == 1 else range(len(shards))
    shard_ids = list(shard_ids)
    if len(shard_ids) != len(shards) or not shards:
        raise ValueError("pass one or more shards, with one shard id each")
    n_shards = int(distributed.all_reduce(torch.tensor([len(shards)]))[0])
    layers, heads, d = _check_records([r for shard in shards for r in shard], rank)
    objective = ShardedHingeObjective(
        shards, shard_ids, heads=heads, d=d, rank=rank, margin=margin,
        local_batch=math.ceil(batch_size / n_shards),
        negatives_per_positive=negatives_per_positive, seed=seed, init=init)
    trainer = Trainer(epochs=epochs, lr=lr, progress=progress and world.is_main,
                      desc="projections (data-parallel)", checkpoint=checkpoint,
                      all_reduce=lambda packed: distributed.all_reduce(packed) / n_shards)
    done = trainer.fit(objective, layers, resume=resume)
    n_records = int(distributed.all_reduce(torch.tensor([sum(len(s) for s in shards)]))[0])
    metadata = {
        "rank": rank, "margin": float(margin), "lr": float(lr), "epochs": epochs,
        "batch_size": batch_size, "negatives_per_positive": negatives_per_positive,
        "seed": seed, "init": init, "n_records": n_records, "data_parallel_shards": n_shards,
        "positives_per_layer": [layer["positives"] for layer in done],
        **loss_metadata([layer["log"] for layer in done]),
    }
    return HeadProjections(weight=torch.stack([layer["weight"] for layer in done]),
                           bias=torch.stack([layer["bias"] for layer in done]),
                           model_id=model_id, alpha=float(alpha), metadata=metadata)


def _initial_weight(pairs, plans, generators, shard_ids, init, rank, margin, heads, d
                    ) -> Tensor:
    """Identical start on every rank: pooled-moment init, or shard 0's random draw."""
    if init == "discriminative":
        c_pos = torch.zeros(heads, d, d, dtype=torch.float64)
        c_neg = torch.zeros_like(c_pos)
        size = 0
        for p, (neg_rows, ids) in zip(pairs, plans, strict=True):
            cp, cn, s = _init_moments(p, neg_rows, ids[:, : min(_INIT_SAMPLE, ids.shape[1])])
            c_pos, c_neg, size = c_pos + cp, c_neg + cn, size + s
        packed = distributed.all_reduce(torch.cat([
            c_pos.reshape(-1), c_neg.reshape(-1), torch.tensor([float(size)],
                                                               dtype=torch.float64)]))
        total = packed[-1]
        c_pos = packed[: heads * d * d].view(heads, d, d) / total
        c_neg = packed[heads * d * d: -1].view(heads, d, d) / total
        return _solve_init(c_pos, c_neg, rank, margin).contiguous()
    w0 = torch.zeros(heads, rank, d)
    for sid, gen in zip(shard_ids, generators, strict=True):
        if sid == 0:
            w0 = torch.randn(heads, rank, d, generator=gen) / math.sqrt(d)
    return distributed.all_reduce(w0).contiguous()  # only shard 0's draw is non-zero
