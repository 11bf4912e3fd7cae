"""View-models of the Clusters page: a head's k-means cluster ids, one cluster's edges, and
the cluster picked by a click on the POS × cluster chart."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from sparsefinder.analysis.clusters import cluster_edges, head_assignments
from sparsefinder.explore.prepared import PreparedText


def head_cluster_ids(prepared: PreparedText, layer: int, head: int, clusters: int,
                     top_k: int) -> tuple[Tensor, Tensor]:
    """Nearest-first k-means cluster ids ``(query (n, top_k), key (m, top_k))`` of one head
    of the prepared text (its cached projected vectors and the B = ``clusters`` centroids)."""
    if not prepared.has_projections or int(clusters) not in prepared.cluster_choices:
        raise ValueError(f"no projections with B={clusters} centroids for this text")
    q, k = prepared.vectors.projected(layer)
    centroids = prepared.projections.centroids[int(clusters)][layer]
    return head_assignments(q, k, centroids, head, int(top_k))


def cluster_masks(query_ids: Tensor, key_ids: Tensor, cluster: int,
                  gold: Tensor) -> tuple[Tensor, Tensor]:
    """One cluster's view of a head: ``(gold edges of the cluster's queries, the cluster's
    predicted edges)``, both bool (n, m).

    The predicted edges are the pairs whose query and key both join ``cluster``; the gold
    edges are every gold edge of a query row in the cluster (so missed ones show as FN).
    """
    q = query_ids if query_ids.dim() == 2 else query_ids[:, None]
    rows = (q == cluster).any(-1)
    return gold & rows[:, None], cluster_edges(query_ids, key_ids, cluster)


def default_cluster(query_ids: Tensor, key_ids: Tensor, clusters: int) -> int:
    """The cluster a head's view opens on: the one that predicts the most edges (queries ×
    keys that join it; ties: the lowest number), else the one with the most keys, else 0 —
    never an empty one when the head has a choice, and not a cluster of one query when a
    populated one shows what the head groups."""
    def counts(ids: Tensor) -> Tensor:
        flat = ids.reshape(-1).long()
        flat = flat[(flat >= 0) & (flat < int(clusters))]
        return torch.bincount(flat, minlength=int(clusters))

    keys = counts(key_ids)
    edges = counts(query_ids) * keys
    for weight in (edges, keys):
        if weight.numel() and int(weight.max()) > 0:
            return int(torch.argmax(weight))  # the first of the largest
    return 0


def cluster_from_point(point: Mapping[str, Any], clusters: Sequence[Any]) -> int | None:
    """The cluster of a clicked bar segment of the POS × cluster chart (one trace a cluster):
    its ``legendgroup`` (the cluster id), else its ``curve_number`` into ``clusters`` (the
    traces' order); None when the point names neither."""
    group = point.get("legendgroup")
    if group not in (None, ""):
        try:
            return int(group)
        except (TypeError, ValueError):
            pass
    curve = point.get("curve_number")
    if isinstance(curve, int) and 0 <= curve < len(clusters):
        return int(clusters[curve])
    return None


def cluster_highlight(prepared: PreparedText, layer: int, head: int, clusters: int,
                      top_k: int, cluster: int) -> tuple[Tensor, Tensor]:
    """What the Explorer outlines for one k-means cluster of a head: ``(query rows in the
    cluster (n,), the cluster's edges (n, m))``, both bool — the edges are the pairs whose
    query and key both join ``cluster`` (see :func:`cluster_masks`)."""
    q_ids, k_ids = head_cluster_ids(prepared, layer, head, clusters, top_k)
    q = q_ids if q_ids.dim() == 2 else q_ids[:, None]
    return (q == cluster).any(-1), cluster_edges(q_ids, k_ids, cluster)
