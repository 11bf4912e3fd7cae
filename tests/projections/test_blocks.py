"""Block-level projections (paper §6): tile labels, training on pooled blocks, the asset."""

from __future__ import annotations

import math

import pytest
import torch
from tolerances import tol_for

from sparsefinder.bundle import bundle
from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.evaluation.sweep import score_specs
from sparsefinder.methods.registry import MethodUnavailable
from sparsefinder.methods.spec import PredictorSpec, RecordInputs, predict_record
from sparsefinder.metrics.measures import block_recall
from sparsefinder.models.loading import DEFAULT_MODEL_ID
from sparsefinder.predictors.block import LearnedBlockSparsefinder, pool_blocks
from sparsefinder.projections.blocks import (
    DEFAULT_BLOCK,
    LEARNED_BLOCKS,
    block_pair_labels,
    block_record,
    bundled_block_projections,
    bundled_block_projections_by_size,
    bundled_block_projections_path,
    check_block_projections,
    load_block_projections,
    train_block_projections,
)
from sparsefinder.projections.heads import HeadProjections, ProjectionsError

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


def _record(queries: torch.Tensor, keys: torch.Tensor, gold: torch.Tensor,
            causal: bool = False, layers: int = 1) -> AttentionRecord:
    n = queries.shape[1]
    graph = LayerGraph(queries=queries, keys=keys, gold=gold,
                       prob_values=torch.zeros(int(gold.sum())), scaling=1.0)
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=causal, layers=[graph] * layers)


def test_block_pair_labels_are_the_tiles_of_a_hand_made_graph():
    gold = torch.zeros(1, 5, 5, dtype=torch.bool)
    for i, j in ((0, 0), (1, 3), (4, 4), (2, 1)):
        gold[0, i, j] = True
    # blocks of 2: queries {0,1} {2,3} {4}, keys likewise; (1,3) lies in tile (0,1)
    want = [[True, True, False], [True, False, False], [False, False, True]]
    assert block_pair_labels(gold, 2)[0].tolist() == want
    # causal: the future edge (1,3) is no edge, so tile (0,1) is negative
    causal = block_pair_labels(gold, 2, causal=True)[0].tolist()
    assert causal == [[True, False, False], [True, False, False], [False, False, True]]
    # one gold edge inside a tile is enough; a tile without any is negative
    assert block_pair_labels(torch.zeros(2, 4, 4, dtype=torch.bool), 2).sum() == 0


def test_block_record_pools_vectors_and_labels_tiles():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 7, 3, generator=g), torch.randn(2, 7, 3, generator=g)
    gold = torch.rand(2, 7, 7, generator=g) > 0.7
    blocks = block_record(_record(q, k, gold, causal=True), 3)
    layer = blocks.layers[0]
    assert blocks.causal and blocks.n_tokens == 3
    pooled = pool_blocks(q, 3)  # means of 3 tokens: a few roundings
    torch.testing.assert_close(layer.queries, pooled, **tol_for(pooled, terms=4))
    assert torch.equal(layer.queries[:, 2], q[:, 6])  # partial last block: its one token
    assert torch.equal(layer.gold, block_pair_labels(gold, 3, causal=True))
    with pytest.raises(ValueError, match="block must be an integer >= 1"):
        block_record(_record(q, k, gold), 0)


