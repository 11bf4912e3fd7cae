"""Synthetic records the projection tests share: tokens of 3 latent clusters, and a query
attends exactly to the keys of its own cluster (so a good projection separates them)."""

from __future__ import annotations

import torch

from sparsefinder.data.records import AttentionRecord, LayerGraph

HEADS, D, LAYERS = 2, 8, 2


def cluster_record(gen: torch.Generator, n: int = 24, causal: bool = False,
                   uniform_probs: bool = False) -> AttentionRecord:
    """``uniform_probs``: gold probabilities spread evenly over each row (else all ones)."""
    centers = torch.randn(HEADS, 3, D, generator=gen) * 3
    layers = []
    for _ in range(LAYERS):
        label = torch.randint(0, 3, (HEADS, n), generator=gen)
        pick = centers.gather(1, label[..., None].expand(-1, -1, D))
        q = pick + 0.3 * torch.randn(HEADS, n, D, generator=gen)
        k = pick + 0.3 * torch.randn(HEADS, n, D, generator=gen)
        gold = label[:, :, None] == label[:, None, :]
        if causal:
            gold &= torch.ones(n, n, dtype=torch.bool).tril()
        if uniform_probs:
            values = (gold.float() / gold.sum(-1, keepdim=True).clamp(min=1))[gold]
        else:
            values = torch.ones(int(gold.sum()))
        layers.append(LayerGraph(q, k, gold, values, scaling=D**-0.5))
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=causal, layers=layers)
