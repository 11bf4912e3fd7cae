"""Head similarity: the JSD sums match scipy row by row; clustering and the map group alike
heads."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon
from synthetic_heads import synthetic_record
from tolerances import bound

from sparsefinder.analysis.atlas_similarity import (
    cluster_order,
    head_map,
    head_probs,
    jsd_row_sums,
)

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


def test_jsd_sums_equal_scipy_per_row():
    record = synthetic_record(12, layers=2)
    sums = jsd_row_sums(record).numpy()
    probs = head_probs(record).numpy()
    count, n = probs.shape[:2]
    expected = np.zeros((count, count))
    for a in range(count):
        for b in range(count):
            expected[a, b] = sum(jensenshannon(probs[a, i], probs[b, i], base=2) ** 2
                                 for i in range(n))
    np.testing.assert_allclose(sums, expected, atol=1e-9)
    # layer 1 repeats layer 0: every head is at distance 0 from its copy
    heads = count // 2
    assert np.allclose(np.diag(sums[:heads, heads:]), 0.0, atol=1e-12)
    # each row's JSD² ≤ 1 (base 2), summed over n rows of float32 probabilities
    assert (sums >= 0).all() and (sums <= n * (1 + bound(1.0, terms=2 * n))).all()


def test_clustering_and_map_put_alike_heads_together():
    # two groups of three heads: small distances inside a group, large across
    groups = np.array([0, 0, 0, 1, 1, 1])
    distance = np.where(groups[:, None] == groups[None, :], 0.05, 0.9)
    np.fill_diagonal(distance, 0.0)
    order = cluster_order(distance)
    assert sorted(order) == list(range(6))
    assert {tuple(sorted(order[:3])), tuple(sorted(order[3:]))} == {(0, 1, 2), (3, 4, 5)}
    coords = head_map(distance)
    assert coords.shape == (6, 2)
    inside = np.linalg.norm(coords[0] - coords[1])
    across = np.linalg.norm(coords[0] - coords[3])
    assert inside < across / 3


@pytest.mark.parametrize("size", [1, 2])
def test_tiny_head_sets_need_no_clustering(size):
    distance = np.zeros((size, size))
    assert cluster_order(distance) == list(range(size))
    assert head_map(distance).shape == (size, 2)
