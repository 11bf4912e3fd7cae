"""Block Sparsefinder: nearest key blocks of pooled projections, ∪ the diagonal band."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.attention.masks import layer_allowed
from sparsefinder.methods.spec import PredictorSpec, predict_layer
from sparsefinder.metrics.measures import block_graph, block_recall, exact_fraction
from sparsefinder.predictors.base import honours_window
from sparsefinder.predictors.block import (
    BlockSparsefinder,
    LearnedBlockSparsefinder,
    pool_blocks,
)


def test_pool_blocks_means_including_a_partial_last_block():
    x = torch.arange(10, dtype=torch.float32).view(1, 10, 1)
    assert pool_blocks(x, 4).view(-1).tolist() == [1.5, 5.5, 8.5]


def test_nearest_blocks_and_the_diagonal():
    # Query block 0 sits next to key block 2; query block 2 next to key block 0.
    q = torch.tensor([0.0] * 4 + [10.0] * 4 + [20.0] * 4).view(1, 12, 1)
    k = torch.tensor([20.0] * 4 + [30.0] * 4 + [0.0] * 4).view(1, 12, 1)
    graph = BlockSparsefinder(4, 1).predict_blocks(q, k)
    assert graph[0].tolist() == [[True, False, True], [True, True, False],
                                 [True, False, True]]
    only_nearest = BlockSparsefinder(4, 1, window_blocks=0).predict_blocks(q, k)
    assert only_nearest[0].tolist() == [[False, False, True], [True, False, False],
                                        [True, False, False]]


def test_token_mask_is_the_expanded_block_graph_and_causal_drops_the_future():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 50, 4, generator=g), torch.randn(2, 50, 4, generator=g)
    predictor = BlockSparsefinder(8, 2)
    graph = predictor.predict_blocks(q, k)
    mask = predictor.predict(q, k)
    assert torch.equal(block_graph(mask, 8), graph)
    assert (graph.sum(-1) >= 2).all()
    causal = predictor.predict(q, k, causal=True)
    assert not (causal & ~torch.ones(50, 50, dtype=torch.bool).tril()).any()
    assert causal.diagonal(dim1=-2, dim2=-1).all()  # the diagonal block is always kept
    blocks = predictor.predict_blocks(q, k, causal=True)
    assert not (blocks & ~torch.ones(7, 7, dtype=torch.bool).tril()).any()
    assert (blocks.sum(-1) >= torch.arange(1, 8).clamp(max=2)).all()  # 2 nearest past blocks


def test_more_blocks_never_lose_recall():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(3, 64, 4, generator=g), torch.randn(3, 64, 4, generator=g)
    gold = torch.rand(3, 64, 64, generator=g) < 0.05
    previous = None
    for n_blocks in range(0, 9):
        pred = BlockSparsefinder(8, n_blocks).predict(q, k)
        recall = block_recall(pred, gold, 8)
        if previous is not None:
            assert (recall >= previous).all()
        previous = recall
    assert torch.allclose(previous, torch.ones(3, dtype=torch.float64))
    assert torch.allclose(exact_fraction(pred, gold), torch.ones(3, dtype=torch.float64))


def test_spec_builds_it_and_bad_parameters_are_errors():
    spec = PredictorSpec.of("block", {"block": 32, "n_blocks": 3, "n_keys": 5})
    assert spec.build(None, 0) == BlockSparsefinder(32, 3, 5)
    with pytest.raises(ValueError, match="block must be an integer >= 1"):
        BlockSparsefinder(0, 1)
    with pytest.raises(ValueError, match="n_blocks must be an integer >= 0"):
        BlockSparsefinder(8, -1)
    with pytest.raises(ValueError, match="n_keys must be an integer >= 0"):
        BlockSparsefinder(8, 1, n_keys=True)


def test_single_keys_are_the_nearest_outside_the_chosen_blocks():
    q = torch.zeros(1, 8, 1)  # two query blocks of 4, both at 0
    k = torch.tensor([9.0, 9, 9, 9, 0.5, 8, 0.1, 7]).view(1, 8, 1)
    predictor = BlockSparsefinder(4, 0, n_keys=2, window_blocks=1)
    graph, extra = predictor.select(q, k)
    assert graph[0].tolist() == [[True, False], [False, True]]  # the diagonal blocks
    assert sorted(extra[0, 0].tolist()) == [4, 6]  # nearest keys outside block 0
    mask = predictor.predict(q, k)
    assert mask[0, 0].tolist() == [True] * 4 + [True, False, True, False]
    assert mask[0, 3].tolist() == mask[0, 0].tolist()  # the whole query block
    causal = predictor.predict(q, k, causal=True)
    assert not (causal[0] & ~torch.ones(8, 8, dtype=torch.bool).tril()).any()


# ==================================================================== learned block projections


def test_learned_blocks_score_pooled_projections_shapes_and_causal():
    from sparsefinder.predictors.block import LearnedBlockSparsefinder

    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(3, 50, 6, generator=g), torch.randn(3, 50, 6, generator=g)
    weight = torch.randn(3, 2, 6, generator=g)
    predictor = LearnedBlockSparsefinder(weight, 8, 2)
    graph = predictor.predict_blocks(q, k)
    assert graph.shape == (3, 7, 7) and graph.dtype == torch.bool
    # exactly the 2 nearest pooled key blocks ∪ the diagonal block
    qb, kb = pool_blocks(q, 8) @ weight.transpose(1, 2), pool_blocks(k, 8) @ weight.transpose(1, 2)
    near = torch.cdist(qb, kb).topk(2, dim=-1, largest=False).indices
    want = torch.zeros(3, 7, 7, dtype=torch.bool).scatter(-1, near, True) | torch.eye(7).bool()
    assert torch.equal(graph, want)
    mask = predictor.predict(q, k)
    assert mask.shape == (3, 50, 50) and torch.equal(block_graph(mask, 8), graph)
    causal = predictor.predict(q, k, causal=True)
    assert not (causal & ~torch.ones(50, 50, dtype=torch.bool).tril()).any()
    assert causal.diagonal(dim1=-2, dim2=-1).all()
    blocks = predictor.predict_blocks(q, k, causal=True)
    assert not (blocks & ~torch.ones(7, 7, dtype=torch.bool).tril()).any()
    assert (blocks.sum(-1)[:, 2:] >= 2).all()  # past blocks fill the budget when they exist


def test_learned_blocks_refuse_bad_inputs():
    from sparsefinder.predictors.block import LearnedBlockSparsefinder

    with pytest.raises(ValueError, match=r"weight must be one layer's block projections"):
        LearnedBlockSparsefinder(torch.zeros(2, 6), 8, 1)
    with pytest.raises(ValueError, match="n_blocks must be an integer >= 0"):
        LearnedBlockSparsefinder(torch.zeros(2, 2, 6), 8, -1)
    predictor = LearnedBlockSparsefinder(torch.zeros(2, 2, 6), 8, 1)
    with pytest.raises(ValueError, match=r"the model's own vectors"):
        predictor.predict(torch.zeros(2, 10, 4), torch.zeros(2, 10, 4))


def test_single_keys_can_be_added_to_key_blocks_chosen_elsewhere():
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 40, 4, generator=g), torch.randn(2, 40, 4, generator=g)
    chosen = torch.zeros(2, 5, 5, dtype=torch.bool)
    chosen[:, :, 0] = True
    graph, extra = BlockSparsefinder(8, 1, n_keys=3).select(q, k, graph=chosen)
    assert graph is chosen and extra.shape == (2, 5, 3)
    assert (extra >= 8).all()  # never a key of the blocks already kept
    with pytest.raises(ValueError, match=r"graph must be bool \(heads, ceil\(n/b\), "
                                         r"ceil\(m/b\)\) = \(2, 5, 5\), got \(2, 4, 5\)"):
        BlockSparsefinder(8, 1).select(q, k, graph=chosen[:, :4])


# ==================================================================== local (sliding-window) layers


def _allowed(i: int, j: int, n: int, m: int, causal: bool, window: int | None) -> bool:
    """One pair of a layer, written out from the masks module's convention."""
    p = i + m - n
    if window:
        return 0 <= p - j < window if causal else abs(p - j) < window
    return j <= p if causal else True


