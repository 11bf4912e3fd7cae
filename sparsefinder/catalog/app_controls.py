"""How the app shows the declared parameters of the families whose sliders it shapes (the
rest get plain generated sliders): which view-state field holds each value, the slider's
words, and the text-dependent range and first-value hooks it names."""

from __future__ import annotations

from sparsefinder.methods.grids import Control
from sparsefinder.predictors.hash_codes import HASH_BITS

#: How the app shows the paper's families and the learned baselines: each value in a view
#: state field of its own (their keys are in every link), ranges and first values that
#: depend on the text (hooks named here, defined in ``sparsefinder.explore.text_ranges``).
QUEST_PAGE_SIZE = 16
APP_CONTROLS: dict[str, dict[str, Control]] = {
    "distance": {"threshold": Control(
        "t", "t (distance threshold)",
        "Edge iff ‖q′−k′‖ ≤ t in the learned projection space (§4.3).",
        range="distance_quantiles", default="gold_threshold")},
    "quantization": {"bins": Control(
        "bins", "β (bins per dimension)",
        "Each projected dimension cut into β equal-population bins (§4.4).",
        default="gold_bins")},
    "kmeans": {
        "n_clusters": Control("clusters", "B (clusters)",
                              "Number of k-means centroids learned offline per head (§4.5).",
                              range="centroid_counts"),
        "top_k": Control("top_k", "k (nearest centroids)",
                         "Queries and keys join their k nearest centroids; larger k, more "
                         "edges.", range="at_most_clusters")},
    "quest": {"pages": Control(
        "pages", f"Quest pages (of {QUEST_PAGE_SIZE} keys) per query",
        "Keys in pages; each query keeps the pages with the highest upper bound "
        "Σ_d max(q_d·min_d, q_d·max_d) of its score (Quest, training-free).",
        default="gold_pages")},
    "hashattention": {"max_distance": Control(
        "hamming", f"Hamming distance (of {HASH_BITS}-bit codes)",
        "Each query keeps the keys whose learned binary code differs from its own in at most "
        "this many bits (HashAttention-style codes, learned on TRAIN gold graphs; bundled for "
        "the default model).")},
}
