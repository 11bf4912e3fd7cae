"""Calibration samples come from a layer's allowed pairs, so a local layer meets its target
over its window's pairs (the Scorer's denominator)."""

from __future__ import annotations

import torch

from sparsefinder.attention.masks import layer_allowed
from sparsefinder.calibration.estimators import CalibratedDistance
from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.metrics.scorer import Scorer
from sparsefinder.projections.heads import HeadProjections

HEADS, D, WINDOW = 2, 3, 8


def _record(n: int, seed: int) -> AttentionRecord:
    """Vectors that encode the position: nearby tokens are close, so a threshold set on all
    causal pairs keeps almost every pair of a narrow window."""
    g = torch.Generator().manual_seed(seed)
    position = torch.arange(n, dtype=torch.float32)[None, :, None] * 0.3
    layers = []
    for window in (None, WINDOW):  # layer 0: full causal; layer 1: local
        q = torch.cat([position.expand(HEADS, n, 1), torch.randn(HEADS, n, D - 1, generator=g)],
                      -1)
        k = q + 0.1 * torch.randn(HEADS, n, D, generator=g)
        allowed = layer_allowed(n, n, causal=True, sliding_window=window)
        gold = (torch.eye(n, dtype=torch.bool) & allowed).expand(HEADS, n, n).clone()
        layers.append(LayerGraph(q, k, gold, torch.ones(int(gold.sum())), 1.0,
                                 sliding_window=window))
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=True, layers=layers)


def test_a_local_layer_lands_on_its_target_over_the_window_pairs():
    records = [_record(n, seed) for seed, n in enumerate((40, 56, 64, 48, 60, 52))]
    identity = torch.eye(D).expand(2, HEADS, D, D).contiguous()
    projections = HeadProjections(weight=identity, bias=torch.zeros(2, HEADS, D),
                                  model_id="synthetic", alpha=1.5)
    target = 0.6
    fitted = CalibratedDistance(target_sparsity=target).fit_records(records, projections,
                                                                   samples_per_text=2048)
    sparsity = []
    for record in records:
        preds = []
        for layer, graph in enumerate(record.layers):
            q, k = graph.queries, graph.keys  # identity projections
            mask = fitted.for_layer(layer).predict(q, k, causal=True)
            allowed = layer_allowed(q.shape[1], k.shape[1], causal=True,
                                    sliding_window=graph.sliding_window)
            preds.append(mask & allowed)
        sparsity.append(Scorer(record).score(preds).sparsity)
    per_layer = torch.stack(sparsity).mean(0).mean(-1)  # (layers,)
    assert abs(float(per_layer[1]) - target) < 0.03  # the local layer, over its window
    assert abs(float(per_layer[0]) - target) < 0.03
