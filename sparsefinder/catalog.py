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

import copy
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import torch

from sparsefinder.calibration.curves import (
    DEFAULT_FLOOR,
    DEFAULT_FLOOR_SHARE,
    calibrated_methods,
    fitted_build,
)
from sparsefinder.calibration.samples import RANK_CAP
from sparsefinder.data.records import AttentionRecord
from sparsefinder.methods.registry import (
    CALIBRATION_LABELS,
    BuildContext,
    Builder,
    Calibration,
    Fitter,
    Method,
    MethodUnavailable,
    Param,
    Params,
    register_alias,
    register_method,
)
from sparsefinder.predictors import (
    BigBird,
    BlockSparsefinder,
    Distance,
    Longformer,
    NoDiagonal,
    Quantization,
    Reformer,
    Routing,
    StaticMask,
    TopK,
    TopP,
    Window,
)
from sparsefinder.predictors.base import Predictor
from sparsefinder.predictors.block import LearnedBlockSparsefinder
from sparsefinder.predictors.block_keys import BlockKeySparsefinder
from sparsefinder.predictors.hash_codes import HammingCodes
from sparsefinder.predictors.quest import QuestPages
from sparsefinder.predictors.row_floor import RowFloor
from sparsefinder.predictors.row_fraction import RowFraction
from sparsefinder.projections.blocks import (
    check_block_projections,
    train_block_projections_by_size,
)
from sparsefinder.projections.hash_code_table import HashCodesError
from sparsefinder.projections.hash_fit import fit_hash_codes
from sparsefinder.projections.heads import HeadProjections, ProjectionsError
from sparsefinder.projections.key_codebooks import CodebooksError, bundled_codebooks

#: Window of the Longformer / BigBird baselines (the paper's efficiency study uses w = 3).
BASELINE_WINDOW = 3


def _unavailable_on_file_errors(build: Builder) -> Builder:
    """A builder whose missing learned part (a file error) reads as "not available here"."""

    @functools.wraps(build)
    def wrapped(params: Params, context: BuildContext) -> Predictor | None:
        try:
            return build(params, context)
        except (ProjectionsError, CodebooksError, HashCodesError) as error:
            raise MethodUnavailable(str(error)) from error

    return wrapped


def _require_projections(context: BuildContext, what: str) -> HeadProjections:
    if context.projections is None:
        raise ValueError(
            f"{what} needs learned projections for this model; train them with "
            "`sparsefinder train --model NAME --out DIR` and pass the projections file"
        )
    return context.projections


def _require_fitted(context: BuildContext, hint: str = "") -> Any:
    if context.fitted is None:
        raise ValueError("this method is learned from training graphs; pass train_records=..."
                         + hint)
    return context.fitted


def _training_graphs(
    train_records: Sequence[AttentionRecord], what: str
) -> Sequence[AttentionRecord]:
    """``train_records``, or the error a learned method gives when it has none."""
    if not train_records:
        raise ValueError(f"{what} are learned from training graphs; pass train_records=...")
    return train_records


# ------------------------------------------------------------------ builders and fitters

def _kmeans(p: Params, c: BuildContext) -> Predictor:
    projections = _require_projections(c, "k-means")
    return projections.kmeans(c.layer, int(p["n_clusters"]), top_k=int(p.get("top_k", 1)))


def _routed_kmeans(mode: str) -> Builder:
    """Routed k-means from the bundled key codebooks of the projections' model."""

    def build(p: Params, c: BuildContext) -> Predictor:
        if c.projections is None:  # its model_id tells which model's codebooks apply
            raise CodebooksError("kmeans-routed needs the model's projections to know its "
                                 "model id; pass projections=...")
        books = bundled_codebooks()
        if c.projections.model_id != books.model_id:
            raise CodebooksError(
                f"the bundled key codebooks are for {books.model_id!r}, not "
                f"{c.projections.model_id!r}; fit some with `sparsefinder fit-codebooks`"
            )
        if mode == "top":
            return books.predictor(c.layer, int(p["n_clusters"]), mode="top",
                                   n_routes=int(p["n_routes"]))
        return books.predictor(c.layer, int(p["n_clusters"]), budget=float(p["budget"]))

    return build


def _row_fraction(p: Params, c: BuildContext) -> Predictor:
    projections = _require_projections(c, "nearest keys (rowfrac)")
    return RowFraction(torch.full((projections.num_heads,), float(p["fraction"])))


def _static_mask_fitter(kind: str) -> Fitter:
    """``fit`` of SparseBERT's static masks: one ``StaticMask(kind)`` per layer, fitted on the
    training gold graphs; each grid point gets a copy re-targeted to its sparsity."""

    def fit(train_records: Sequence[AttentionRecord]) -> list[StaticMask]:
        if not train_records:
            raise ValueError(f"sparsebert ({kind}) masks are fitted on training graphs; "
                             "pass train_records=...")
        causal = train_records[0].causal
        return [
            StaticMask(kind, 0.5).fit([r.layers[layer].gold for r in train_records],
                                      causal=causal)
            for layer in range(train_records[0].num_layers)
        ]

    return fit


