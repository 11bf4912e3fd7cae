"""Fitting the HashAttention codes (:mod:`sparsefinder.predictors.hash_codes`) on gold graphs.

For every head, gold edges are positives and random allowed (non-future) pairs negatives; a
logistic loss on the relaxed similarity ``s = mean_b tanh(q·W_q)_b · tanh(k·W_k)_b`` (a smooth
stand-in for ``1 − 2·Hamming/bits``; logit ``a_h·s + c_h``, positives weighted to balance
the classes) is minimised with Adam, full batch: ``steps`` steps per layer on one draw of
pairs. The maps start from one shared Gaussian matrix (SimHash of the q·k angle), so even
before training queries and keys with a large inner product tend to share bits.

The fit runs on the training loop of the projections
(:class:`~sparsefinder.training.Trainer`): it draws record-level pairs, not the
per-row (edge, non-edge) pairs of :mod:`~sparsefinder.projections.pairs`, so it is an
objective of its own whose one epoch is ``steps`` full-batch steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from sparsefinder.data.records import AttentionRecord
from sparsefinder.predictors.hash_codes import HASH_BITS
from sparsefinder.training import LayerLog, Trainer, autograd_gradients


def _pairs(records: Sequence[AttentionRecord], layer: int, per_head: int,
           generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Training pairs of one layer: queries, keys (heads, P, d) and labels (heads, P)."""
    heads = records[0].num_heads
    share = max(1, per_head // (2 * len(records)))
    qs, ks, ys = [[] for _ in range(heads)], [[] for _ in range(heads)], [[] for _ in range(heads)]
    for record in records:
        graph = record.layers[layer]
        n = graph.gold_shape[-2]
        for h in range(heads):
            gold = graph.gold_of(h)  # one head unpacked, not the layer per head
            edges = gold.nonzero()
            if len(edges) == 0:
                continue
            pick = edges[torch.randint(len(edges), (share,), generator=generator)]
            i = torch.randint(n, (share,), generator=generator)
            high = i + 1 if record.causal else torch.full_like(i, n)
            j = (torch.rand(share, generator=generator) * high).long().clamp(max=n - 1)
            qs[h] += [graph.queries[h, pick[:, 0]], graph.queries[h, i]]
            ks[h] += [graph.keys[h, pick[:, 1]], graph.keys[h, j]]
            ys[h] += [torch.ones(share), gold[i, j].float()]
    size = min(sum(len(y) for y in ys[h]) for h in range(heads))
    if size == 0:
        raise ValueError(f"layer {layer} has no gold edge to learn hash codes from")
    stack = lambda parts: torch.stack([torch.cat(p)[:size] for p in parts])  # noqa: E731
    return stack(qs), stack(ks), stack(ys)


class HashCodeObjective:
    """Parameters ``[W_q, W_k, a, c]`` of one layer; every step is a full batch."""

    def __init__(self, records: Sequence[AttentionRecord], *, bits: int, steps: int,
                 pairs_per_head: int, seed: int) -> None:
        self.records, self.bits, self.steps = list(records), bits, steps
        self.pairs_per_head = pairs_per_head
        self.generator = torch.Generator().manual_seed(seed)
        self.generators = [self.generator]

    def start(self, layer: int, device: torch.device) -> bool:
        self.layer, self.device = layer, device
        return True

    def draw(self, epoch: int) -> int:
        self.q, self.k, self.y = (t.to(self.device) for t in _pairs(
            self.records, self.layer, self.pairs_per_head, self.generator))
        self.pos_weight = (self.y.numel() - self.y.sum()) / self.y.sum().clamp(min=1)
        return self.steps

    def init(self) -> list[Tensor]:
        q, k = self.q.cpu(), self.k.cpu()
        heads, _, d = q.shape
        scale = (q.norm(dim=-1).mean() * k.norm(dim=-1).mean()).clamp(min=1e-6).sqrt()
        start = torch.randn(heads, d, self.bits, generator=self.generator) / scale
        return [start.clone().requires_grad_(), start.clone().requires_grad_(),
                torch.full((heads, 1), 4.0, requires_grad=True),
                torch.zeros(heads, 1, requires_grad=True)]

    def gradients(self, params: list[Tensor], step: int) -> tuple[list[Tensor], Tensor]:
        wq, wk, a, c = params
        similarity = (torch.tanh(self.q @ wq) * torch.tanh(self.k @ wk)).mean(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            a * similarity + c, self.y, pos_weight=self.pos_weight)
        return autograd_gradients(loss, params)

    def held_out_loss(self, params: list[Tensor]) -> Tensor:
        raise NotImplementedError("hash codes have no early stopping")

    def finish(self, params: list[Tensor] | None, log: LayerLog) -> Any:
        return params[0].detach().cpu().clone(), params[1].detach().cpu().clone()


def fit_hash_codes(records: Sequence[AttentionRecord], *, bits: int = HASH_BITS,
                   steps: int = 300, pairs_per_head: int = 8192, lr: float = 0.05,
                   seed: int = 0, progress: bool = False, device: torch.device | str = "cpu",
                   checkpoint: Callable[[dict[str, Any]], None] | None = None,
                   resume: dict[str, Any] | None = None) -> list[tuple[Tensor, Tensor]]:
    """Learn ``(W_q, W_k)`` (heads, d, bits) per layer from TRAINING gold graphs
    (``checkpoint``/``resume``: the loop's state after every layer, and continuing from it)."""
    if not records:
        raise ValueError("hash codes are learned from training gold graphs; pass train_records")
    objective = HashCodeObjective(records, bits=bits, steps=steps,
                                  pairs_per_head=pairs_per_head, seed=seed)
    trainer = Trainer(epochs=1, lr=lr, device=device, progress=progress, desc="hash codes",
                      checkpoint=checkpoint)
    return trainer.fit(objective, records[0].num_layers, resume=resume)
