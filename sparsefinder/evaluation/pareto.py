"""Sparsity–recall sweeps over hyperparameter grids and their Pareto frontiers (paper §5–6).

A *curve* (:data:`CURVES`) is a grid over one predictor family of the method registry
(:mod:`sparsefinder.methods.spec`): a list of :class:`~sparsefinder.methods.spec.PredictorSpec`,
e.g.
``distance`` (the thresholds) or ``distance+window`` (the same ∪ a window of 3). New families
are registered in :mod:`sparsefinder.methods.spec`, new grids with :func:`register_curve`.
:func:`sweep` scores every spec of the chosen curves with :func:`score_specs`: for each text
it builds a :class:`~sparsefinder.metrics.Scorer` once, runs the per-layer predictors of each
spec through :func:`~sparsefinder.methods.spec.predict_record` (projections computed once per text
and
layer) and macro-averages recall and sparsity (texts, then heads, then layers). The app's live
view scores a setting with the very same two calls, so its numbers equal the sweep's.

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

:func:`recall_at_sparsity` reads a method's frontier at fixed sparsity levels; see its
docstring for the interpolation rule.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from sparsefinder.calibration.curves import DISTANCE_FINE_GRID, calibrated_grids
from sparsefinder.data.records import AttentionRecord
from sparsefinder.methods.registry import MethodUnavailable
from sparsefinder.methods.spec import PredictorSpec, RecordInputs, predict_record
from sparsefinder.metrics import EXTRA_METRICS, GraphScores, Scorer, block_recall, macro_average
from sparsefinder.projections.heads import HeadProjections

Params = dict[str, Any]
ProgressFn = Callable[[float, str], None]

DISTANCE_GRID = [0.25 * i for i in range(1, 21)]
CLUSTER_GRID = [2, 4, 6, 8, 10, 12, 16, 20]
QUANTIZATION_BINS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32]
WINDOW_GRID = [0, 1, 3, 5, 7, 9, 11, 15, 19, 23, 27]
WINDOW_GRID_LONG = [31, 41, 51, 75, 101, 125, 151, 175, 201, 251]
WITH_WINDOW_SIZE = 3
SPARSITY_LEVELS = (0.75, 0.9, 0.95)
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
        return self.specs[0].method

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
    "long-context": ["quest", "hashattention"],
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
#: Block Sparsefinder with projections learned on pooled blocks (paper §6): (name, block);
#: the block size must be the one the projections were trained on (block_projections).
LEARNED_BLOCK_CURVES = (("block-learned", 32), ("block16-learned", 16))
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
    # Issue 10: a finer raw grid for distance, and distance driven by a target sparsity or
    # recall with per-head thresholds fitted on TRAIN graphs (sparsefinder.calibration.curves).
    register_curve("distance-fine", "distance", [{"threshold": t} for t in DISTANCE_FINE_GRID],
                   replace=True)
    for name, grid in calibrated_grids().items():
        register_curve(name, name, grid, replace=True)
    # Issue 10 (buckets): k-means on KEYS with queries routed by q·c, and the top-p oracle
    # (sparsefinder.predictors.routed_kmeans / topp); grids chosen on the TRAIN split.
    register_curve("kmeans-routed", "kmeans-routed", ROUTED_BUDGET_GRID, replace=True)
    register_curve("kmeans-routed-top", "kmeans-routed-top", ROUTED_TOP_GRID, replace=True)
    register_curve("topp", "topp", [{"p": p} for p in TOPP_GRID], replace=True)
    # Issue 14: long-context baselines on the model's own q/k (sparsefinder.predictors.quest,
    # .hash_codes; codes fitted on TRAIN graphs).
    register_curve("quest", "quest", [{"page_size": QUEST_PAGE, "pages": p} for p in QUEST_GRID],
                   replace=True)
    register_curve("hashattention", "hashattention",
                   [{"max_distance": t} for t in HASH_DISTANCE_GRID], replace=True)
    # Issue 13: block Sparsefinder, 32-token blocks, key blocks per query block.
    for name, size, keys in BLOCK_CURVES:
        register_curve(name, "block", [{"block": size, "n_blocks": b, "n_keys": keys}
                                       for b in BLOCK_GRID], replace=True)
    for name, size in LEARNED_BLOCK_CURVES:
        register_curve(name, "block-learned", [{"block": size, "n_blocks": b}
                                               for b in BLOCK_GRID], replace=True)


_register_defaults()


def resolve_methods(spec: str | Sequence[str]) -> list[str]:
    """``"sparsefinder"``, ``"all"`` or a comma list (groups allowed) → curve names."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for item in (s.strip() for s in items):
        if not item:
            continue
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


