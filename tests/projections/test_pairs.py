"""Training pairs: negatives come from the keys a row may attend to, local windows included."""

from __future__ import annotations

import torch

from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.projections.pairs import _layer_pairs, sample_negatives

HEADS, N, D, WINDOW = 2, 24, 4, 5


def _record(sliding_window, causal=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(HEADS, N, D, generator=g), torch.randn(HEADS, N, D, generator=g)
    i, j = torch.arange(N)[:, None], torch.arange(N)[None]
    gold = (i == j).expand(HEADS, N, N).clone()  # the diagonal, always allowed
    gold[1] |= (i - j == 1)  # head 1 also attends to the previous token
    layer = LayerGraph(q, k, gold, torch.ones(int(gold.sum())), 1.0,
                       sliding_window=sliding_window)
    return AttentionRecord(text="x", tokens=["t"] * N, offsets=[(0, 0)] * N,
                           special=[False] * N, causal=causal, layers=[layer])


def _negative_positions(record, num=50):
    pairs = _layer_pairs([record], 0)
    negs = sample_negatives(pairs.gold_flat, pairs.gold_base, pairs.n_allowed, num,
                            torch.Generator().manual_seed(1))
    rows = pairs.k_base[:, None] + negs  # rows into k_table: head * N + key position
    query = (pairs.q_row - pairs.head * N)[:, None].expand_as(rows)
    return pairs.head[:, None].expand_as(rows), query, rows - pairs.head[:, None] * N


def test_a_local_layer_draws_negatives_only_inside_its_window():
    record = _record(WINDOW)
    head, query, key = _negative_positions(record)
    assert ((query - key >= 0) & (query - key < WINDOW)).all()
    assert not record.layers[0].gold[head, query, key].any()  # non-edges only
    assert (query - key == WINDOW - 1).any()  # the whole window is reachable
    pairs = _layer_pairs([record], 0)  # query 0 sees only itself: no negative, no positive
    assert not ((pairs.q_row - pairs.head * N) == 0).any()


def test_causal_and_full_layers_draw_from_the_past_or_every_key():
    head, query, key = _negative_positions(_record(None))
    assert (key <= query).all() and (query - key >= WINDOW).any()
    head, query, key = _negative_positions(_record(None, causal=False))
    assert (key > query).any() and (key != query).all()
