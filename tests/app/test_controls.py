"""The method sliders through AppTest: every family's come from its declared parameters, and
the paper's families keep the words, ranges and link fields their hand-made sliders had."""

from __future__ import annotations

import pytest
from apptest_helpers import assert_clean, new_app

#: (widget kind, key, label, help, min, max, step, format, options) of each family's sliders
#: as the hand-made controls drew them on the short example with the test's projections
#: (centroids for B = 2, 4, 8; t's end is this text's distance quantile, 10)
SLIDERS = {
    "distance": [("slider", "w_t", "t (distance threshold)",
                  "Edge iff ‖q′−k′‖ ≤ t in the learned projection space (§4.3).",
                  0.0, 10.0, 0.05, "%.3f", [])],
    "quantization": [("slider", "w_bins", "β (bins per dimension)",
                      "Each projected dimension cut into β equal-population bins (§4.4).",
                      1.0, 16.0, 1.0, "%d", [])],
    "kmeans": [("slider", "w_top_k", "k (nearest centroids)",
                "Queries and keys join their k nearest centroids; larger k, more edges.",
                1.0, 8.0, 1.0, "%d", []),
               ("select_slider", "w_clusters", "B (clusters)",
                "Number of k-means centroids learned offline per head (§4.5).",
                0.0, 2.0, 1.0, "%s", ["2", "4", "8"])],
    "quest": [("slider", "w_pages", "Quest pages (of 16 keys) per query",
               "Keys in pages; each query keeps the pages with the highest upper bound "
               "Σ_d max(q_d·min_d, q_d·max_d) of its score (Quest, training-free).",
               0.0, 64.0, 1.0, "%d", [])],
    "hashattention": [("slider", "w_hamming", "Hamming distance (of 16-bit codes)",
                       "Each query keeps the keys whose learned binary code differs from its "
                       "own in at most this many bits (HashAttention-style codes, learned on "
                       "TRAIN gold graphs; bundled for the default model).",
                       0.0, 16.0, 1.0, "%d", [])],
}


def _sliders(at) -> list[tuple]:
    return [(kind, w.key, w.label, w.help, w.proto.min, w.proto.max, w.proto.step,
             w.proto.format, list(w.proto.options))
            for kind in ("slider", "select_slider") for w in getattr(at, kind)
            if w.key not in ("w_token_range", "w_window")]


@pytest.mark.parametrize("family", sorted(SLIDERS))
def test_the_papers_families_keep_their_sliders(with_projections, family):
    at = new_app(method=family, calibration="none").run()
    assert_clean(at)
    assert _sliders(at) == SLIDERS[family]


def test_k_of_one_cluster_has_no_slider_and_k_follows_b(with_projections):
    """k's range is the text's: up to B (k = B keeps every pair), none when B leaves one."""
    at = new_app(method="kmeans", calibration="none", B="4", k="8").run()
    assert_clean(at)
    assert at.slider(key="w_top_k").max == 4 and at.query_params["k"] == "4"
    at.select_slider(key="w_clusters").set_value(2).run()
    assert_clean(at)
    assert at.slider(key="w_top_k").max == 2