# ==================================================================== scoring


@dataclass
class SpecScores:
    """Macro-averaged scores of one spec over a set of records."""

    recall: float
    sparsity: float
    recall_per_layer: list[float]
    sparsity_per_layer: list[float]
    n_texts: int
    #: macro averages of the :data:`~sparsefinder.metrics.EXTRA_METRICS` (precision, exact
    #: fraction, mass recall, block recall at 16 and 64), same averaging as recall
    extra: dict[str, float] = field(default_factory=dict)
    #: tile recall at the method's own ``block`` parameter (metrics.block_recall); NaN
    #: for token-level methods
    block_recall: float = math.nan

    @property
    def exact_fraction(self) -> float:
        """Share of query rows whose whole gold support is predicted."""
        return self.extra.get("exact_fraction", math.nan)


def score_specs(
    records: Sequence[AttentionRecord],
    projections: HeadProjections | None,
    specs: Sequence[PredictorSpec],
    *,
    fitted: Sequence[Any] | None = None,
    on_progress: ProgressFn | None = None,
) -> tuple[list[SpecScores], GraphScores]:
    """Macro-averaged scores of every spec on ``records`` and the gold sparsity.

    Per text: one :class:`Scorer`, one :class:`RecordInputs` (projections computed once per
    layer), then for each spec ``scorer.score(predict_record(...))`` — the same calls the
    app makes for one setting. ``fitted[i]`` is what ``specs[i].fit(train_records)`` returned
    (for methods learned from training graphs). ``on_progress(fraction, message)`` is called
    after each text.
    """
    if not records:
        raise ValueError("scoring needs at least one record (a text's gold graphs)")
    num_layers = records[0].num_layers
    if any(r.num_layers != num_layers for r in records):
        raise ValueError("records come from models with different numbers of layers")
    if any(s.needs_projections for s in specs) and projections is None:
        raise ValueError("these methods need learned projections; pass projections=... "
                         "(train them with `sparsefinder train --model NAME --out DIR`)")
    fitted = list(fitted) if fitted is not None else [None] * len(specs)
    built = [spec.build_layers(projections, num_layers, fit)
             for spec, fit in zip(specs, fitted, strict=True)]
    per_spec: list[list[GraphScores]] = [[] for _ in specs]
    extras: list[list[Tensor]] = [[] for _ in specs]  # (layers, heads) per text
    gold: list[GraphScores] = []
    for index, record in enumerate(records):
        scorer = Scorer(record)
        vectors = RecordInputs(record, projections)
        for c, spec in enumerate(specs):
            preds = predict_record(spec, built[c], vectors)
            per_spec[c].append(scorer.score(preds))
            extras[c].append(_own_block_recall(spec, preds, scorer))
        gold.append(GraphScores(recall=torch.ones_like(scorer.gold_sparsity),
                                sparsity=scorer.gold_sparsity))
        if on_progress is not None:
            on_progress((index + 1) / len(records),
                        f"text {index + 1} of {len(records)} ({len(specs)} settings)")
    results = []
    for scores, extra in zip(per_spec, extras, strict=True):
        avg = macro_average(scores)
        # macro: texts, then heads, then layers (equal shapes: the mean of means is the mean)
        # macro over texts, heads, layers (equal shapes: the mean of means is the mean)
        block = float(torch.stack(extra).mean()) if extra else math.nan
        results.append(SpecScores(
            recall=float(avg["recall"]), sparsity=float(avg["sparsity"]),
            recall_per_layer=[float(x) for x in avg["recall_per_layer"]],
            sparsity_per_layer=[float(x) for x in avg["sparsity_per_layer"]],
            n_texts=int(avg["n_texts"]), block_recall=block,
            extra={name: float(avg[name]) for name in EXTRA_METRICS if name in avg},
        ))
    gold_avg = macro_average(gold)
    gold_scores = GraphScores(recall=gold_avg["recall_per_layer"],
                              sparsity=gold_avg["sparsity_per_layer"])
    return results, gold_scores


