"""sparsefinder.explore: the Clusters page view-model (no Streamlit)."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.explore import clusters as exclusters


def test_head_cluster_ids_and_cluster_masks(prepared):
    from sparsefinder.analysis.clusters import head_prediction

    q_ids, k_ids = exclusters.head_cluster_ids(prepared, 1, 3, 4, 2)
    n = prepared.n_tokens
    assert q_ids.shape == (n, 2) and k_ids.shape == (n, 2)
    gold = prepared.record.layers[1].gold[3]
    union = torch.zeros(n, n, dtype=torch.bool)
    for cluster in range(4):
        gold_c, pred_c = exclusters.cluster_masks(q_ids, k_ids, cluster, gold)
        assert not (gold_c & ~gold).any()
        union |= pred_c
    q, k = prepared.vectors.projected(1)
    centroids = prepared.projections.centroids[4][1]
    expected = head_prediction(q, k, centroids, 3, 2, prepared.record.causal)
    assert torch.equal(union, expected)  # the clusters' edges make up the k-means graph
    with pytest.raises(ValueError, match="B=5"):
        exclusters.head_cluster_ids(prepared, 0, 0, 5, 1)


def test_cluster_highlight_is_the_clusters_edges(prepared):
    q_ids, k_ids = exclusters.head_cluster_ids(prepared, 1, 3, 4, 2)
    gold = prepared.record.layers[1].gold[3]
    for cluster in range(4):
        rows, edges = exclusters.cluster_highlight(prepared, 1, 3, 4, 2, cluster)
        gold_c, pred_c = exclusters.cluster_masks(q_ids, k_ids, cluster, gold)
        assert torch.equal(edges, pred_c)
        assert rows.shape == (prepared.record.n_tokens,) and rows.dtype == torch.bool
        assert torch.equal(rows, (q_ids == cluster).any(-1))
        assert not (edges & ~rows[:, None]).any()  # every edge starts at a cluster query


def test_default_cluster_has_keys_and_queries_when_one_can():
    q = torch.tensor([[0], [0], [2]])
    assert exclusters.default_cluster(q, torch.tensor([[1], [2], [2]]), 4) == 2  # 0: no keys
    assert exclusters.default_cluster(q, torch.tensor([[1], [3], [3]]), 4) == 3  # keys only
    assert exclusters.default_cluster(q, torch.tensor([[3, 0], [1, 3]]), 4) == 0  # top-k ids
    assert exclusters.default_cluster(q, torch.zeros(0, 1, dtype=torch.long), 4) == 0


def test_default_cluster_is_the_most_populated_not_the_first():
    # cluster 0: one query and one key (1 edge); cluster 2: three queries, two keys (6 edges)
    q = torch.tensor([[0], [2], [2], [2], [1]])
    k = torch.tensor([[0], [2], [2], [3], [3]])
    assert exclusters.default_cluster(q, k, 4) == 2
    # a tie in edges goes to the lower number
    assert exclusters.default_cluster(torch.tensor([[0], [1]]), torch.tensor([[1], [0]]), 2) == 0


def test_default_cluster_of_a_head_predicts_edges(prepared):
    for layer, head in ((0, 0), (1, 3), (prepared.num_layers - 1, prepared.num_heads - 1)):
        q_ids, k_ids = exclusters.head_cluster_ids(prepared, layer, head, 8, 1)
        chosen = exclusters.default_cluster(q_ids, k_ids, 8)
        assert (k_ids == chosen).any()  # never a cluster without keys
        if set(q_ids.flatten().tolist()) & set(k_ids.flatten().tolist()):
            _, edges = exclusters.cluster_highlight(prepared, layer, head, 8, 1, chosen)
            assert edges.any()
