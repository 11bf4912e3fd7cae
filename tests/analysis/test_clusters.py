"""Cluster breakdowns and per-tag recall on hand-made examples with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from sparsefinder.analysis.clusters import (
    HeadClusterAnalysis,
    cluster_breakdown,
    cluster_edges,
    cluster_tokens,
    corpus_breakdown,
    sum_tables,
    tag_cluster_counts,
    tag_edge_counts,
    tag_scores,
    to_percentages,
)
from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.projections.heads import HeadProjections

TAGS = ["NOUN", "VERB", "NOUN", "DET", "NOUN", "VERB"]
IDS = torch.tensor([0, 1, 0, 2, 1, 1])


def test_breakdown_hand_example_known_percentages():
    table = cluster_breakdown(TAGS, IDS, n_clusters=3)
    assert list(table.columns) == [0, 1, 2]
    assert table.loc["NOUN"].tolist() == pytest.approx([200 / 3, 100 / 3, 0.0])
    assert table.loc["VERB"].tolist() == pytest.approx([0.0, 100.0, 0.0])
    assert table.loc["DET"].tolist() == pytest.approx([0.0, 0.0, 100.0])
    np.testing.assert_allclose(table.sum(axis=1), 100.0)


def test_random_breakdown_rows_sum_to_100():
    rng = np.random.default_rng(0)
    tags = rng.choice(["ADJ", "NOUN", "VERB", "PUNCT"], size=200).tolist()
    ids = torch.from_numpy(rng.integers(0, 8, size=(200, 2)))
    for top_k in (1, 2):
        table = cluster_breakdown(tags, ids, 8, top_k=top_k)
        np.testing.assert_allclose(table.sum(axis=1), 100.0)


def test_top_k_counts_each_token_once_per_cluster():
    ids = torch.tensor([[0, 1], [0, 2], [1, 0]])
    counts = tag_cluster_counts(["A", "A", "B"], ids, 3, top_k=2)
    assert counts.loc["A"].tolist() == [2, 1, 1] and counts.loc["B"].tolist() == [1, 1, 0]
    assert tag_cluster_counts(["A", "A", "B"], ids, 3).loc["A"].tolist() == [2, 0, 0]
    with pytest.raises(ValueError, match="top_k=3"):
        tag_cluster_counts(["A", "A", "B"], ids, 3, top_k=3)
    with pytest.raises(ValueError, match="align"):
        tag_cluster_counts(["A"], ids, 3)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        tag_cluster_counts(["A", "A", "B"], ids, 2, top_k=2)


def test_aggregation_pools_counts_across_records():
    first = (["NOUN", "VERB"], torch.tensor([0, 1]))
    second = (["NOUN", "NOUN", "ADJ"], torch.tensor([1, 1, 0]))
    pooled = corpus_breakdown([first, second], 2)
    expected = cluster_breakdown(first[0] + second[0], torch.cat([first[1], second[1]]), 2)
    pd.testing.assert_frame_equal(pooled, expected.loc[pooled.index], check_dtype=False)
    assert pooled.loc["NOUN"].tolist() == pytest.approx([100 / 3, 200 / 3])
    summed = sum_tables([tag_cluster_counts(*first, 2), tag_cluster_counts(*second, 2)])
    assert summed.loc["ADJ"].tolist() == [1, 0] and summed.dtypes.unique().tolist() == [np.int64]


def test_empty_rows_are_dropped_from_percentages():
    counts = pd.DataFrame([[0, 0], [1, 3]], index=["A", "B"])
    assert to_percentages(counts).index.tolist() == ["B"]


def test_per_tag_recall_and_sparsity_hand_mask():
    tags = ["NOUN", "VERB", "NOUN"]
    gold = torch.tensor([[1, 1, 0], [0, 1, 0], [1, 0, 1]], dtype=torch.bool)
    pred = torch.tensor([[1, 0, 0], [0, 1, 1], [1, 0, 1]], dtype=torch.bool)
    counts = tag_edge_counts(tags, pred, gold)
    assert counts.loc["NOUN"].tolist() == [2, 4, 3, 3, 6]  # tokens gold hit predicted allowed
    scores = tag_scores(counts)
    assert scores.loc["NOUN", "recall"] == pytest.approx(3 / 4)
    assert scores.loc["NOUN", "sparsity"] == pytest.approx(1 - 3 / 6)
    assert scores.loc["VERB", "recall"] == 1.0
    assert scores.loc["VERB", "sparsity"] == pytest.approx(1 - 2 / 3)
    assert scores.index[0] == "NOUN"  # worst recall first


def test_per_tag_causal_counts_only_the_past():
    pred = torch.ones(3, 3, dtype=torch.bool)
    counts = tag_edge_counts(["A", "A", "A"], pred, pred.tril(), causal=True)
    assert counts.loc["A", "predicted"] == 6 and counts.loc["A", "allowed"] == 6
    assert tag_scores(counts).loc["A", "sparsity"] == 0.0


def test_per_tag_aggregation_equals_pooled_counts():
    rng = torch.Generator().manual_seed(1)
    parts = []
    for n, tags in ((4, ["A", "B", "A", "C"]), (3, ["B", "B", "A"])):
        gold = torch.rand(n, n, generator=rng) > 0.5
        pred = torch.rand(n, n, generator=rng) > 0.4
        parts.append((tags, pred, gold))
    summed = sum_tables(tag_edge_counts(t, p, g) for t, p, g in parts)
    # pooled by hand: per-row counts of both texts, grouped by tag
    rows = []
    for tags, pred, gold in parts:
        for i, tag in enumerate(tags):
            rows.append((tag, int(gold[i].sum()), int((pred[i] & gold[i]).sum())))
    for tag in "ABC":
        gold_sum = sum(g for t, g, _ in rows if t == tag)
        hit_sum = sum(h for t, _, h in rows if t == tag)
        assert summed.loc[tag, "gold"] == gold_sum and summed.loc[tag, "hit"] == hit_sum
    assert summed["tokens"].sum() == 7


def test_cluster_tokens_and_edges():
    tokens = ["[CLS]", "the", "cat", "sat"]
    ids = torch.tensor([[2, 0], [0, 1], [2, 1], [0, 2]])
    assert cluster_tokens(tokens, ids, top_k=1) == {
        0: [(1, "the"), (3, "sat")],
        2: [(0, "[CLS]"), (2, "cat")],
    }
    assert cluster_tokens(tokens, ids)[1] == [(1, "the"), (2, "cat")]
    edges = cluster_edges(ids[:, :1], ids[:, :1], 2)
    assert edges.nonzero().tolist() == [[0, 0], [0, 2], [2, 0], [2, 2]]
    gold = torch.eye(4, dtype=torch.bool)
    assert cluster_edges(ids[:, 0], ids[:, 0], 2, mask=gold).nonzero().tolist() == [[0, 0], [2, 2]]


def _tiny_setup():
    """Two heads, r = d = 2 identity projections, 2 centroids at (-1, 0) and (1, 0)."""
    heads, d = 2, 2
    weight = torch.eye(d).expand(1, heads, d, d).clone()
    centroids = torch.tensor([[-1.0, 0.0], [1.0, 0.0]]).expand(1, heads, 2, d).clone()
    proj = HeadProjections(
        weight=weight, bias=torch.zeros(1, heads, d), model_id="toy", alpha=1.5,
        centroids={2: centroids},
    )  # fmt: skip
    x = torch.tensor([[-1.0, 0.1], [1.0, 0.0], [-0.9, 0.0]]).expand(heads, 3, d).clone()
    gold = torch.tensor([[1, 0, 1], [0, 1, 1], [1, 0, 1]], dtype=torch.bool).expand(heads, 3, 3)
    probs = gold.float() / gold.sum(-1, keepdim=True)
    layer = LayerGraph(queries=x, keys=x, gold=gold.clone(), prob_values=probs[gold], scaling=1.0)
    record = AttentionRecord(
        text="a b c", tokens=["a", "b", "c"], offsets=[(0, 1), (2, 3), (4, 5)],
        special=[False] * 3, causal=False, layers=[layer],
    )  # fmt: skip
    return proj, record


def test_head_analysis_on_a_tiny_record():
    proj, record = _tiny_setup()
    analysis = HeadClusterAnalysis(proj, layer=0, head=1, n_clusters=2, top_k=1)
    analysis.add(record, ["NOUN", "VERB", "NOUN"])
    analysis.add(record, ["NOUN", "VERB", "NOUN"])
    assert analysis.n_records == 2
    assert analysis.query_percentages.loc["NOUN"].tolist() == [100.0, 0.0]
    assert analysis.key_percentages.loc["VERB"].tolist() == [0.0, 100.0]
    scores = analysis.pos_scores
    # prediction: tokens 0 and 2 share cluster 0, token 1 is alone in cluster 1
    assert scores.loc["NOUN", "recall"] == 1.0 and scores.loc["VERB", "recall"] == 0.5
    assert scores.loc["NOUN", "sparsity"] == pytest.approx(1 - 4 / 6)
    with pytest.raises(ValueError, match="B=3"):
        HeadClusterAnalysis(proj, layer=0, head=0, n_clusters=3)
    with pytest.raises(ValueError, match="head must be in"):
        HeadClusterAnalysis(proj, layer=0, head=2, n_clusters=2)
    with pytest.raises(ValueError, match="no records"):
        _ = HeadClusterAnalysis(proj, layer=0, head=0, n_clusters=2).pos_scores