def _own_block_recall(spec: PredictorSpec, preds: Sequence[Tensor], scorer: Scorer) -> Tensor:
    """(layers, heads) float64: block recall at the spec's own ``block`` parameter (NaN for
    methods without one; the Scorer's extras give it at 16 and 64)."""
    block = spec.param_dict.get("block")
    rows = []
    for pred, gold in zip(preds, scorer.golds, strict=True):
        rows.append(block_recall(pred, gold, int(block), causal=scorer.causal) if block
                    else torch.full(pred.shape[:1], math.nan, dtype=torch.float64))
    return torch.stack(rows)


def score_spec(records: Sequence[AttentionRecord], projections: HeadProjections | None,
               spec: PredictorSpec) -> SpecScores:
    """:func:`score_specs` for one setting (e.g. the app's star on the Pareto page)."""
    return score_specs(records, projections, [spec])[0][0]


def sweep(
    records: Sequence[AttentionRecord],
    projections: HeadProjections | None,
    methods: str | Sequence[str] = "sparsefinder",
    *,
    train_records: Sequence[AttentionRecord] | None = None,
    on_progress: ProgressFn | None = None,
) -> pd.DataFrame:
    """Score every grid point of the curves ``methods`` on ``records`` → one row per point.

    Each curve's predictors get the input its method declares (``spec.inputs``): the
    projections of q/k, or the original q/k (e.g. ``topk``) — also when other curves in the
    same sweep need projections. Methods learned from training graphs (the SparseBERT static
    masks) are fitted once on ``train_records`` (gold graphs of TRAINING texts, never the
    evaluation ones); without them they are skipped with a warning. Grid points that cannot
    be built (k-means without centroids for that B) are skipped with a warning.
    ``on_progress(fraction, message)`` reports progress (the CLI draws a bar with it).

    Columns: ``method`` (curve name), ``params`` (JSON), ``recall``, ``sparsity``, then
    ``precision``, ``exact_fraction``, ``mass_recall``, ``block_recall16``, ``block_recall64``
    (macro averages, :data:`~sparsefinder.metrics.EXTRA_METRICS`),
    ``recall_per_layer``/``sparsity_per_layer`` (JSON lists), ``n_texts`` and
    ``block_recall`` (tile recall at the method's own ``block`` parameter, NaN for methods
    without one, e.g. every token-level method). The gold sparsity (overall and per layer) is
    in ``df.attrs``.
    """
    if not records:
        raise ValueError("sweep needs at least one record (a text's gold graphs)")
    names = resolve_methods(methods)
    if train_records is not None and not train_records:
        train_records = None
    if train_records is not None:
        for record in train_records:
            if (record.num_layers != records[0].num_layers
                    or record.num_heads != records[0].num_heads):
                raise ValueError("train_records come from a differently shaped model")
    untrained = [n for n in names if CURVES[n].needs_training and train_records is None]
    if untrained:
        warnings.warn(
            f"skipping {', '.join(untrained)}: they are learned from training gold graphs; "
            "pass train_records=... (sparsefinder sweep: --train-passages N > 0)",
            UserWarning, stacklevel=2,
        )
        names = [n for n in names if n not in untrained]
        if not names:
            raise ValueError(f"no method of {untrained} can run without train_records")
    if any(CURVES[n].needs_projections for n in names) and projections is None:
        raise ValueError(f"methods {names} need learned projections; pass projections=...")
    if projections is not None:
        for record in records:
            projections.check_record(record)
    rows: list[tuple[str, PredictorSpec]] = []
    fitted: list[Any] = []
    skipped: list[str] = []
    for name in names:
        curve = CURVES[name]
        fit = curve.specs[0].fit(train_records) if curve.needs_training else None
        for spec in curve.specs:
            try:
                spec.build_layers(projections, records[0].num_layers, fit)
            except MethodUnavailable as error:  # e.g. no centroids stored for this B
                skipped.append(f"{name} {spec.params_json()}: {error}")
                continue
            rows.append((name, spec))
            fitted.append(fit)
    if skipped:
        warnings.warn(f"skipping {len(skipped)} configurations: " + "; ".join(skipped),
                      UserWarning, stacklevel=2)
    if not rows:
        raise ValueError(f"no configuration of {names} can be built with these projections")
    results, gold = score_specs(records, projections, [spec for _, spec in rows],
                                fitted=fitted, on_progress=on_progress)
    frame = pd.DataFrame([
        {
            "method": name,
            "params": spec.params_json(),
            "recall": result.recall,
            "sparsity": result.sparsity,
            **{name: result.extra.get(name, math.nan) for name in EXTRA_METRICS},
            "recall_per_layer": json.dumps([round(x, 6) for x in result.recall_per_layer]),
            "sparsity_per_layer": json.dumps([round(x, 6) for x in result.sparsity_per_layer]),
            "n_texts": result.n_texts,
            "block_recall": result.block_recall,
        }
        for (name, spec), result in zip(rows, results, strict=True)
    ])
    frame.attrs["gold_sparsity"] = float(gold.sparsity.mean())
    frame.attrs["gold_sparsity_per_layer"] = [float(x) for x in gold.sparsity]
    return frame


