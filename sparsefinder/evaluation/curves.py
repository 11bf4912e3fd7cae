"""Sweep curves: named hyperparameter grids over the registered families (paper §5–6).

A *curve* (:data:`CURVES`) is a grid over one predictor family of the method registry
(:mod:`sparsefinder.methods.spec`): a list of :class:`~sparsefinder.methods.spec.PredictorSpec`,
e.g.
``distance`` (the thresholds) or ``distance+window`` (the same ∪ a window of 3). New families
are registered in :mod:`sparsefinder.catalog`, new grids with :func:`register_curve`.

Grids (paper §5 and appendix C–D):

- ``distance``: threshold t ∈ {0.25, 0.5, 0.75, …, 5.0}: the paper's {0.5, 1.0, …, 5.0} plus
  the midpoints. With margin ω = 1 the learned scale puts sparsities 0.75–0.95 between
  t ≈ 1 and 2, where the paper grid has only two points; the midpoints add resolution there
  (they are not chosen by looking at results).
- ``kmeans``: B ∈ {2, 4, 6, 8, 10, 12, 16, 20} clusters, top_k = 1; ``kmeans-top2``: the same
  B ≥ 4 with top_k = 2 (denser, higher recall).
- ``quantization``: the paper counts B = r·β buckets with B ∈ {2, …, 20}; with r = 4 only
  β ∈ {1, 2, 3, 4, 5} (B = 4 … 20) are whole numbers. Those five only reach a sparsity of about
  (1 − 1/5)⁴ ≈ 0.6, so the grid continues with β ∈ {6, 8, 10, 12, 16, 24, 32} to cover the
  sparsity range where methods are compared.
- ``window``: w ∈ {0, 1, 3, 5, 7, 9, 11, 15, 19, 23, 27} (MT grid) followed by
  {31, 41, 51, 75, 101, 125, 151, 175, 201, 251} (512-token MLM grid). Both are always swept:
  texts of the default corpus range from ~40 to 512 tokens.
Baselines (paper §5 and appendix C; each random one seeded with ``seed = layer``):

- ``longformer``: window ``WITH_WINDOW_SIZE`` + n_global ∈ {4, 8, 12, 16, 20} random global
  tokens; ``bigbird``: window + first/last tokens + n_random ∈ {2, 4, 6, 8, 10} random keys
  per query. Both only read shapes.
- ``reformer``: n_buckets ∈ {2, 4, …, 12} (one hashing round); ``routing``: n_clusters ∈
  {2, 4, 6, 8, 10} (spherical k-means on each text's projections). Both read the projections
  and have a ``+window`` variant.
- ``topk``: k ∈ {1, 2, 4, 8, 16, 32} keys per query of the *full* score matrix QKᵀ over the
  ORIGINAL queries and keys: an oracle that saves no work, not a practical predictor.
- ``sparsebert-dams`` / ``sparsebert-damu``: SparseBERT's static structured (per offset) /
  unstructured (per position pair) mask with target sparsity ∈ {0.5, 0.7, 0.8, 0.9, 0.95,
  0.98}, fitted per layer on gold graphs of TRAINING texts (``sweep(train_records=...)``;
  skipped with a warning without them). Each mask is fitted once per layer and re-targeted
  per grid point.
- ``distance-nodiag``: SparseBERT's no-diagonal variant of ``distance`` (same grid).
- ``quest`` (group ``long-context``): Quest's page-level min/max key bounds, pages of 16 keys,
  each query keeps its top {1, 2, 4, 8, 16, 32, 64} pages (on the original q/k, training-free);
  ``hashattention``: HashAttention-style 16-bit learned codes of q/k (fitted on TRAINING gold
  graphs), keys within Hamming distance {0, …, 8}.

- ``<method>+window``: the method ∪ ``Window(WITH_WINDOW_SIZE)``. The paper uses w = 11 (MT,
  ~35 tokens) or 25 (MLM, 512 tokens) in its per-head figures and w = 3 in its efficiency
  study; we use 3: it adds the diagonal and one neighbour each side, which recovers the
  local edges a 4-dimensional projection cannot place close, at a sparsity cost of only
  ~3/n.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sparsefinder.calibration.curves import DISTANCE_FINE_GRID, calibrated_grids
from sparsefinder.methods.registry import display_name, method_id, resolve_method
from sparsefinder.methods.spec import PredictorSpec
from sparsefinder.projections.heads import HeadProjections

Params = dict[str, Any]


DISTANCE_GRID = [0.25 * i for i in range(1, 21)]


CLUSTER_GRID = [2, 4, 6, 8, 10, 12, 16, 20]


QUANTIZATION_BINS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32]


WINDOW_GRID = [0, 1, 3, 5, 7, 9, 11, 15, 19, 23, 27]


WINDOW_GRID_LONG = [31, 41, 51, 75, 101, 125, 151, 175, 201, 251]


WITH_WINDOW_SIZE = 3


LONGFORMER_GRID = [4, 8, 12, 16, 20]


BIGBIRD_GRID = [2, 4, 6, 8, 10]


REFORMER_GRID = [2, 4, 6, 8, 10, 12]


ROUTING_GRID = [2, 4, 6, 8, 10]


TOPK_GRID = [1, 2, 4, 8, 16, 32]


STATIC_MASK_GRID = [0.5, 0.7, 0.8, 0.9, 0.95, 0.98]


QUEST_PAGE = 16


QUEST_GRID = [1, 2, 4, 8, 16, 32, 64]


HASH_DISTANCE_GRID = [0, 1, 2, 3, 4, 5, 6, 7, 8]


@dataclass(frozen=True)
class Curve:
    """A named grid of specs over one method (all share the method, so its inputs/fit)."""

    name: str
    specs: tuple[PredictorSpec, ...]

    @property
    def method(self) -> str:
        """The family with its calibration, e.g. ``distance`` or ``distance:budget``."""
        return self.specs[0].method_id

    @property
    def needs_projections(self) -> bool:
        return self.specs[0].needs_projections

    @property
    def needs_training(self) -> bool:
        return self.specs[0].needs_training


#: Sweepable curves by name (``<method>`` and ``<method>+window`` variants, baselines…).
CURVES: dict[str, Curve] = {}


#: Named groups for ``--methods``; "all" is every registered curve.
GROUPS: dict[str, list[str]] = {
    "sparsefinder": [
        "distance", "kmeans", "quantization",
        "distance+window", "kmeans+window", "quantization+window", "window",
    ],
    "baselines": [
        "longformer", "bigbird", "reformer", "reformer+window", "routing", "routing+window",
        "topk", "sparsebert-dams", "sparsebert-damu", "distance-nodiag",
    ],
    "long-context": ["quest", "hashattention", "block-keys"],
    # each family with its parameters set per head from a target, fitted on TRAIN graphs
    "calibrated": list(calibrated_grids()),
}


def register_curve(name: str, method: str, grid: Iterable[Params], *, window: int = 0,
                   replace: bool = False) -> Curve:
    """Add a sweep curve: ``method`` (a :data:`sparsefinder.methods.spec.METHODS` key) over
    ``grid``,
    each point united with ``Window(window)`` when ``window`` > 0; returns it."""
    if not name or "," in name:
        raise ValueError(f"curve name must be non-empty without commas, got {name!r}")
    if name in CURVES and not replace:
        raise ValueError(f"curve {name!r} is already registered; pass replace=True")
    specs = tuple(PredictorSpec.of(method, p, window=window) for p in grid)
    if not specs:
        raise ValueError(f"curve {name!r} needs at least one parameter dict in its grid")
    CURVES[name] = Curve(name, specs)
    return CURVES[name]


ROUTED_BUDGET_GRID = [
    {"n_clusters": b, "budget": f} for b in (64, 128)
    for f in (0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.12, 0.15, 0.2, 0.25, 0.3)
]


ROUTED_TOP_GRID = [{"n_clusters": 128, "n_routes": t}
                   for t in (2, 4, 6, 8, 9, 10, 11, 12, 14, 16, 20, 24, 32)]


#: Block Sparsefinder curves: (name, block size, single keys per query block), and the grid
#: of key blocks per query block (besides the diagonal block); 512 tokens = 16 blocks of 32.
BLOCK_CURVES = (("block", 32, 0), ("block16", 16, 0), ("block+keys", 32, 16))


BLOCK_GRID = [0, 1, 2, 3, 4, 5, 6, 8, 10, 12]
#: Single keys per 32-token query block of the block-key selector (sub-blocks of 8 queries).
BLOCK_KEYS_GRID = [0, 2, 4, 8, 16, 32, 64, 128]


#: Block Sparsefinder with projections learned on pooled blocks (paper §6): (name, block);
#: the block size must be the one the projections were trained on (block_projections).
LEARNED_BLOCK_CURVES = (("block-learned", 32), ("block16-learned", 16))


#: Keep fractions of the raw nearest-keys family (its calibrated forms choose one per head).
ROWFRAC_GRID = [0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5]


TOPP_GRID = [0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 1.0]


def _register_defaults() -> None:
    grids: dict[str, list[Params]] = {
        "distance": [{"threshold": t} for t in DISTANCE_GRID],
        "kmeans": [{"n_clusters": b, "top_k": 1} for b in CLUSTER_GRID],
        "quantization": [{"bins": b} for b in QUANTIZATION_BINS],
    }
    for name, grid in grids.items():
        register_curve(name, name, grid, replace=True)
        register_curve(f"{name}+window", name, grid, window=WITH_WINDOW_SIZE, replace=True)
    top2 = [{"n_clusters": b, "top_k": 2} for b in CLUSTER_GRID if b >= 4]
    register_curve("kmeans-top2", "kmeans", top2, replace=True)
    register_curve("kmeans-top2+window", "kmeans", top2, window=WITH_WINDOW_SIZE, replace=True)
    register_curve("window", "window", [{"window": w} for w in WINDOW_GRID + WINDOW_GRID_LONG],
                   replace=True)
    # Baselines (see the module docstring).
    register_curve("longformer", "longformer", [{"n_global": g} for g in LONGFORMER_GRID],
                   replace=True)
    register_curve("bigbird", "bigbird", [{"n_random": r} for r in BIGBIRD_GRID], replace=True)
    for name, grid in (
        ("reformer", [{"n_buckets": b} for b in REFORMER_GRID]),
        ("routing", [{"n_clusters": c} for c in ROUTING_GRID]),
    ):
        register_curve(name, name, grid, replace=True)
        register_curve(f"{name}+window", name, grid, window=WITH_WINDOW_SIZE, replace=True)
    # An oracle: keeps each query's k best keys of the full QKᵀ on the ORIGINAL vectors.
    register_curve("topk", "topk", [{"k": k} for k in TOPK_GRID], replace=True)
    for name in ("sparsebert-dams", "sparsebert-damu"):
        register_curve(name, name, [{"target_sparsity": t} for t in STATIC_MASK_GRID],
                       replace=True)
    register_curve("distance-nodiag", "distance-nodiag",
                   [{"threshold": t} for t in DISTANCE_GRID], replace=True)
    # A finer raw grid for distance, and distance driven by a target sparsity or
    # recall with per-head thresholds fitted on TRAIN graphs (sparsefinder.calibration.curves).
    register_curve("distance-fine", "distance", [{"threshold": t} for t in DISTANCE_FINE_GRID],
                   replace=True)
    for name, grid in calibrated_grids().items():  # "distance:budget", …
        register_curve(name, name, grid, replace=True)
    register_curve("rowfrac", "rowfrac", [{"fraction": f} for f in ROWFRAC_GRID], replace=True)
    # Buckets: k-means on KEYS with queries routed by q·c, and the top-p oracle
    # (sparsefinder.predictors.routed_kmeans / topp); grids chosen on the TRAIN split.
    register_curve("kmeans-routed", "kmeans-routed", ROUTED_BUDGET_GRID, replace=True)
    register_curve("kmeans-routed-top", "kmeans-routed-top", ROUTED_TOP_GRID, replace=True)
    register_curve("topp", "topp", [{"p": p} for p in TOPP_GRID], replace=True)
    # Long-context baselines on the model's own q/k (sparsefinder.predictors.quest,
    # .hash_codes; codes fitted on TRAIN graphs).
    register_curve("quest", "quest", [{"page_size": QUEST_PAGE, "pages": p} for p in QUEST_GRID],
                   replace=True)
    register_curve("hashattention", "hashattention",
                   [{"max_distance": t} for t in HASH_DISTANCE_GRID], replace=True)
    # Block Sparsefinder, 32-token blocks, key blocks per query block.
    for name, size, keys in BLOCK_CURVES:
        register_curve(name, "block", [{"block": size, "n_blocks": b, "n_keys": keys}
                                       for b in BLOCK_GRID], replace=True)
    register_curve("block-keys", "block-keys",
                   [{"block": 32, "n_keys": k, "sub_block": 8} for k in BLOCK_KEYS_GRID],
                   replace=True)
    for name, size in LEARNED_BLOCK_CURVES:
        register_curve(name, "block-learned", [{"block": size, "n_blocks": b}
                                               for b in BLOCK_GRID], replace=True)


_register_defaults()


def curve_name(name: str) -> str:
    """A curve's name, with a curve named by an old method name (``distance-budget``) renamed
    to its family and calibration (``distance:budget``) and a FutureWarning saying so."""
    if name in CURVES:
        return name
    family, calibration = resolve_method(name)  # warns on an old name; raises on unknown
    return method_id(family, calibration)


def curve_display_name(name: str) -> str:
    """What a user reads for a curve: its method's :func:`display_name`, plus what sets the
    curve apart when it is not the method alone (``+ window 3``, or its own name, e.g.
    ``· kmeans-top2``). A name that is no curve is read as a method id, and one that is
    neither (a plug-in's curve in an old table) stays as it is."""
    curve = CURVES.get(name)
    if curve is None:
        try:
            return display_name(name)
        except ValueError:
            return name
    label = display_name(curve.method)
    window = curve.specs[0].window
    if name == curve.method:
        return label
    base = name.removesuffix("+window")
    if base != name and window:  # the same curve united with a window
        return f"{curve_display_name(base) if base in CURVES else label} + window {window}"
    return f"{label} · {name}"


def with_labels(frame: Any) -> Any:
    """A sweep table with a last column ``label``: each row's :func:`curve_display_name`
    (the columns before it stay as they were, so older readers keep working)."""
    if "method" not in frame or "label" in frame:
        return frame
    return frame.assign(label=frame["method"].map(curve_display_name))


def resolve_methods(spec: str | Sequence[str]) -> list[str]:
    """``"sparsefinder"``, ``"all"`` or a comma list (groups allowed) → curve names; an old
    method name (``distance-budget``) is read as its new one (``distance:budget``)."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for item in (s.strip() for s in items):
        if not item:
            continue
        if item != "all" and item not in GROUPS and item not in CURVES:
            with contextlib.suppress(ValueError):  # unknown: reported below with the names
                item = curve_name(item)
        expanded = list(CURVES) if item == "all" else GROUPS.get(item, [item])
        for name in expanded:
            if name not in CURVES:
                known = ", ".join(["all", *GROUPS, *CURVES])
                raise ValueError(f"unknown method {name!r}; choose from: {known}")
            if name not in names:
                names.append(name)
    if not names:
        raise ValueError("no methods given; use 'sparsefinder', 'all' or a comma list")
    return names


def available_curves(projections: HeadProjections | None,
                     names: Sequence[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """Curves that can run with these projections, and why the others cannot.

    A curve is skipped when it needs projections and there are none, when it is learned from
    training graphs (the app has none at hand), or when a grid point cannot be built (e.g.
    k-means centroids for a B the file does not hold).
    """
    available: list[str] = []
    skipped: dict[str, str] = {}
    for name in names if names is not None else CURVES:
        curve = CURVES[name]
        if curve.needs_projections and projections is None:
            skipped[name] = "needs learned projections"
            continue
        if curve.needs_training:
            skipped[name] = "learned from training graphs (sparsefinder sweep --train-passages)"
            continue
        try:
            for spec in curve.specs:
                spec.build(projections, 0)
        except (ValueError, KeyError, RuntimeError) as error:
            skipped[name] = str(error).split(";")[0]
            continue
        available.append(name)
    return available, skipped


def curve_spec(name: str, params: Params) -> PredictorSpec:
    """The spec of curve ``name`` at ``params`` (a sweep row → the setting it stands for)."""
    curve = CURVES[curve_name(name)]
    first = curve.specs[0]
    return PredictorSpec.of(first.method, params, window=first.window,
                            global_tokens=first.global_tokens, calibration=first.calibration)
