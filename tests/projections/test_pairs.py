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


def test_softmax_layers_are_not_trained_and_predict_every_key(sparse_modernbert_records):
    """ModernBERT's local layers ran softmax (dense gold): training leaves their maps at zero
    (every key at distance 0: the whole window predicted) and lists them in the metadata."""
    from sparsefinder.projections.hinge import train_projections
    from sparsefinder.projections.logistic import train_logistic
    from sparsefinder.projections.pairs import softmax_layer

    records = sparse_modernbert_records
    assert [softmax_layer(records, i) for i in range(4)] == [False, True, True, False]
    projections = train_projections(records, rank=2, batch_size=64, alpha=1.5)
    assert projections.metadata["softmax_layers"] == [1, 2]
    assert projections.metadata["positives_per_layer"][1:3] == [0, 0]
    for layer in range(4):
        zero = bool((projections.weight[layer] == 0).all())
        assert zero == (layer in (1, 2))
    logistic = train_logistic(list(records), rank=2, batch_size=64)
    assert bool((logistic.weight[1] == 0).all()) and bool(logistic.weight[0].abs().sum() > 0)


def test_mixed_softmax_and_entmax_records_of_one_layer_are_refused(sparse_modernbert_records):
    import dataclasses

    import pytest

    from sparsefinder.projections.pairs import softmax_layer

    record = sparse_modernbert_records[0]
    odd = dataclasses.replace(record, layers=[dataclasses.replace(g, alpha=1.5)
                                              for g in record.layers])
    with pytest.raises(ValueError, match="layer 1 ran softmax in some records"):
        softmax_layer([record, odd], 1)
