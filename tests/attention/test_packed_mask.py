"""Bit-packed gold masks: exact round trips, one head on its own, bad input, stored size."""

from __future__ import annotations

import dataclasses
import gc
import weakref

import pytest
import torch

from sparsefinder.attention.packed_mask import pack_mask, unpack_mask
from sparsefinder.data.records import LayerGraph


@pytest.mark.parametrize("shape", [(3, 5, 13), (2, 4, 8), (1, 1, 1), (4, 0, 16), (2, 3, 0),
                                   (7,), (2, 9, 64), (3, 17, 1)])
@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
def test_pack_unpack_round_trips_exactly(shape, density):
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(1)) < density
    packed = pack_mask(mask)
    assert packed.dtype == torch.uint8
    assert packed.shape == (*shape[:-1], -(-shape[-1] // 8))
    unpacked = unpack_mask(packed, shape[-1])
    assert unpacked.dtype == torch.bool and torch.equal(unpacked, mask)


def test_bit_order_is_entry_8j_plus_k():
    mask = torch.zeros(1, 10, dtype=torch.bool)
    mask[0, [0, 3, 9]] = True
    assert pack_mask(mask).tolist() == [[1 + 8, 2]]


def test_non_contiguous_and_offset_views_pack_like_their_copies():
    base = torch.rand(40, generator=torch.Generator().manual_seed(2)) < 0.5
    shifted = base[3:19].view(2, 8)  # storage offset 3: not whole int64 words
    transposed = (torch.rand(16, 6) < 0.5).t()
    for view in (shifted, transposed):
        assert torch.equal(pack_mask(view), pack_mask(view.contiguous()))
        assert torch.equal(unpack_mask(pack_mask(view), view.shape[-1]), view)


def test_leading_index_unpacks_alone():
    mask = torch.rand(4, 6, 21, generator=torch.Generator().manual_seed(3)) < 0.4
    packed = pack_mask(mask)
    assert torch.equal(unpack_mask(packed[2], 21), mask[2])
    assert torch.equal(unpack_mask(packed[[0, 3]], 21), mask[[0, 3]])


def test_non_bool_mask_is_rejected_with_the_fix():
    with pytest.raises(TypeError, match=r"bool tensor, got torch.float32; pass e.g. `probs > 0`"):
        pack_mask(torch.ones(2, 3))
    with pytest.raises(ValueError, match="at least one axis"):
        pack_mask(torch.tensor(True))


def _graph(heads=4, n=256, d=16, density=0.05, seed=0):
    gen = torch.Generator().manual_seed(seed)
    gold = torch.rand(heads, n, n, generator=gen) < density
    return LayerGraph(torch.randn(heads, n, d, generator=gen), torch.randn(heads, n, d,
                      generator=gen), gold, torch.rand(int(gold.sum()), generator=gen), 0.25), gold


def test_layer_graph_reads_back_the_exact_dense_mask():
    graph, gold = _graph()
    assert torch.equal(graph.gold, gold) and graph.gold_shape == (4, 256, 256)
    assert torch.equal(graph.gold_of(1), gold[1])
    assert torch.equal(graph.gold_of([0, 2]), gold[[0, 2]])
    assert torch.equal(graph.gold_of(slice(1, 3)), gold[1:3])
    probs = graph.probs()
    assert torch.equal(probs > 0, gold) and torch.equal(probs[gold], graph.prob_values)
    copy = dataclasses.replace(graph, alpha=1.5)
    assert torch.equal(copy.gold, gold) and copy.alpha == 1.5


def test_layer_graph_stores_an_eighth_of_the_dense_mask():
    heads, n, d = 4, 256, 16
    graph, gold = _graph(heads, n, d)
    vectors = 2 * heads * n * d * 4
    edges = int(gold.sum()) * 4
    assert graph.stored_bytes() == vectors + heads * n * n // 8 + edges  # dense: + 7/8 h·n²
    tensors = [v for v in vars(graph).values() if isinstance(v, torch.Tensor)]
    tensors += [v[0] for v in vars(graph).values() if isinstance(v, tuple)]
    assert not any(t.dtype == torch.bool for t in tensors)  # no dense mask kept anywhere
    assert sum(t.numel() * t.element_size() for t in tensors) == graph.stored_bytes()


def test_layer_graph_does_not_keep_the_given_or_a_read_mask_alive():
    graph, gold = _graph()
    given, read = weakref.ref(gold), weakref.ref(graph.gold)
    del gold
    gc.collect()
    assert given() is None and read() is None
    mutated = graph.gold
    mutated[:] = False  # a read is a copy: the stored mask is unchanged
    assert bool(graph.gold.any())


@pytest.mark.parametrize("m", [1, 7, 8, 13, 64])
def test_counting_packed_rows_equals_counting_the_mask(m):
    from sparsefinder.attention.packed_mask import count_packed

    mask = torch.rand(3, 5, m, generator=torch.Generator().manual_seed(m)) < 0.4
    mask[0, 0] = True  # a full row: padding bits must not count
    assert torch.equal(count_packed(pack_mask(mask)), mask.sum(-1))


def test_gold_count_counts_each_heads_gold_without_unpacking():
    from sparsefinder.data.records import LayerGraph

    gold = torch.rand(4, 9, 11, generator=torch.Generator().manual_seed(2)) < 0.3
    graph = LayerGraph(torch.zeros(4, 9, 2), torch.zeros(4, 11, 2), gold,
                       torch.ones(int(gold.sum())), 1.0)
    assert [graph.gold_count(h) for h in range(4)] == gold.sum((-2, -1)).tolist()