def _static_mask(p: Params, c: BuildContext) -> Predictor:
    # A shallow copy shares the learned (read-only) tensors; its keep() cache is keyed by the
    # target, so the copy recomputes it for its own target.
    mask = copy.copy(_require_fitted(c)[c.layer])
    mask.target_sparsity = float(p["target_sparsity"])
    mask._check_target()
    return mask


def _hash_codes_fit(train_records: Sequence[AttentionRecord]) -> Any:
    return fit_hash_codes(_training_graphs(train_records, "hashattention codes"))


def _hash_codes(p: Params, c: BuildContext) -> Predictor:
    w_query, w_key = _require_fitted(c)[c.layer]
    return HammingCodes(w_query, w_key, int(p["max_distance"]))


def _block_projections_fit(train_records: Sequence[AttentionRecord]) -> Any:
    return train_block_projections_by_size(
        _training_graphs(train_records, "block-learned projections"))


def _learned_block(p: Params, c: BuildContext) -> Predictor:
    """``fitted``: block projections by block size (the fit's result or the bundled ones),
    or one size's projections."""
    fitted_all = _require_fitted(c, " (or the bundled block projections as fitted=...)")
    block = int(p["block"])
    fitted = fitted_all.get(block) if isinstance(fitted_all, dict) else fitted_all
    if fitted is None:
        raise ValueError(f"no block projections for blocks of {block} tokens (fitted: "
                         f"{sorted(fitted_all)}); train them with `sparsefinder "
                         f"fit-block-projections --block {block}`")
    check_block_projections(fitted, block)
    return LearnedBlockSparsefinder(fitted.weight[c.layer], block, int(p["n_blocks"]))


# ------------------------------------------------------------------ declared parameters

def _int(name: str, default: int, low: int, label: str = "", url: str = "",
         high: int | None = None, app_high: int | None = None) -> Param:
    return Param(name, int, default, low=low, high=high, label=label or name, url=url or name,
                 app_high=app_high)


THRESHOLD = Param("threshold", float, 1.0, low=0.0, label="t", url="t",
                  help="keep a pair when its projected distance is at most t")
BINS = _int("bins", 4, 1, "β", "beta")
CLUSTERS = _int("n_clusters", 8, 1, "B", "B")
TOP_K = _int("top_k", 1, 1, "k", "k")
WINDOW = _int("window", 3, 0, "w", "window")
TARGET_SPARSITY = Param("target_sparsity", float, 0.9, low=0.0, high=1.0,
                        label="target sparsity", url="target")
TARGET_RECALL = Param("target_recall", float, 0.9, low=0.0, high=1.0,
                      label="target recall", url="target")
SHARE = {"low": 0.0, "high": 1.0, "low_open": True}
FLOOR = _int("floor", DEFAULT_FLOOR, 1, "keys per row (floor)", "floor", high=RANK_CAP)
#: the floor's cap by row length (calibrated floors only: it reads the target); left out,
#: every row keeps ``floor`` keys
FLOOR_SHARE = Param("floor_share", float, DEFAULT_FLOOR_SHARE, label="floor's share",
                    url="floor_share", optional=True, **SHARE,
                    help="a row's floor takes at most this share of the keys the target "
                         "sparsity leaves the row (at least one key; left out: no cap)")


