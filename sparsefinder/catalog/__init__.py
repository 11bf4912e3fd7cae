"""Every built-in predictor family, registered in one place with its parameters declared once.

Adding a method is one predictor module plus one entry here. The registry
(:mod:`sparsefinder.methods.registry`) imports this module by name the first time its table is
read; nothing in the package imports it directly, so the catalog may depend on every family's
fitting code (calibration, codebooks, hash codes, block projections) without a cycle.

A builder that cannot build here — the projections lack this k-means size, the bundled
codebooks are for another model — raises :class:`~sparsefinder.methods.registry.MethodUnavailable`
with the reason; sweeps skip that point and record the reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sparsefinder.calibration.curves import (
    DEFAULT_FLOOR,
    FLOOR_FORM,
    CalibratedCurve,
    calibrated_methods,
    fitted_build,
    floor_grid,
    head_grid_curve,
)
from sparsefinder.calibration.curves import DISTANCE_FINE_GRID as _FINE
from sparsefinder.calibration.samples import RANK_CAP
from sparsefinder.catalog.app_controls import APP_CONTROLS, QUEST_PAGE_SIZE
from sparsefinder.catalog.builders import (
    _block_projections_fit,
    _distance,
    _hash_codes,
    _hash_codes_fit,
    _kmeans,
    _learned_block,
    _routed_kmeans,
    _row_fraction,
    _static_mask,
    _static_masks_fit,
    _unavailable_on_file_errors,
)
from sparsefinder.methods.grids import Control
from sparsefinder.methods.param import TARGET_RECALL, TARGET_SPARSITY
from sparsefinder.methods.registry import (
    CALIBRATION_LABELS,
    AppHint,
    Calibration,
    Form,
    Method,
    Param,
    SweepGrid,
    register_alias,
    register_method,
    sweep_grids,
)
from sparsefinder.predictors import (
    BigBird,
    BlockSparsefinder,
    Longformer,
    Quantization,
    Reformer,
    Routing,
    TopK,
    TopP,
    Window,
)
from sparsefinder.predictors.block_keys import BlockKeySparsefinder
from sparsefinder.predictors.hash_codes import HASH_BITS
from sparsefinder.predictors.quest import QuestPages

#: Window of the Longformer / BigBird baselines (the paper's efficiency study uses w = 3).
BASELINE_WINDOW = 3


# ------------------------------------------------------------------ declared parameters

def _int(name: str, default: int, low: int, label: str = "", url: str = "",
         high: int | None = None, app_high: int | None = None) -> Param:
    return Param(name, int, default, low=low, high=high, label=label or name, url=url or name,
                 app_high=app_high)


THRESHOLD = Param("threshold", float, 1.0, low=0.0, label="t", url="t",
                  help="keep a pair when its projected distance is at most t")
#: the app's slider and link ranges are these declarations' (``app_high``: its useful region)
BINS = _int("bins", 4, 1, "β", "beta", app_high=16)
CLUSTERS = _int("n_clusters", 8, 1, "B", "B")
TOP_K = _int("top_k", 1, 1, "k", "k", app_high=8)
WINDOW = _int("window", 3, 0, "w", "window", app_high=31)
#: Quest: pages of QUEST_PAGE keys kept per query
PAGES = _int("pages", 8, 0, "pages", "pages", app_high=64)
#: HashAttention: the largest Hamming distance of a kept key's code (16-bit bundled codes)
HAMMING = _int("max_distance", 3, 0, "Hamming distance", "hd", app_high=HASH_BITS)
SHARE = {"low": 0.0, "high": 1.0, "low_open": True}
#: every row of ``distance`` also keeps its m nearest allowed keys (no row left without
#: support; left out or 0: no floor); the app's first method is ``distance:budget`` with the
#: floor ``DEFAULT_FLOOR`` (the family once called ``distance-floor``)
DISTANCE_FLOOR = Param("floor", int, None, low=0, high=RANK_CAP, label="keys per row (floor)",
                       url="floor", optional=True, shown=" ∪ nearest keys per row (floor m)",
                       help="each row also keeps its m nearest keys (left out or 0: none)")
DIAG = Param("diag", bool, True, label="keep the diagonal", url="diag", optional=True,
             choices=(True, False), help="False: SparseBERT's ablation, no query keeps itself")
MASK_KIND = Param("kind", str, "structured", label="mask kind", url="kind", optional=True,
                  choices=("structured", "unstructured"),
                  help="structured: one frequency per offset (DAMs); unstructured: per pair (DAMu)")
BLOCK = _int("block", 32, 1, "block size", app_high=64)
N_BLOCKS = _int("n_blocks", 4, 0, "key blocks", app_high=16)
LEARNED = Param("learned", bool, False, label="learned block projections", url="learned",
                optional=True, choices=(False, True),
                help="True: blocks scored by projections learned on pooled blocks")
SELECT = Param("select", str, "blocks", label="what is selected", url="select", optional=True,
               choices=("blocks", "keys"),
               help="blocks: key blocks of pooled projected blocks (and single keys); keys: "
                    "single keys nearest to sub-blocks of queries, on the model's own q/k")
#: the floor's cap by row length (calibrated floors only: it reads the target); left out,
#: every row keeps ``floor`` keys
DISTANCE_FLOOR_SHARE = Param("floor_share", float, None, label="floor's share",
                             url="floor_share", optional=True, **SHARE,
                             help="a row's floor takes at most this share of the keys the "
                                  "target sparsity leaves the row (at least one key; left "
                                  "out: no cap)")


# ------------------------------------------------------------------ sweep grids (paper §5-6)
# distance: the paper's t ∈ {0.5, …, 5.0} plus the midpoints (with margin ω = 1 the learned
# scale puts sparsities 0.75–0.95 between t ≈ 1 and 2); and a finer grid 0.05 … 5.0
DISTANCE_GRID = [{"threshold": 0.25 * i} for i in range(1, 21)]
DISTANCE_FINE_GRID = [{"threshold": t} for t in _FINE]
CLUSTERS_GRID = (2, 4, 6, 8, 10, 12, 16, 20)
# β ∈ 1…5 (B = r·β ≤ 20 with r = 4) only reach a sparsity of about 0.6: continued to 32
BINS_GRID = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)
# the MT grid (w ≤ 27) followed by the 512-token MLM grid: the corpus has both lengths
WINDOW_GRID = (0, 1, 3, 5, 7, 9, 11, 15, 19, 23, 27, 31, 41, 51, 75, 101, 125, 151, 175, 201,
               251)
STATIC_MASK_GRID = [{"target_sparsity": t} for t in (0.5, 0.7, 0.8, 0.9, 0.95, 0.98)]
#: key blocks per query block (besides the diagonal one); 512 tokens = 16 blocks of 32
BLOCK_GRID = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12)
# the raw grids the per-head ("budget") calibrations choose from: the sweep grids, finer
# where a head's sparsity moves in large steps (``Method.head_grid``)
WINDOW_HEAD_GRID = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15, 19, 23, 27, 31, 41, 51, 63, 75, 101,
                    125, 151, 201, 251, 511)
BINS_HEAD_GRID = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128)
KMEANS_HEAD_GRID = tuple({"n_clusters": b, "top_k": k} for b in (2, 4, 6, 8, 10, 12, 16, 20)
                         for k in (1, 2, 3) if k < b)
ROUTED_HEAD_GRID = tuple({"n_clusters": 128, "budget": f} for f in (
    0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.12, 0.14, 0.16,
    0.18, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.8, 1.0))
#: the learned parts a family's build reads (``Method.needs``)
PROJ, BOOKS = ("projections",), ("projections", "codebooks")
SF, BASE = ("sparsefinder",), ("baselines",)
OTHER, FIXED = "Other predictors", "Fixed patterns"


def _app(group: str, *calibrations: str, first: bool = False, pinned: dict[str, Any] | None = None,
         params: dict[str, Control] | None = None) -> AppHint:
    return AppHint(group, calibrations or ("none",), first, dict(pinned or {}),
                   dict(params or {}))


def _over(name: str, values: Sequence[Any], **fixed: Any) -> list[dict[str, Any]]:
    return [{name: v, **fixed} for v in values]


#: the parameters a calibration may be given, by the name its curve declares (a family's
#: own declaration first)
CALIBRATION_PARAMS = {p.name: p for p in (TARGET_SPARSITY, TARGET_RECALL)}
FAMILY_CALIBRATION_PARAMS = {"distance": {p.name: p for p in (DISTANCE_FLOOR,
                                                              DISTANCE_FLOOR_SHARE)}}


def _builtin_methods() -> list[Method]:
    """Every built-in family, each with the calibrations that can set its parameters."""
    raw = [
        Method("distance", "Distance (t)", (THRESHOLD, DIAG, DISTANCE_FLOOR), _distance,
               needs=PROJ,
               grids=(*sweep_grids("distance", DISTANCE_GRID, window=True, groups=SF),
                      *sweep_grids("distance-fine", DISTANCE_FINE_GRID),
                      # SparseBERT's ablation: the diagonal dropped
                      *sweep_grids("distance-nodiag", DISTANCE_GRID, groups=BASE,
                                   fixed={"diag": False}),
                      # the default floor's calibrated curves, under the names their CSVs
                      # carry (thresholds fitted with the floor's density: the target holds)
                      *(SweepGrid(f"{FLOOR_FORM}:{c}", tuple(floor_grid()), c,
                                  groups=("calibrated",)) for c in ("equal", "budget"))),
               app=_app("Sparsefinder", "budget", "none", first=True,
                        params=APP_CONTROLS["distance"])),
        Method("quantization", "Quantization (β)", (BINS,),
               lambda p, c: Quantization(int(p["bins"])), needs=PROJ,
               grids=sweep_grids("quantization", _over("bins", BINS_GRID), window=True,
                                 groups=SF),
               head_grid=tuple(_over("bins", BINS_HEAD_GRID)),
               app=_app("Sparsefinder", params=APP_CONTROLS["quantization"])),
        Method("kmeans", "k-means (B, k)", (CLUSTERS, TOP_K), _kmeans, needs=PROJ,
               grids=(*sweep_grids("kmeans", _over("n_clusters", CLUSTERS_GRID, top_k=1),
                                   window=True, groups=SF),  # top 2: denser, higher recall
                      *sweep_grids("kmeans-top2", _over("n_clusters", CLUSTERS_GRID[1:],
                                                        top_k=2), window=True)),
               head_grid=KMEANS_HEAD_GRID,
               app=_app("Sparsefinder", params=APP_CONTROLS["kmeans"])),
        # window 0 keeps nothing: with the app's window and global tokens (united with every
        # method), the "window / global only" setting the app falls back to
        Method("window", "Window (w)", (WINDOW,), lambda p, c: Window(int(p["window"])),
               inputs="shape", tags=("cheap",),
               needs=(), grids=sweep_grids("window", _over("window", WINDOW_GRID), groups=SF),
               head_grid=tuple(_over("window", WINDOW_HEAD_GRID)),
               app=_app(FIXED, pinned={"window": 0})),
        Method("longformer", "Longformer", (_int("n_global", 2, 0, "global tokens", app_high=32),),
               lambda p, c: Longformer(BASELINE_WINDOW, int(p["n_global"]), seed=c.layer),
               inputs="shape", tags=("cheap", "baseline"), needs=(),
               grids=sweep_grids("longformer", _over("n_global", (4, 8, 12, 16, 20)),
                                 groups=BASE),
               app=_app(FIXED)),
        Method("bigbird", "BigBird", (_int("n_random", 2, 0, "random keys", app_high=32),),
               lambda p, c: BigBird(BASELINE_WINDOW, int(p["n_random"]), seed=c.layer),
               inputs="shape", tags=("cheap", "baseline"), needs=(),
               grids=sweep_grids("bigbird", _over("n_random", (2, 4, 6, 8, 10)), groups=BASE),
               app=_app(FIXED)),
        Method("reformer", "Reformer (LSH)", (_int("n_buckets", 4, 1, "buckets", app_high=32),),
               lambda p, c: Reformer(int(p["n_buckets"]), seed=c.layer), tags=("baseline",),
               needs=PROJ,
               grids=sweep_grids("reformer", _over("n_buckets", (2, 4, 6, 8, 10, 12)),
                                 window=True, groups=BASE),
               app=_app(FIXED)),
        Method("routing", "Routing (k-means)", (_int("n_clusters", 4, 1, "clusters", app_high=32),),
               lambda p, c: Routing(int(p["n_clusters"]), seed=c.layer), tags=("baseline",),
               needs=PROJ,
               grids=sweep_grids("routing", _over("n_clusters", (2, 4, 6, 8, 10)),
                                 window=True, groups=BASE),
               app=_app(FIXED)),
        Method("topk", "Top-k by exact scores (reference)",
               (_int("k", 8, 1, "keys per query", "keys", app_high=128),),
               lambda p, c: TopK(int(p["k"])), inputs="original", oracle=True, needs=(),
               tags=("oracle",),
               grids=sweep_grids("topk", _over("k", (1, 2, 4, 8, 16, 32)), groups=BASE),
               app=_app("Oracles (bounds)")),
        # SparseBERT's static masks (DAMs: structured, DAMu: unstructured), fitted on TRAIN
        Method("sparsebert", "SparseBERT DAM (static)", (TARGET_SPARSITY, MASK_KIND),
               _static_mask, inputs="shape", fit=_static_masks_fit, fit_reads=("kind",),
               needs=("fitted",), tags=("baseline",),
               grids=(*sweep_grids("sparsebert-dams", STATIC_MASK_GRID, groups=BASE,
                                   fixed={"kind": "structured"}),
                      *sweep_grids("sparsebert-damu", STATIC_MASK_GRID, groups=BASE,
                                   fixed={"kind": "unstructured"}))),
        # keys clustered offline, queries routed by q·c
        Method("kmeans-routed", "Routed k-means (B, key budget or routes)",
               (_int("n_clusters", 128, 1, "B", app_high=128),
                Param("budget", float, 0.1, label="key budget", url="budget", optional=True,
                      help="mode budget: the share of keys kept", **SHARE),
                Param("n_routes", int, 4, low=1, label="routes", url="n_routes", app_high=64,
                      optional=True, help="mode top: the nearest clusters a query reads"),
                Param("mode", str, "budget", label="mode", url="mode", optional=True,
                      choices=("budget", "top"))),
               _routed_kmeans, inputs="original", needs=BOOKS,  # grids chosen on TRAIN
               grids=(*sweep_grids("kmeans-routed", [
                   {"n_clusters": b, "budget": f} for b in (64, 128)
                   for f in (0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.12, 0.15,
                             0.2, 0.25, 0.3)]),
                      *sweep_grids("kmeans-routed-top", _over(
                          "n_routes", (2, 4, 6, 8, 9, 10, 11, 12, 14, 16, 20, 24, 32),
                          n_clusters=128), fixed={"mode": "top"})),
               head_grid=ROUTED_HEAD_GRID,
               app=_app(OTHER, "budget")),
        Method("topp", "Top-p of exact entmax (reference)",
               (Param("p", float, 0.9, label="mass p", url="p", **SHARE),),
               lambda p, c: TopP(float(p["p"])), inputs="original", oracle=True, needs=(),
               tags=("oracle",), grids=sweep_grids("topp", _over(
                   "p", (0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 1.0))),
               app=_app("Oracles (bounds)")),
        # long-context baselines: training-free page bounds; learned hash codes
        Method("quest", "Quest pages (min/max key bounds)",
               (_int("page_size", QUEST_PAGE_SIZE, 1, "page size"), PAGES),
               lambda p, c: QuestPages(int(p["pages"]), int(p["page_size"])),
               inputs="original", tags=("baseline", "long-context"), needs=(),
               grids=sweep_grids("quest", _over("pages", (1, 2, 4, 8, 16, 32, 64),
                                                page_size=16)),
               app=_app(OTHER, pinned={"page_size": QUEST_PAGE_SIZE},
                        params=APP_CONTROLS["quest"])),
        Method("hashattention", "HashAttention (learned bit codes)",
               (HAMMING,),
               _hash_codes, inputs="original", fit=_hash_codes_fit,
               needs=("hash_codes",), fits="hash_codes",
               tags=("baseline", "long-context"),
               grids=sweep_grids("hashattention", _over("max_distance", range(9))),
               app=_app(OTHER, params=APP_CONTROLS["hashattention"])),
        # block Sparsefinder (paper §6): nearest key blocks (and single keys) of pooled
        # projected query blocks; what sparsefinder.attention.block_sparse computes on
        Method("block", "Block Sparsefinder (block, key blocks, single keys)",
               (BLOCK, N_BLOCKS, _int("n_keys", 0, 0, "single keys", app_high=64), LEARNED,
                SELECT),
               lambda p, c: BlockSparsefinder(int(p["block"]), int(p["n_blocks"]),
                                              int(p["n_keys"])), needs=PROJ,
               # learned=True: the same selection (no single keys) scored by projections
               # learned on pooled blocks, from the model's own q/k
               forms=(Form("learned", True, (BLOCK, N_BLOCKS, LEARNED), _learned_block,
                           "original", _block_projections_fit, ("block_projections",),
                           "block_projections"),
                      # per query block: the diagonal block and the single keys nearest (q·k)
                      # to any of its sub-blocks of queries, on the model's own q/k; the
                      # long-context selector of benchmarks/restricted.py
                      Form("select", "keys", (BLOCK, _int("n_keys", 448, 0, "single keys",
                                                          app_high=1024),
                                              _int("sub_block", 8, 1, "query sub-block",
                                                   app_high=64), SELECT),
                           lambda p, c: BlockKeySparsefinder(int(p["block"]), int(p["n_keys"]),
                                                             int(p["sub_block"])),
                           "original", needs=(), tags=("long-context",))),
               grids=(*(g for name, size, keys in (("block", 32, 0), ("block16", 16, 0),
                                                   ("block+keys", 32, 16))
                        for g in sweep_grids(name, _over("n_blocks", BLOCK_GRID, block=size,
                                                         n_keys=keys))),
                      *(g for name, size in (("block-learned", 32), ("block16-learned", 16))
                        for g in sweep_grids(name, _over("n_blocks", BLOCK_GRID, block=size),
                                             fixed={"learned": True})),
                      *sweep_grids("block-keys", _over("n_keys", (0, 2, 4, 8, 16, 32, 64, 128),
                                                       block=32, sub_block=8),
                                   fixed={"select": "keys"})),
               app=_app(OTHER)),
        # each query keeps its nearest share of keys in the learned space (the raw form of
        # the calibrated row fractions)
        Method("rowfrac", "Nearest keys (row fraction)",
               (Param("fraction", float, 0.1, label="keep fraction", url="frac", **SHARE),),
               _row_fraction, needs=PROJ, grids=sweep_grids("rowfrac", _over(
                   "fraction", (0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5))),
               app=_app("Sparsefinder", "budget", "none")),
    ]
    return _with_calibrations(raw)


def _calibrated_curves(raw: Sequence[Method]) -> list[CalibratedCurve]:
    """Every calibration of the families: the calibrated distances, and one per-head
    ("budget") calibration per family that declares a ``head_grid``."""
    return [*calibrated_methods(), *(head_grid_curve(method.name, method.head_grid)
                                     for method in raw if method.head_grid)]


def _with_calibrations(raw: list[Method]) -> list[Method]:
    """The families with their calibrations (a target fitted on TRAIN graphs) attached."""
    by_family: dict[str, list[Calibration]] = {}
    for curve in _calibrated_curves(raw):
        declared = {**CALIBRATION_PARAMS, **FAMILY_CALIBRATION_PARAMS.get(curve.family, {})}
        by_family.setdefault(curve.family, []).append(Calibration(
            curve.calibration, declared[curve.target], curve.fit, fitted_build,
            CALIBRATION_LABELS[curve.calibration],
            tuple(declared[name] for name in curve.extra), tuple(curve.grid)))
    return [dataclasses.replace(method, calibrations=tuple(by_family.get(method.name, ())))
            for method in raw]


#: The families of the time before that are now a form of another (a parameter), by old name.
FORMS: dict[str, tuple[str, dict[str, Any]]] = {
    "distance-nodiag": ("distance", {"diag": False}),
    FLOOR_FORM: ("distance", {"floor": DEFAULT_FLOOR}),
    "sparsebert-dams": ("sparsebert", {"kind": "structured"}),
    "sparsebert-damu": ("sparsebert", {"kind": "unstructured"}),
    "kmeans-routed-top": ("kmeans-routed", {"mode": "top"}),
    "block-learned": ("block", {"learned": True}),
    "block-keys": ("block", {"select": "keys"}),
    "fixed": ("window", {"window": 0}),
}


def _register_builtin() -> None:
    methods = _builtin_methods()
    for method in methods:
        guarded = tuple(dataclasses.replace(c, build=_unavailable_on_file_errors(c.build))
                        for c in method.calibrations)
        forms = tuple(dataclasses.replace(f, build=_unavailable_on_file_errors(f.build))
                      for f in method.forms)
        register_method(dataclasses.replace(
            method, build=_unavailable_on_file_errors(method.build), calibrations=guarded,
            forms=forms), replace=True)
    for curve in _calibrated_curves(methods):  # the names of the time before families
        if curve.old_name:
            register_alias(curve.old_name, curve.family, curve.calibration)
    for old, (family, params) in FORMS.items():
        register_alias(old, family, params=params)


_register_builtin()
