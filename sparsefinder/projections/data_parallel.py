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
from collections.abc import Sequence

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
)
from sparsefinder.projections.pairs import _check_records, _layer_pairs, _schedule, sample_negatives

SHARD_SEED_STRIDE = 7919


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
) -> HeadProjections:
    """Train per-head projections data-parallel over shards (this process holds ``shards``).

    ``shard_ids`` are the global ids of the held shards (default: the rank when a process
    group is initialised and one shard is held, else ``0 .. len(shards) - 1``). Every rank
    must call this with the same hyperparameters; all ranks return the same projections.
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
    local_batch = math.ceil(batch_size / n_shards)
    generators = [torch.Generator().manual_seed(seed + SHARD_SEED_STRIDE * s) for s in shard_ids]
    weights, biases, loss_first, loss_last, n_pos = [], [], [], [], []
    for layer in range(layers):
        pairs = [_layer_pairs(shard, layer) for shard in shards]
        counts = torch.stack([torch.bincount(p.head, minlength=heads) for p in pairs])
        least = int(distributed.all_reduce(counts.min(0).values, "min").min())
        if least == 0:
            raise ValueError(
                f"layer {layer}: a head has no usable gold edge in some shard; every shard "
                "needs positives of every head — use fewer ranks or larger shards")
        steps = int(distributed.all_reduce(
            torch.tensor([math.ceil(int(counts.max()) / local_batch)]), "max")[0])
        weight: Tensor | None = None
        optimizer: torch.optim.Optimizer | None = None
        history: list[Tensor] = []
        for _epoch in range(epochs):
            plans = []
            for p, gen in zip(pairs, generators, strict=True):
                negs = sample_negatives(p.gold_flat, p.gold_base, p.n_allowed,
                                        negatives_per_positive, gen)
                neg_rows = p.k_base[:, None] + negs
                ids, _ = _schedule(p, heads, local_batch, gen, steps=steps)
                plans.append((neg_rows, ids))
            if weight is None:
                weight = _initial_weight(pairs, plans, generators, shard_ids, init,
                                         rank, margin, heads, d)
                optimizer = torch.optim.Adam([weight], lr=lr)
            rows = [(p.q_row[ids], p.k_row[ids], neg_rows[ids])
                    for p, (neg_rows, ids) in zip(pairs, plans, strict=True)]
            for step in range(steps):
                cut = slice(step * local_batch, (step + 1) * local_batch)
                total = None
                for p, r in zip(pairs, rows, strict=True):
                    grad, loss = _hinge_grad(p, *(x[:, cut] for x in r), weight, margin)
                    packed = torch.cat([grad.reshape(-1), loss.reshape(1)])
                    total = packed if total is None else total + packed
                total = distributed.all_reduce(total) / n_shards
                weight.grad = total[:-1].view_as(weight)
                optimizer.step()
                history.append(total[-1])
        losses = torch.stack(history).tolist()
        tail = max(1, len(losses) // 10)
        loss_first.append(sum(losses[:tail]) / tail)
        loss_last.append(sum(losses[-tail:]) / tail)
        n_pos.append(int(distributed.all_reduce(torch.tensor([sum(
            int(p.head.numel()) for p in pairs)]))[0]))
        w = weight.detach()
        sums = torch.zeros(heads, d, dtype=torch.float64)
        tokens = 0
        for shard in shards:
            for record in shard:
                graph = record.layers[layer]
                sums += graph.queries.double().sum(1) + graph.keys.double().sum(1)
                tokens += graph.queries.shape[1] + graph.keys.shape[1]
        packed = distributed.all_reduce(torch.cat([sums.reshape(-1),
                                                   torch.tensor([float(tokens)],
                                                                dtype=torch.float64)]))
        mean = (packed[:-1] / packed[-1]).view(heads, d).float()
        biases.append(-(w @ mean[..., None])[..., 0])
        weights.append(w)
    n_records = int(distributed.all_reduce(torch.tensor([sum(len(s) for s in shards)]))[0])
    metadata = {
        "rank": rank, "margin": float(margin), "lr": float(lr), "epochs": epochs,
        "batch_size": batch_size, "negatives_per_positive": negatives_per_positive,
        "seed": seed, "init": init, "n_records": n_records, "data_parallel_shards": n_shards,
        "positives_per_layer": n_pos, "loss_first": loss_first, "loss_last": loss_last,
    }
    return HeadProjections(weight=torch.stack(weights), bias=torch.stack(biases),
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