def _builtin_methods() -> list[Method]:
    """Every built-in family, each with the calibrations that can set its parameters."""
    raw = [
        Method("distance", "Distance (t)", (THRESHOLD,),
               lambda p, c: Distance(float(p["threshold"]))),
        # every row also keeps its m nearest allowed keys (no row left without support)
        Method("distance-floor", "Distance (t) ∪ nearest keys per row (floor m)",
               (THRESHOLD, FLOOR),
               lambda p, c: RowFloor(Distance(float(p["threshold"])), int(p["floor"]))),
        Method("quantization", "Quantization (β)", (BINS,),
               lambda p, c: Quantization(int(p["bins"]))),
        Method("kmeans", "k-means (B, k)", (CLUSTERS, TOP_K), _kmeans),
        Method("fixed", "Window / global only", (), lambda p, c: None, inputs="shape"),
        Method("window", "Window (w)", (WINDOW,), lambda p, c: Window(int(p["window"])),
               inputs="shape"),
        Method("longformer", "Longformer", (_int("n_global", 2, 0, "global tokens", app_high=32),),
               lambda p, c: Longformer(BASELINE_WINDOW, int(p["n_global"]), seed=c.layer),
               inputs="shape"),
        Method("bigbird", "BigBird", (_int("n_random", 2, 0, "random keys", app_high=32),),
               lambda p, c: BigBird(BASELINE_WINDOW, int(p["n_random"]), seed=c.layer),
               inputs="shape"),
        Method("reformer", "Reformer (LSH)", (_int("n_buckets", 4, 1, "buckets", app_high=32),),
               lambda p, c: Reformer(int(p["n_buckets"]), seed=c.layer)),
        Method("routing", "Routing (k-means)", (_int("n_clusters", 4, 1, "clusters", app_high=32),),
               lambda p, c: Routing(int(p["n_clusters"]), seed=c.layer)),
        Method("topk", "Top-k by exact scores (reference)",
               (_int("k", 8, 1, "keys per query", "keys", app_high=128),),
               lambda p, c: TopK(int(p["k"])), inputs="original", oracle=True),
        Method("sparsebert-dams", "SparseBERT DAMs (static)", (TARGET_SPARSITY,),
               _static_mask, inputs="shape", fit=_static_mask_fitter("structured")),
        Method("sparsebert-damu", "SparseBERT DAMu (static)", (TARGET_SPARSITY,),
               _static_mask, inputs="shape", fit=_static_mask_fitter("unstructured")),
        Method("distance-nodiag", "Distance, no diagonal (SparseBERT)", (THRESHOLD,),
               lambda p, c: NoDiagonal(Distance(float(p["threshold"])))),
        # keys clustered offline, queries routed by q·c
        Method("kmeans-routed", "Routed k-means (B, key budget)",
               (_int("n_clusters", 128, 1, "B", app_high=128),
                Param("budget", float, 0.1, label="key budget", url="budget", **SHARE)),
               _routed_kmeans("budget"), inputs="original"),
        Method("kmeans-routed-top", "Routed k-means (B, routes)",
               (_int("n_clusters", 128, 1, "B", app_high=128),
                _int("n_routes", 4, 1, "routes", app_high=64)),
               _routed_kmeans("top"), inputs="original"),
        Method("topp", "Top-p of exact entmax (reference)",
               (Param("p", float, 0.9, label="mass p", url="p", **SHARE),),
               lambda p, c: TopP(float(p["p"])), inputs="original", oracle=True),
        # long-context baselines: training-free page bounds; learned hash codes
        Method("quest", "Quest pages (min/max key bounds)",
               (_int("page_size", 16, 1, "page size"), _int("pages", 8, 0, "pages", "pages")),
               lambda p, c: QuestPages(int(p["pages"]), int(p["page_size"])),
               inputs="original"),
        Method("hashattention", "HashAttention (learned bit codes)",
               (_int("max_distance", 3, 0, "Hamming distance", "hd"),),
               _hash_codes, inputs="original", fit=_hash_codes_fit),
        # block Sparsefinder (paper §6): nearest key blocks (and single keys) of pooled
        # projected query blocks; what sparsefinder.attention.block_sparse computes on
        Method("block", "Block Sparsefinder (block, key blocks, single keys)",
               (_int("block", 32, 1, "block size", app_high=64),
                _int("n_blocks", 4, 0, "key blocks", app_high=16),
                _int("n_keys", 0, 0, "single keys", app_high=64)),
               lambda p, c: BlockSparsefinder(int(p["block"]), int(p["n_blocks"]),
                                              int(p["n_keys"]))),
        # the same selection (no single keys) scored by projections learned on pooled blocks
        Method("block-learned", "Block Sparsefinder, learned block projections",
               (_int("block", 32, 1, "block size"), _int("n_blocks", 4, 0, "key blocks")),
               _learned_block, inputs="original", fit=_block_projections_fit),
        # per query block: the diagonal block and the single keys nearest (q·k) to any of its
        # sub-blocks of queries; the long-context selector of benchmarks/restricted.py
        Method("block-keys", "Block Sparsefinder, single keys by query sub-blocks",
               (_int("block", 32, 1, "block size", app_high=64),
                _int("n_keys", 448, 0, "single keys", app_high=1024),
                _int("sub_block", 8, 1, "query sub-block", app_high=64)),
               lambda p, c: BlockKeySparsefinder(int(p["block"]), int(p["n_keys"]),
                                                 int(p["sub_block"])),
               inputs="original"),
        # each query keeps its nearest share of keys in the learned space (the raw form of
        # the calibrated row fractions)
        Method("rowfrac", "Nearest keys (row fraction)",
               (Param("fraction", float, 0.1, label="keep fraction", url="frac", **SHARE),),
               _row_fraction),
    ]
    return _with_calibrations(raw)


def _with_calibrations(raw: list[Method]) -> list[Method]:
    """The families with their calibrations (a target fitted on TRAIN graphs) attached."""
    by_family: dict[str, list[Calibration]] = {}
    for curve in calibrated_methods():
        target = TARGET_RECALL if "target_recall" in curve.grid[0] else TARGET_SPARSITY
        extra = (FLOOR, FLOOR_SHARE) if "floor" in curve.grid[0] else ()
        by_family.setdefault(curve.family, []).append(Calibration(
            curve.calibration, target, curve.fit, fitted_build,
            CALIBRATION_LABELS[curve.calibration], extra))
    return [dataclasses.replace(method, calibrations=tuple(by_family.get(method.name, ())))
            for method in raw]


def _register_builtin() -> None:
    for method in _builtin_methods():
        guarded = tuple(dataclasses.replace(c, build=_unavailable_on_file_errors(c.build))
                        for c in method.calibrations)
        register_method(dataclasses.replace(
            method, build=_unavailable_on_file_errors(method.build), calibrations=guarded),
            replace=True)
    for curve in calibrated_methods():  # the names of the time before families
        if curve.old_name:
            register_alias(curve.old_name, curve.family, curve.calibration)


_register_builtin()
