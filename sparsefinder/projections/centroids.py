"""K-means centroids of projected queries and keys per head (paper §4.5), stored with the
projections for every number of clusters B.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from sparsefinder.data.records import AttentionRecord
from sparsefinder.predictors.kmeans import KMeans
from sparsefinder.projections.heads import HeadProjections


def fit_centroids(
    projections: HeadProjections,
    records: Sequence[AttentionRecord],
    clusters: Sequence[int] = (2, 4, 6, 8, 10, 12, 16, 20),
    *,
    max_points: int | None = 10_000,
    n_init: int = 10,
    seed: int = 0,
    progress: bool = False,
) -> HeadProjections:
    """Fit k-means centroids (per layer, head and B) on projected training queries+keys.

    Uses the predictors' :class:`KMeans` (scikit-learn k-means++, ``n_init`` restarts; each
    head subsampled to ``max_points`` points). Stores them in ``projections.centroids`` and
    returns the same object. Augmented projections are refused: their queries and keys sit in
    different coordinates, so clusters separate queries from keys (measured: k-means recall
    ≈ 0 on the low-rank files).
    """
    if projections.kind == "augmented":
        raise ValueError(
            "k-means centroids are not fitted on augmented (low-rank) projections: queries and "
            "keys sit in different coordinates, so clusters would separate them; fit them on "
            "shared projections (objective 'paper' or 'logistic')"
        )
    if not records:
        raise ValueError("fit_centroids needs at least one record")
    clusters = sorted({int(b) for b in clusters})
    if not clusters or clusters[0] < 1:
        raise ValueError(f"clusters must be integers >= 1, got {clusters!r}")
    for record in records:
        projections.check_record(record)
    per_b: dict[int, list[Tensor]] = {b: [] for b in clusters}
    bar = tqdm(total=projections.num_layers * len(clusters), desc="k-means", unit="fit",
               disable=not progress)
    for layer in range(projections.num_layers):
        q = torch.cat([projections.project_queries(layer, r.layers[layer].queries)
                       for r in records], 1)
        k = torch.cat([projections.project_keys(layer, r.layers[layer].keys) for r in records], 1)
        for b in clusters:
            km = KMeans(n_clusters=b, random_state=seed, n_init=n_init, max_points=max_points)
            per_b[b].append(km.fit(q, k).centroids_.float())
            bar.update(1)
    bar.close()
    projections.centroids = {b: torch.stack(c) for b, c in per_b.items()}
    projections.metadata.update(
        {"kmeans_max_points": max_points, "kmeans_n_init": n_init, "kmeans_seed": seed,
         "clusters": clusters}
    )
    return projections