def _reference(q, k, b, n_blocks, window_blocks, causal, window, tile_score=None):
    """Slow block graph and token mask: per query block, score only the key blocks one of its
    queries may attend to, keep the n_blocks best ∪ the reachable band, cut token pairs."""
    heads, n, _ = q.shape
    m = k.shape[1]
    nq, nk = -(-n // b), -(-m // b)
    graph = torch.zeros(heads, nq, nk, dtype=torch.bool)
    for h in range(heads):
        for big_i in range(nq):
            rows = range(big_i * b, min((big_i + 1) * b, n))
            qbar = q[h, list(rows)].double().mean(0)
            score: dict[int, float] = {}
            for j in range(m):
                if any(_allowed(i, j, n, m, causal, window) for i in rows):
                    s = (-float(((qbar - k[h, j].double()) ** 2).sum()) if tile_score is None
                         else float(tile_score[h, big_i, j // b]))
                    score[j // b] = max(score.get(j // b, -float("inf")), s)
            best = sorted(score, key=lambda t: -score[t])[:n_blocks]
            diagonal = (rows[-1] + m - n) // b
            for t in score:
                graph[h, big_i, t] = t in best or abs(t - diagonal) < window_blocks
    mask = torch.zeros(heads, n, m, dtype=torch.bool)
    for i in range(n):
        for j in range(m):
            if _allowed(i, j, n, m, causal, window):
                mask[:, i, j] = graph[:, i // b, j // b]
    return graph, mask


@pytest.mark.parametrize(("n", "m", "causal", "window"),
                         [(40, 40, True, 10), (40, 40, False, 6), (30, 38, True, 9),
                          (37, 37, False, 1), (37, 37, True, None), (30, 39, False, None)])
@pytest.mark.parametrize("window_blocks", [0, 1])
def test_blocks_are_chosen_inside_the_local_window(n, m, causal, window, window_blocks):
    g = torch.Generator().manual_seed(n + m + (window or 0))
    q, k = torch.randn(2, n, 4, generator=g), torch.randn(2, m, 4, generator=g)
    predictor = BlockSparsefinder(4, 2, window_blocks=window_blocks)
    graph = predictor.predict_blocks(q, k, causal=causal, sliding_window=window)
    want_graph, want_mask = _reference(q, k, 4, 2, window_blocks, causal, window)
    assert torch.equal(graph, want_graph)
    assert torch.equal(predictor.predict(q, k, causal=causal, sliding_window=window), want_mask)


def test_the_block_budget_is_spent_inside_the_window():
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(3, 64, 4, generator=g), torch.randn(3, 64, 4, generator=g)
    for causal, window in [(True, 16), (False, 9)]:
        predictor = BlockSparsefinder(4, 3, window_blocks=0)
        graph = predictor.predict_blocks(q, k, causal=causal, sliding_window=window)
        # every query block away from the edges reaches >= 5 key blocks: it keeps exactly 3
        assert (graph[:, 4:-4].sum(-1) == 3).all()
        allowed = layer_allowed(64, 64, causal=causal, sliding_window=window)
        cut_after = predictor.predict(q, k, causal=causal) & allowed
        inside = predictor.predict(q, k, causal=causal, sliding_window=window)
        assert not (inside & ~allowed).any()
        # the blind choice loses pairs to blocks the window cuts; the aware one keeps more
        assert inside.sum() > cut_after.sum()


def test_single_keys_are_chosen_inside_the_window_and_spec_passes_it():
    g = torch.Generator().manual_seed(6)
    q, k = torch.randn(2, 48, 4, generator=g), torch.randn(2, 48, 4, generator=g)
    predictor = BlockSparsefinder(8, 1, n_keys=3, window_blocks=0)
    graph, extra = predictor.select(q, k, causal=True, sliding_window=12)
    block_last = torch.arange(6)[:, None] * 8 + 7
    block_first = torch.arange(6)[:, None] * 8
    # from the query block of at least 16 reachable keys on, the 3 keys lie in its reach
    assert ((extra[:, 1:] <= block_last[1:]) & (extra[:, 1:] > block_first[1:] - 12)).all()
    assert not graph.gather(-1, torch.div(extra, 8, rounding_mode="floor")).any()
    mask = predictor.predict(q, k, causal=True, sliding_window=12)
    assert torch.equal(predict_layer(predictor, q, k, causal=True, sliding_window=12), mask)
    assert honours_window(predictor) and honours_window(LearnedBlockSparsefinder(
        torch.ones(2, 2, 4), 8, 1))


@pytest.mark.parametrize(("causal", "window"), [(True, 10), (False, 6), (True, None),
                                                (False, None)])
def test_learned_blocks_are_chosen_inside_the_local_window(causal, window):
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(3, 40, 6, generator=g), torch.randn(3, 40, 6, generator=g)
    weight = torch.randn(3, 2, 6, generator=g)
    weight[2] = 0  # a dense head keeps every reachable block
    predictor = LearnedBlockSparsefinder(weight, 4, 2, window_blocks=0)
    wt = weight.transpose(1, 2)
    tiles = -torch.cdist(pool_blocks(q, 4) @ wt, pool_blocks(k, 4) @ wt) ** 2
    want_graph, want_mask = _reference(q, k, 4, 2, 0, causal, window, tile_score=tiles)
    dense_graph, dense_mask = _reference(q, k, 4, 10, 0, causal, window,
                                         tile_score=torch.zeros(3, 10, 10))
    want_graph[2], want_mask[2] = dense_graph[2], dense_mask[2]
    assert torch.equal(predictor.predict_blocks(q, k, causal=causal, sliding_window=window),
                       want_graph)
    assert torch.equal(predictor.predict(q, k, causal=causal, sliding_window=window), want_mask)


def test_learned_block_parameters_are_checked_with_full_messages():
    with pytest.raises(ValueError, match=r"^weight must be one layer's block projections "
                                         r"\(heads, r, d\), got torch.Size\(\[2, 6\]\)$"):
        LearnedBlockSparsefinder(torch.zeros(2, 6), 8, 1)
    with pytest.raises(ValueError, match=r"got list$"):
        LearnedBlockSparsefinder([1.0], 8, 1)
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match=rf"^block must be an integer >= 1, got {bad!r}$"):
            LearnedBlockSparsefinder(torch.zeros(2, 2, 6), bad, 1)
    assert LearnedBlockSparsefinder(torch.zeros(2, 2, 6), 1, 0).block == 1