def curve_spec(name: str, params: Params) -> PredictorSpec:
    """The spec of curve ``name`` at ``params`` (a sweep row → the setting it stands for)."""
    curve = CURVES[name]
    window = curve.specs[0].window
    return PredictorSpec.of(curve.method, params, window=window,
                            global_tokens=curve.specs[0].global_tokens)


# ==================================================================== frontier


def _frontier_one(group: pd.DataFrame) -> pd.DataFrame:
    ordered = group.sort_values(["sparsity", "recall"], ascending=[False, False], kind="stable")
    keep, best = [], -math.inf
    for index, value in ordered["recall"].items():
        if value > best:  # nothing sparser (seen so far) reaches this recall
            keep.append(index)
            best = value
    return group.loc[keep].sort_values("sparsity", kind="stable")


def pareto_frontier(df: pd.DataFrame) -> pd.DataFrame:
    """Per method, the points no other point of that method dominates, by sparsity.

    A point is dominated when another has recall ≥ and sparsity ≥ with one of them strictly
    greater; of identical points one is kept.
    """
    if df.empty:
        return df.copy()
    parts = [_frontier_one(g) for _, g in df.groupby("method", sort=False)]
    return pd.concat(parts).reset_index(drop=True)


def recall_at_sparsity(
    df: pd.DataFrame, levels: Sequence[float] = SPARSITY_LEVELS, how: str = "step"
) -> pd.DataFrame:
    """Recall of each method's frontier at fixed sparsity levels → one row per method.

    ``how="step"`` (default): the best recall among frontier points with sparsity ≥ level —
    a recall some actual configuration reaches at that sparsity or better (conservative).
    ``how="linear"``: linear interpolation between the two frontier points around the level
    (the curve as drawn); for a level below every frontier point the step rule applies.
    Either way a level sparser than every point of a method gives NaN.
    """
    if how not in ("step", "linear"):
        raise ValueError(f"how must be 'step' or 'linear', got {how!r}")
    frontier = pareto_frontier(df)
    rows = []
    for method, group in frontier.groupby("method", sort=False):
        s = group["sparsity"].to_numpy()
        r = group["recall"].to_numpy()  # frontier: s ascending, r descending
        row: dict[str, Any] = {"method": method}
        for level in levels:
            above = s >= level
            value = float(r[above].max()) if above.any() else math.nan
            if how == "linear" and above.any() and (~above).any():
                i = int(above.argmax())  # first point at or above the level
                s0, s1, r0, r1 = s[i - 1], s[i], r[i - 1], r[i]
                value = float(r0 + (r1 - r0) * (level - s0) / (s1 - s0))
            row[f"recall@{level:g}"] = value
        rows.append(row)
    return pd.DataFrame(rows)


