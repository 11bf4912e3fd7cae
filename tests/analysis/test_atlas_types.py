"""Pattern types: synthetic heads built to be each type are named that type."""

from __future__ import annotations

import pytest
from synthetic_heads import HALF_LOCAL, KINDS, synthetic_record

from sparsefinder.analysis.atlas import compute_atlas
from sparsefinder.analysis.atlas_stats import HeadSums
from sparsefinder.analysis.atlas_types import (
    CONTIGUOUS,
    LOCAL_DISTANCE,
    PATTERN_LABELS,
    PATTERN_TYPES,
    pattern_types,
)
from sparsefinder.metrics.scorer import Scorer


def _means(records):
    sums = HeadSums.zeros(records[0].num_layers, records[0].num_heads)
    for record in records:
        sums.add_record(record, Scorer(record, extra=False).gold_sparsity)
    return sums.means()


@pytest.mark.parametrize("n", [12, 16, 40])
def test_each_synthetic_head_gets_its_type(n):
    means = _means([synthetic_record(n, seed=s) for s in range(3)])
    assert pattern_types(means) == [list(KINDS)]


@pytest.mark.parametrize("n", [16, 40])
def test_local_needs_both_a_short_distance_and_contiguous_rows(n):
    """A head whose mass stays near the query but in scattered keys (i ± 2), and one whose
    rows keep one contiguous run of keys far away (6-8 tokens), each meet one of local's two
    conditions: neither is local (both are mixed: sparse, no dominant position)."""
    means = _means([synthetic_record(n, kinds=HALF_LOCAL, seed=s) for s in range(3)])
    near, far = 0, 1
    assert means["distance"][0, near] <= LOCAL_DISTANCE < means["distance"][0, far]
    assert means["contiguous"][0, near] < CONTIGUOUS <= means["contiguous"][0, far]
    assert pattern_types(means) == [["mixed", "mixed"]]


def test_softmax_layers_are_dense_not_misclassified():
    means = _means([synthetic_record(16, layers=2)])
    assert pattern_types(means, dense_layers=[True, False]) == [["dense"] * len(KINDS),
                                                               list(KINDS)]


def test_a_head_that_never_drops_a_key_is_dense():
    record = synthetic_record(16, kinds=("diagonal",))
    graph = record.layers[0]
    probs = graph.probs() + 1e-3
    probs /= probs.sum(-1, keepdim=True)
    graph.gold, graph.prob_values = probs > 0, probs.reshape(-1)
    assert pattern_types(_means([record])) == [["dense"]]


def test_every_type_has_a_label():
    assert set(PATTERN_LABELS) == set(PATTERN_TYPES)


def test_compute_atlas_names_types_and_marks_alpha_one_dense():
    records = [synthetic_record(16, layers=2, seed=s) for s in range(4)]
    atlas = compute_atlas(lambda: records)
    assert atlas.heads["type"].tolist() == list(KINDS) * 2
    dense = compute_atlas(lambda: records, alpha=1.0)
    assert set(dense.heads["type"]) == {"dense"}