def _planted(seed: int, texts: int = 6, n: int = 64, block: int = 8, d: int = 8):
    """Heads whose gold edges join blocks of the same 'topic' (2 of the d coordinates): the
    tile graph is that topic relation; tokens are topic + a larger per-block nuisance in
    the other coordinates (which a random map mixes in) + noise."""
    g = torch.Generator().manual_seed(seed)
    topics = torch.zeros(4, d)
    topics[:, :2] = torch.randn(4, 2, generator=g) * 3
    records = []
    for _ in range(texts):
        topic = torch.randint(0, 4, (n // block,), generator=g).repeat_interleave(block)
        nuisance = torch.zeros(n // block, d)
        nuisance[:, 2:] = torch.randn(n // block, d - 2, generator=g) * 6
        base = topics[topic] + nuisance.repeat_interleave(block, 0)  # (n, d)
        q = (base + torch.randn(2, n, d, generator=g)).float()
        k = (base + torch.randn(2, n, d, generator=g)).float()
        same = topic[:, None] == topic[None, :]
        gold = same[None].expand(2, n, n) & (torch.rand(2, n, n, generator=g) > 0.8)
        gold = gold | torch.eye(n, dtype=torch.bool)
        records.append(_record(q, k, gold, layers=2))
    return records


def _auc(projections: HeadProjections, records: list[AttentionRecord], block: int) -> float:
    """Share of (positive, negative) block pairs of layer 0 where the positive is closer."""
    pos, neg = [], []
    for record in records:
        layer = block_record(record, block).layers[0]
        dist = torch.cdist(projections.project(0, layer.queries),
                           projections.project(0, layer.keys))
        pos.append(dist[layer.gold])
        neg.append(dist[~layer.gold])
    pos, neg = torch.cat(pos), torch.cat(neg)
    return float((pos[:, None] < neg[None, :]).double().mean())


def test_training_separates_positive_from_negative_block_pairs():
    train, held = _planted(0), _planted(1)
    # from a random start, the Eq. 7 steps lower the hinge loss of every layer...
    start = train_block_projections(train, block=8, rank=2, epochs=1, batch_size=64,
                                    init="random", lr=1e-6)
    trained = train_block_projections(train, block=8, rank=2, epochs=20, batch_size=64,
                                      init="random", lr=0.05)
    meta = trained.metadata
    assert meta["granularity"] == "block" and meta["block"] == 8
    assert all(last < first / 10 for first, last in zip(meta["loss_first"], meta["loss_last"],
                                                        strict=True))
    assert meta["dense_heads"] == [[], []]
    # ... and held-out positive block pairs end up closer than negative ones
    assert _auc(trained, held, 8) > max(0.8, _auc(start, held, 8) + 0.1)
    projections = train_block_projections(train, block=8, rank=2)  # discriminative init
    assert _auc(projections, held, 8) > 0.95
    # and the learned predictor finds the planted tiles: 2 key blocks per query block
    # (of 8) beat an untrained (random) map
    spec = PredictorSpec.of("block-learned", {"block": 8, "n_blocks": 2})
    learned = score_specs(held, None, [spec], fitted=[projections])[0][0]
    random = HeadProjections(weight=torch.randn(2, 2, 2, 8, generator=torch.Generator()
                                                .manual_seed(5)),
                             bias=torch.zeros(2, 2, 2), model_id="x", alpha=1.5,
                             metadata={"granularity": "block", "block": 8})
    chance = score_specs(held, None, [spec], fitted=[random])[0][0]
    assert learned.block_recall > chance.block_recall + 0.1
    assert not math.isnan(learned.exact_fraction)


def test_a_head_dense_at_block_level_keeps_a_zero_map_and_every_block():
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 16, 4, generator=g), torch.randn(2, 16, 4, generator=g)
    gold = torch.eye(16, dtype=torch.bool).repeat(2, 1, 1)
    gold[1] = True  # head 1 attends to every key: no negative tile
    projections = train_block_projections([_record(q, k, gold)], block=4, rank=2)
    assert projections.metadata["dense_heads"] == [[1]]
    assert projections.weight[0, 1].abs().sum() == 0 and projections.weight[0, 0].abs().sum() > 0
    graph = LearnedBlockSparsefinder(projections.weight[0], 4, 1).predict_blocks(q, k)
    assert graph[1].all() and not graph[0].all()
    # a layer where every head is dense: nothing to contrast, no error, all-zero maps
    everything = torch.ones(2, 16, 16, dtype=torch.bool)
    dense = train_block_projections([_record(q, k, everything)], block=4, rank=2)
    assert dense.metadata["dense_heads"] == [[0, 1]] and dense.weight.abs().sum() == 0


def test_token_projections_or_another_block_size_are_refused():
    token = HeadProjections.load(bundle().path("projections.pt"))
    with pytest.raises(ProjectionsError, match="trained on token pairs"):
        check_block_projections(token)
    with pytest.raises(ProjectionsError, match="fit-block-projections"):
        load_block_projections(bundle().path("projections.pt"))
    blocks = load_block_projections(bundled_block_projections_path(32))
    with pytest.raises(ProjectionsError, match="trained on blocks of 32 tokens, not 16"):
        check_block_projections(blocks, 16)
    spec = PredictorSpec.of("block-learned", {"block": 16, "n_blocks": 1})
    with pytest.raises(MethodUnavailable, match="not 16"):  # a sweep skips it with the reason
        spec.build(None, 0, blocks)
    with pytest.raises(ValueError, match="learned from training graphs"):
        spec.build(None, 0, None)
    with pytest.raises(ValueError, match=r"no block projections for blocks of 16 tokens "
                                         r"\(fitted: \[32\]\)"):
        spec.build(None, 0, {32: blocks})


def test_the_bundled_assets_fit_the_default_model(default_model):
    bundled = bundled_block_projections_by_size("default")
    assert sorted(bundled) == list(LEARNED_BLOCKS) == [16, 32]
    config = default_model.model.config
    heads = config.num_attention_heads
    for block, projections in bundled.items():
        assert bundled_block_projections_path(block).stat().st_size < 300_000
        assert projections.model_id == DEFAULT_MODEL_ID
        assert (projections.num_layers, projections.num_heads, projections.head_dim) == (
            config.num_hidden_layers, heads, config.hidden_size // heads)
        meta = projections.metadata
        assert meta["block"] == block and meta["split"] == "train"
        assert meta["corpus"] == "default" and meta["max_passages"] is None
    assert bundled_block_projections("default").metadata["block"] == DEFAULT_BLOCK
    assert bundled_block_projections("someone/else") is None
    assert bundled_block_projections("default", block=8) is None
    assert bundled_block_projections_by_size("someone/else") == {}
    # they predict on a real text's q/k through the registry: block graphs per layer, the
    # diagonal always kept, scored with block recall
    from sparsefinder.data.records import extract

    record = extract(default_model, ["Block projections pool thirty-two tokens at a time, "
                                     "then pick the key blocks each query block needs. " * 3])[0]
    for block in LEARNED_BLOCKS:
        spec = PredictorSpec.of("block-learned", {"block": block, "n_blocks": 1})
        masks = predict_record(spec, spec.build_layers(None, record.num_layers, bundled),
                               RecordInputs(record))
        for mask, layer in zip(masks, record.layers, strict=True):
            assert mask.shape == layer.gold.shape
            assert mask.diagonal(dim1=-2, dim2=-1).all()
            assert (block_recall(mask, layer.gold, block) > 0).all()


@pytest.mark.numerical
def test_pooled_graph_carries_each_tiles_gold_mass() -> None:
    """A pooled graph's edge probabilities are its tiles' gold mass (the pair sampler reads
    them for every positive tile), so its rows sum to the tokens' rows summed."""
    gen = torch.Generator().manual_seed(0)
    n, block = 70, 32  # a partial last tile
    scores = torch.randn(2, n, n, generator=gen, dtype=torch.float64)
    probs = torch.where(scores > 1.0, scores.exp(), torch.zeros(()))
    probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-300)
    gold = probs > 0
    q = torch.randn(2, n, 4, generator=gen)
    graph = LayerGraph(q, q, gold, probs[gold].float(), 0.5)
    record = AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                             special=[False] * n, causal=False, layers=[graph])
    pooled = block_record(record, block).layers[0]
    mass = pooled.probs().double()
    want = torch.stack([probs[:, i * block:(i + 1) * block].sum(1) for i in range(3)], 1)
    want = torch.stack([want[..., j * block:(j + 1) * block].sum(-1) for j in range(3)], -1)
    # float32 probabilities (each rounded once) summed over a tile's block² pairs
    torch.testing.assert_close(mass, want, **tol_for(want, terms=block * block + 1,
                                                     dtype=torch.float32, scale=1.0))
    assert (mass > 0).equal(pooled.gold)