def metrics_at_sparsity(df: pd.DataFrame, levels: Sequence[float] = SPARSITY_LEVELS
                        ) -> pd.DataFrame:
    """Every metric of the configuration that gives each method's recall at each level.

    The configuration is the one the step rule of :func:`recall_at_sparsity` reads: the
    frontier point with the best recall among those with sparsity ≥ level. One row per
    (method, level) that some configuration reaches: ``method``, ``level``, ``params``,
    ``recall``, ``sparsity`` and the :data:`~sparsefinder.metrics.EXTRA_METRICS` present in
    ``df`` (how good the graph at that point is besides its recall).
    """
    extras = [name for name in EXTRA_METRICS if name in df.columns]
    rows = []
    for method, group in pareto_frontier(df).groupby("method", sort=False):
        for level in levels:
            above = group[group["sparsity"] >= level]
            if above.empty:
                continue
            best = above.loc[above["recall"].idxmax()]
            rows.append({"method": method, "level": level, "params": best["params"],
                         "recall": best["recall"], "sparsity": best["sparsity"],
                         **{name: best[name] for name in extras}})
    return pd.DataFrame(rows, columns=["method", "level", "params", "recall", "sparsity",
                                       *extras])


def matched_sparsity(df: pd.DataFrame, reference: str, other: str,
                     metrics: Sequence[str] = ("recall", "block_recall", "exact_fraction")
                     ) -> pd.DataFrame:
    """Curve ``other`` read at the sparsity of every point of curve ``reference``.

    One row per ``reference`` point (by sparsity, descending): its ``params``, ``sparsity``,
    each metric, and ``<metric>_other``: ``other``'s metric linearly interpolated between its
    two points around that sparsity (the curve as drawn; NaN outside its sparsity range).
    For a fair comparison of two predictors whose grids do not land on the same sparsities
    (e.g. learned vs pooled block projections at one number of key blocks).
    """
    import numpy as np

    ref = df[df["method"] == reference].sort_values("sparsity", ascending=False, kind="stable")
    oth = df[df["method"] == other].sort_values("sparsity", kind="stable")
    if ref.empty or oth.empty:
        missing = [name for name, part in ((reference, ref), (other, oth)) if part.empty]
        raise ValueError(f"no points of {', '.join(missing)} in these results")
    xs = oth["sparsity"].to_numpy(dtype=float)
    rows = []
    for _, row in ref.iterrows():
        inside = xs[0] <= row["sparsity"] <= xs[-1]
        out: dict[str, Any] = {"params": row["params"], "sparsity": row["sparsity"]}
        for name in metrics:
            out[name] = row[name]
            out[f"{name}_other"] = (float(np.interp(row["sparsity"], xs,
                                                    oth[name].to_numpy(dtype=float)))
                                    if inside else math.nan)
        rows.append(out)
    return pd.DataFrame(rows)
