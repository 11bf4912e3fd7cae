"""The long-text Explorer view-model: windows, search, one head's probabilities, blocks."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.explore.long_view import (
    DEFAULT_WINDOW,
    LONG_TEXT,
    block_overview,
    block_size,
    default_window,
    find_tokens,
    head_probs,
    window_around,
)


def _record(text: str, tokens: list[str], offsets: list[tuple[int, int]]) -> AttentionRecord:
    return AttentionRecord(text=text, tokens=tokens, offsets=offsets,
                           special=[False] * len(tokens), causal=True)


def test_windows():
    assert default_window(300) == (0, 300)
    assert default_window(LONG_TEXT + 1) == (0, DEFAULT_WINDOW)
    assert default_window(4096) == (0, DEFAULT_WINDOW)
    assert window_around(2000, 4096, 256) == (1872, 2128)
    assert window_around(3, 4096, 256) == (0, 256)
    assert window_around(4095, 4096, 256) == (3840, 4096)
    assert window_around(5, 10, 256) == (0, 10)


def test_search_finds_words_split_into_subwords_and_token_strings():
    text = "The lighthouse keeper wrote. A lighthouse!"
    tokens = ["The", "Ġlight", "house", "Ġkeeper", "Ġwrote", ".", "ĠA", "Ġlight", "house", "!"]
    offsets = [(0, 3), (3, 9), (9, 14), (14, 21), (21, 27), (27, 28), (28, 30), (30, 36),
               (36, 41), (41, 42)]
    record = _record(text, tokens, offsets)
    assert find_tokens(record, "Lighthouse") == [1, 7]  # case-insensitive, across subwords
    assert find_tokens(record, "keeper wrote") == [3]  # a phrase
    assert find_tokens(record, "house") == [2, 8]
    assert find_tokens(record, "Ġkeep") == [3]  # a token string
    assert find_tokens(record, "   ") == [] and find_tokens(record, "absent") == []
    assert find_tokens(record, "light", limit=1) == [1]


def test_head_probs_is_one_head_of_the_dense_probabilities():
    gen = torch.Generator().manual_seed(0)
    gold = torch.rand(3, 20, 20, generator=gen) > 0.7
    values = torch.rand(int(gold.sum()), generator=gen)
    graph = LayerGraph(queries=torch.zeros(3, 20, 2), keys=torch.zeros(3, 20, 2), gold=gold,
                       prob_values=values, scaling=1.0)
    dense = graph.probs()
    for head in range(3):
        assert torch.equal(head_probs(graph, head, slice(4, 9), slice(2, 17)),
                           dense[head, 4:9, 2:17])


def test_block_overview_counts_and_recall():
    n = 100
    gold = torch.zeros(n, n, dtype=torch.bool)
    gold[5, 3] = gold[70, 2] = gold[99, 99] = True
    pred = torch.zeros(n, n, dtype=torch.bool)
    pred[5, 3] = pred[70, 60] = True
    overview = block_overview(gold, pred, block=32)
    assert overview.block == 32 and overview.gold.shape == (4, 4)
    assert overview.gold.sum() == 3 and overview.predicted.sum() == 2 and overview.hits.sum() == 1
    assert overview.gold[0, 0] == 1 and overview.gold[2, 0] == 1 and overview.gold[3, 3] == 1
    recall = overview.recall
    assert recall[0, 0] == 1 and recall[2, 0] == 0 and torch.isnan(recall[1, 1])
    assert block_size(4096) == 64 and block_size(2048) == 32 and block_size(100) == 2
    with pytest.raises(ValueError, match="same"):
        block_overview(gold, pred[:10])
