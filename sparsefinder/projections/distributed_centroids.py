"""K-means centroids from EVERY rank's records: the sample one process would draw, fitted once.

:func:`sparsefinder.projections.centroids.fit_centroids` clusters, per layer and head, the projected
queries then keys of all records (in their order), subsampled to ``max_points`` points by
:func:`~sparsefinder.predictors.kmeans.head_samples`. That sample depends only on the total
point count and the seed, so the ranks can draw it without pooling the data:

1. every rank shares its records' places in the one-process order and their token counts
   (a few integers per record), so every rank knows where each record's points sit in the
   concatenated ``[queries of all records, keys of all records]`` axis;
2. every rank draws the same sample indices, keeps the points of its own records among
   them, and the ranks all-gather those (``max_points × r`` floats per head: megabytes, not
   the corpus);
3. the (layer, B) fits are dealt round-robin to the ranks and gathered.

The points fed to scikit-learn are the ones, in the order, one process would feed it, so the
centroids equal ``fit_centroids`` on all records in one process (same inputs, same seed; the
only possible difference is scikit-learn's thread count, which orders float sums).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sparsefinder import distributed
from sparsefinder.data.records import AttentionRecord
from sparsefinder.predictors.kmeans import KMeans, fit_head_centroids, head_samples
from sparsefinder.projections.heads import HeadProjections


def _global_offsets(records: Sequence[AttentionRecord], positions: Sequence[int]
                    ) -> tuple[np.ndarray, np.ndarray, int]:
    """This rank's records' first query/key point index in the pooled axis, and its length."""
    mine = [(int(p), r.layers[0].queries.shape[1], r.layers[0].keys.shape[1])
            for p, r in zip(positions, records, strict=True)]
    everyone = sorted(row for part in distributed.gather_objects(mine) for row in part)
    if len({p for p, _, _ in everyone}) != len(everyone):
        raise ValueError("two records share a position; pass each record's place in the "
                         "corpus (e.g. ShardedRecords.iter_indexed)")
    n_q = np.array([q for _, q, _ in everyone])
    n_k = np.array([k for _, _, k in everyone])
    q_start = np.concatenate([[0], np.cumsum(n_q)[:-1]])
    k_start = int(n_q.sum()) + np.concatenate([[0], np.cumsum(n_k)[:-1]])
    where = {p: i for i, (p, _, _) in enumerate(everyone)}
    rows = [where[int(p)] for p in positions]
    return q_start[rows], k_start[rows], int(n_q.sum() + n_k.sum())


def fit_centroids_sharded(
    projections: HeadProjections,
    records: Sequence[AttentionRecord],
    positions: Sequence[int],
    clusters: Sequence[int] = (2, 4, 6, 8, 10, 12, 16, 20),
    *,
    max_points: int | None = 10_000,
    n_init: int = 10,
    seed: int = 0,
) -> HeadProjections:
    """``fit_centroids`` over the records of all ranks; every rank gets the same centroids.

    ``records`` are this rank's, ``positions[i]`` the place of ``records[i]`` in the
    one-process order (e.g. its corpus index). Every rank must call this (a rank may hold no
    record). Stores the centroids in ``projections.centroids`` and returns the object.
    """
    if projections.kind == "augmented":
        raise ValueError("k-means centroids are not fitted on augmented (low-rank) "
                         "projections; fit them on shared projections (objective 'paper')")
    clusters = sorted({int(b) for b in clusters})
    if not clusters or clusters[0] < 1:
        raise ValueError(f"clusters must be integers >= 1, got {clusters!r}")
    for record in records:
        projections.check_record(record)
    q_start, k_start, n_points = _global_offsets(records, positions)
    if n_points < clusters[-1]:
        raise ValueError(f"{n_points} points per head but B={clusters[-1]} clusters; pass "
                         "more records or fewer clusters")
    heads = projections.num_heads
    samples = head_samples(n_points, heads, max_points, seed)
    world = distributed.current_world()
    jobs = [(layer, b) for layer in range(projections.num_layers) for b in clusters]
    points = [_layer_sample(projections, records, layer, q_start, k_start, samples)
              for layer in range(projections.num_layers)]
    fitted = {}
    for layer, b in jobs[world.rank::world.size]:  # fits dealt round-robin to the ranks
        centroids, _ = fit_head_centroids(points[layer], b, n_init=n_init,
                                          max_iter=KMeans().max_iter, random_state=seed,
                                          max_points=None)  # already the sample
        fitted[(layer, b)] = centroids
    pooled = {key: value for part in distributed.gather_objects(fitted) for key, value in
              part.items()}
    projections.centroids = {
        b: torch.stack([pooled[(layer, b)] for layer in range(projections.num_layers)])
        for b in clusters}
    projections.metadata.update(
        {"kmeans_max_points": max_points, "kmeans_n_init": n_init, "kmeans_seed": seed,
         "clusters": clusters, "kmeans_ranks": world.size})
    return projections


def _layer_sample(projections: HeadProjections, records: Sequence[AttentionRecord],
                  layer: int, q_start: np.ndarray, k_start: np.ndarray,
                  samples: list[np.ndarray | None]) -> np.ndarray:
    """(heads, m, r) float32: the sampled points of ``layer``, pooled from every rank."""
    heads, parts, index = projections.num_heads, [], []
    for record, qs, ks in zip(records, q_start, k_start, strict=True):
        graph = record.layers[layer]
        for x, start in ((projections.project_queries(layer, graph.queries), qs),
                         (projections.project_keys(layer, graph.keys), ks)):
            parts.append(x.detach().to("cpu", torch.float32).numpy())
            index.append(np.arange(start, start + x.shape[1]))
    local = (np.concatenate(parts, 1) if parts
             else np.zeros((heads, 0, projections.dim), np.float32))
    local_index = np.concatenate(index) if index else np.zeros(0, np.int64)
    mine = []
    for head, sample in enumerate(samples):
        keep = np.ones(local_index.shape, bool) if sample is None else np.isin(local_index,
                                                                                sample)
        mine.append((local_index[keep], local[head, keep]))
    gathered = distributed.gather_objects(mine)
    out = []
    for head in range(heads):
        index = np.concatenate([part[head][0] for part in gathered])
        values = np.concatenate([part[head][1] for part in gathered])
        out.append(values[np.argsort(index, kind="stable")])
    return np.stack(out)
