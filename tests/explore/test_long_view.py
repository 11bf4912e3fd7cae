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
        for rows, cols in ((slice(4, 9), slice(2, 17)), (slice(0, 20), slice(None)),
                           (slice(19, 20), slice(0, 3)), (slice(0, 1), slice(5, 6))):
            assert torch.equal(head_probs(graph, head, rows, cols), dense[head, rows, cols])


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


def _naive_counts(mask: torch.Tensor, block: int) -> torch.Tensor:
    n, m = mask.shape
    nb, mb = -(-n // block), -(-m // block)
    out = torch.zeros(nb, mb, dtype=torch.int64)
    for i in range(nb):
        for j in range(mb):
            out[i, j] = int(mask[i * block:(i + 1) * block, j * block:(j + 1) * block].sum())
    return out


@pytest.mark.parametrize(("n", "m", "block"), [(64, 64, 8), (100, 72, 16), (600, 520, 512),
                                               (40, 40, 12), (9, 300, 256), (1, 1, 8)])
@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
def test_block_overview_counts_every_pair_of_every_block(n, m, block, density):
    """The word-wise counts (8 keys a word, a row count per byte, blocks of over 255 rows
    in chunks) equal a plain count: full and empty blocks, ragged ends, blocks that are not
    whole words, and heads sliced from a (heads, n, m) mask at an unaligned offset."""
    gen = torch.Generator().manual_seed(n + m + block)
    gold = torch.rand(3, n, m, generator=gen) < density
    pred = torch.rand(3, n, m, generator=gen) < 0.5
    for head in range(3):
        overview = block_overview(gold[head], pred[head], block=block)
        assert torch.equal(overview.gold, _naive_counts(gold[head], block))
        assert torch.equal(overview.predicted, _naive_counts(pred[head], block))
        assert torch.equal(overview.hits, _naive_counts(gold[head] & pred[head], block))
    odd = torch.rand(7 * n * m + 1, generator=gen)[1:].view(7, n, m) < density  # offset 1
    overview = block_overview(odd[3], odd[5], block=block)
    assert torch.equal(overview.hits, _naive_counts(odd[3] & odd[5], block))
