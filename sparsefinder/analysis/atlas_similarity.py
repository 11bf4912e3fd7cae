"""Which heads look alike: mean Jensen–Shannon divergence between heads on the same rows.

For two heads a, b of a model and one row (query) of a text, JSD(a, b) compares their
attention distributions over the keys; the atlas distance is its mean over every row of the
corpus, in bits (so it lies in [0, 1]). As a sum of per-row values and a row count it reduces
exactly across shards. Clustering (scipy's average-linkage hierarchy, optimal leaf order)
gives the heatmap's order and metric MDS (scikit-learn, on the precomputed distances) a 2-D
map where similar heads sit together.

Per row, with entropies H (nats) and S = p_a + p_b:
``JSD = −(H_a + H_b)/2 − ½ Σ_j S_j log(S_j / 2)`` (the only pairwise term is the last).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from sparsefinder.data.records import AttentionRecord


def head_probs(record: AttentionRecord) -> Tensor:
    """float64 (layers·heads, n, m): every head's dense probabilities, layer-major."""
    return torch.cat([graph.probs().double() for graph in record.layers])


@torch.inference_mode()
def jsd_row_sums(record: AttentionRecord) -> Tensor:
    """float64 (L·H, L·H): Σ over the record's rows of JSD (bits) between every two heads."""
    probs = head_probs(record)
    count = probs.shape[0]
    neg_entropy = torch.special.xlogy(probs, probs).sum(-1)  # (count, n) = −H
    out = torch.zeros(count, count, dtype=torch.float64)
    for a in range(count):  # a loop over heads (72 for 6×12), never over rows
        pair = probs[a:] + probs[a]  # (count − a, n, m)
        pairwise = torch.special.xlogy(pair, 0.5 * pair).sum(-1)  # Σ S log(S/2) per row
        jsd = 0.5 * (neg_entropy[a:] + neg_entropy[a]) - 0.5 * pairwise
        sums = jsd.clamp(min=0).sum(-1) / math.log(2)
        out[a, a:] = sums
        out[a:, a] = sums
    out.fill_diagonal_(0.0)
    return out


def cluster_order(distance: np.ndarray) -> list[int]:
    """Leaf order of an average-linkage hierarchical clustering (optimal ordering), so the
    heatmap shows similar heads next to each other."""
    from scipy.cluster.hierarchy import leaves_list, linkage
    from scipy.spatial.distance import squareform

    if distance.shape[0] < 3:
        return list(range(distance.shape[0]))
    condensed = squareform(_symmetric(distance), checks=False)
    return [int(i) for i in leaves_list(linkage(condensed, "average", optimal_ordering=True))]


def head_map(distance: np.ndarray, seed: int = 0) -> np.ndarray:
    """(heads, 2) coordinates from metric MDS on the precomputed distances."""
    from sklearn.manifold import MDS

    if distance.shape[0] < 3:
        return np.column_stack([np.arange(distance.shape[0], dtype=float),
                                np.zeros(distance.shape[0])])
    mds = MDS(n_components=2, metric="precomputed", random_state=seed, n_init=4,
              init="random", max_iter=300)
    return mds.fit_transform(_symmetric(distance))


def _symmetric(distance: np.ndarray) -> np.ndarray:
    out = 0.5 * (distance + distance.T)
    np.fill_diagonal(out, 0.0)
    return np.clip(out, 0.0, None)
