"""Sparsity–recall sweeps over hyperparameter grids and their Pareto frontiers (paper §5–6).

A *method* is a registry entry (:data:`METHODS`): a grid of parameter dicts, a factory
``factory(params, projections, layer) -> Predictor``, the input its predictors read
(``inputs``: ``"projected"`` low-dimensional projections, ``"original"`` queries/keys of the
model, or ``"shape"`` only the sizes) and, for methods learned from training graphs, a
``fit(train_records) -> Factory`` that returns the factory to use.
Baselines (Longformer, BigBird, Reformer, …) are added with :func:`register_method` without
touching the sweep. :func:`sweep` predicts every head of every layer of every text for every
configuration, scores recall and sparsity with :mod:`sparsefinder.metrics` and macro-averages
them (texts, then heads, then layers). Each text is projected once and its projections are
reused by every configuration; predictors are built once per (configuration, layer).

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

- ``<method>+window``: the method ∪ ``Window(WITH_WINDOW_SIZE)``. The paper uses w = 11 (MT,
  ~35 tokens) or 25 (MLM, 512 tokens) in its per-head figures and w = 3 in its efficiency
  study; we use 3: it adds the diagonal and one neighbour each side, which recovers the
  local edges a 4-dimensional projection cannot place close, at a sparsity cost of only
  ~3/n.

:func:`recall_at_sparsity` reads a method's frontier at fixed sparsity levels; see its
docstring for the interpolation rule.
"""

from __future__ import annotations

import copy
import json
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from tqdm.auto import tqdm

from sparsefinder.graphs import AttentionRecord
from sparsefinder.metrics import GraphScores, macro_average, recall, sparsity
from sparsefinder.predictors import (
    BigBird,
    Distance,
    Longformer,
    NoDiagonal,
    Quantization,
    Reformer,
    Routing,
    StaticMask,
    TopK,
    Union,
    Window,
)
from sparsefinder.predictors.base import Predictor
from sparsefinder.projections import HeadProjections, ProjectionsError

Params = dict[str, Any]
Factory = Callable[[Params, HeadProjections | None, int], Predictor]
#: ``fit(train_records) -> Factory``: learns from training gold graphs, returns the factory.
Fitter = Callable[[Sequence[AttentionRecord]], Factory]
INPUTS = ("projected", "original", "shape")

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


@dataclass(frozen=True)
class MethodSpec:
    """One sweepable method: its grid, how to build a predictor, and what it needs.

    ``inputs``: what ``predict`` gets — ``"projected"`` (the learned projections of q/k),
    ``"original"`` (the model's q/k, e.g. the top-k oracle) or ``"shape"`` (only sizes are
    read; given the original q/k). ``fit``: for methods learned from training gold graphs,
    ``fit(train_records)`` returns the factory to use instead of ``factory``.
    """

    grid: list[Params]
    factory: Factory
    inputs: str = "projected"
    fit: Fitter | None = None

    @property
    def needs_projection(self) -> bool:
        return self.inputs == "projected"

    @property
    def uses_projections(self) -> bool:
        return self.inputs == "projected"

    @property
    def needs_training(self) -> bool:
        return self.fit is not None


METHODS: dict[str, MethodSpec] = {}

#: Named groups for ``--methods``; "all" is every registered method.
GROUPS: dict[str, list[str]] = {
    "sparsefinder": [
        "distance", "kmeans", "quantization",
        "distance+window", "kmeans+window", "quantization+window", "window",
    ],
    "baselines": [
        "longformer", "bigbird", "reformer", "reformer+window", "routing", "routing+window",
        "topk", "sparsebert-dams", "sparsebert-damu", "distance-nodiag",
    ],
}


def register_method(
    name: str,
    grid: Iterable[Params],
    factory: Factory,
    *,
    needs_projection: bool = True,
    inputs: str | None = None,
    fit: Fitter | None = None,
    replace: bool = False,
) -> MethodSpec:
    """Add a method to :data:`METHODS` (e.g. a baseline); returns its spec.

    ``inputs`` (see :class:`MethodSpec`) defaults to ``"projected"`` if ``needs_projection``
    else ``"original"``.
    """
    if inputs is None:
        inputs = "projected" if needs_projection else "original"
    if inputs not in INPUTS:
        raise ValueError(f"inputs must be one of {INPUTS}, got {inputs!r}")
    if not name or "," in name:
        raise ValueError(f"method name must be non-empty without commas, got {name!r}")
    if name in METHODS and not replace:
        raise ValueError(f"method {name!r} is already registered; pass replace=True")
    grid = [dict(p) for p in grid]
    if not grid:
        raise ValueError(f"method {name!r} needs at least one parameter dict in its grid")
    spec = MethodSpec(grid=grid, factory=factory, inputs=inputs, fit=fit)
    METHODS[name] = spec
    return spec


def _require(projections: HeadProjections | None, what: str) -> HeadProjections:
    if projections is None:
        raise ValueError(f"{what} needs learned projections; pass projections=...")
    return projections


def _distance(p: Params, projections: HeadProjections | None, layer: int) -> Predictor:
    return Distance(float(p["threshold"]))


def _kmeans(p: Params, projections: HeadProjections | None, layer: int) -> Predictor:
    proj = _require(projections, "k-means")
    return proj.kmeans(layer, int(p["n_clusters"]), top_k=int(p["top_k"]))


def _quantization(p: Params, projections: HeadProjections | None, layer: int) -> Predictor:
    return Quantization(int(p["bins"]))


def _window(p: Params, projections: HeadProjections | None, layer: int) -> Predictor:
    return Window(int(p["window"]))


def with_window(factory: Factory, size: int = WITH_WINDOW_SIZE) -> Factory:
    """A factory for ``factory``'s predictor ∪ ``Window(size)``."""

    def build(p: Params, projections: HeadProjections | None, layer: int) -> Predictor:
        return Union(factory(p, projections, layer), Window(size))

    return build


def _longformer(p: Params, projections: HeadProjections | None, layer: int) -> Predictor:
    return Longformer(WITH_WINDOW_SIZE, int(p["n_global"]), seed=layer)


def _bigbird(p: Params, projections: HeadProjections | None, layer: int) -> Predictor:
    return BigBird(WITH_WINDOW_SIZE, int(p["n_random"]), seed=layer)


def _reformer(p: Params, projections: HeadProjections | None, layer: int) -> Predictor:
    return Reformer(int(p["n_buckets"]), seed=layer)


def _routing(p: Params, projections: HeadProjections | None, layer: int) -> Predictor:
    return Routing(int(p["n_clusters"]), seed=layer)


def _topk(p: Params, projections: HeadProjections | None, layer: int) -> Predictor:
    return TopK(int(p["k"]))


def _distance_nodiag(p: Params, projections: HeadProjections | None, layer: int) -> Predictor:
    return NoDiagonal(_distance(p, projections, layer))


def _needs_training(p: Params, projections: HeadProjections | None, layer: int) -> Predictor:
    raise ValueError("this method is learned from training graphs; pass train_records=...")


def static_mask_fitter(kind: str) -> Fitter:
    """``fit`` for SparseBERT's static mask: one ``StaticMask(kind)`` fitted per layer on the
    training gold graphs; each grid point gets a copy re-targeted to its sparsity."""

    def fit(train_records: Sequence[AttentionRecord]) -> Factory:
        causal = train_records[0].causal
        fitted = [
            StaticMask(kind, STATIC_MASK_GRID[0]).fit(
                [r.layers[layer].gold for r in train_records], causal=causal
            )
            for layer in range(train_records[0].num_layers)
        ]

        def build(p: Params, projections: HeadProjections | None, layer: int) -> Predictor:
            # A shallow copy shares the learned (read-only) tensors; its keep() cache is keyed
            # by the target, so the copy recomputes it for its own target.
            mask = copy.copy(fitted[layer])
            mask.target_sparsity = float(p["target_sparsity"])
            mask._check_target()
            return mask

        return build

    return fit


ROUTED_BUDGET_GRID = [
    {"n_clusters": b, "budget": f} for b in (64, 128)
    for f in (0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.12, 0.15, 0.2, 0.25, 0.3)
]
ROUTED_TOP_GRID = [{"n_clusters": 128, "mode": "top", "n_routes": t}
                   for t in (2, 4, 6, 8, 9, 10, 11, 12, 14, 16, 20, 24, 32)]
TOPP_GRID = [0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 1.0]


def _routed(p: Params, projections: HeadProjections | None, layer: int) -> Predictor:
    from sparsefinder.key_codebooks import CodebooksError, bundled_codebooks

    try:
        if projections is None:  # its model_id tells which model's codebooks apply
            raise CodebooksError("kmeans-routed needs the model's projections to know its "
                                 "model id; pass projections=...")
        books = bundled_codebooks()
        if projections.model_id != books.model_id:
            raise CodebooksError(
                f"the bundled key codebooks are for {books.model_id!r}, not "
                f"{projections.model_id!r}; fit some with `sparsefinder fit-codebooks`"
            )
        params = {key: value for key, value in p.items() if key != "n_clusters"}
        return books.predictor(layer, int(p["n_clusters"]), **params)
    except CodebooksError as error:  # the sweep skips this configuration with a warning
        raise ProjectionsError(str(error)) from error


def _topp(p: Params, projections: HeadProjections | None, layer: int) -> Predictor:
    from sparsefinder.predictors.topp import TopP

    return TopP(float(p["p"]))


def _register_defaults() -> None:
    base = {
        "distance": ([{"threshold": t} for t in DISTANCE_GRID], _distance),
        "kmeans": ([{"n_clusters": b, "top_k": 1} for b in CLUSTER_GRID], _kmeans),
        "quantization": ([{"bins": b} for b in QUANTIZATION_BINS], _quantization),
    }
    for name, (grid, factory) in base.items():
        register_method(name, grid, factory, replace=True)
        register_method(f"{name}+window", grid, with_window(factory), replace=True)
    top2 = [{"n_clusters": b, "top_k": 2} for b in CLUSTER_GRID if b >= 4]
    register_method("kmeans-top2", top2, _kmeans, replace=True)
    register_method("kmeans-top2+window", top2, with_window(_kmeans), replace=True)
    register_method(
        "window", [{"window": w} for w in WINDOW_GRID + WINDOW_GRID_LONG], _window,
        inputs="shape", replace=True,
    )
    # Baselines (see the module docstring).
    register_method("longformer", [{"n_global": g} for g in LONGFORMER_GRID], _longformer,
                    inputs="shape", replace=True)
    register_method("bigbird", [{"n_random": r} for r in BIGBIRD_GRID], _bigbird,
                    inputs="shape", replace=True)
    for name, grid, factory in (
        ("reformer", [{"n_buckets": b} for b in REFORMER_GRID], _reformer),
        ("routing", [{"n_clusters": c} for c in ROUTING_GRID], _routing),
    ):
        register_method(name, grid, factory, replace=True)
        register_method(f"{name}+window", grid, with_window(factory), replace=True)
    # An oracle: keeps each query's k best keys of the full QKᵀ on the ORIGINAL vectors.
    register_method("topk", [{"k": k} for k in TOPK_GRID], _topk, inputs="original",
                    replace=True)
    for name, kind in (("sparsebert-dams", "structured"), ("sparsebert-damu", "unstructured")):
        register_method(
            name, [{"target_sparsity": t} for t in STATIC_MASK_GRID], _needs_training,
            inputs="shape", fit=static_mask_fitter(kind), replace=True,
        )
    register_method("distance-nodiag", [{"threshold": t} for t in DISTANCE_GRID],
                    _distance_nodiag, replace=True)
    # Issue 10: k-means on KEYS, queries routed by q·c (predictors/routed_kmeans.py) and
    # the top-p oracle (predictors/topp.py); grids chosen on the TRAIN split.
    register_method("kmeans-routed", ROUTED_BUDGET_GRID, _routed, inputs="original",
                    replace=True)
    register_method("kmeans-routed-top", ROUTED_TOP_GRID, _routed, inputs="original",
                    replace=True)
    register_method("topp", [{"p": p} for p in TOPP_GRID], _topp, inputs="original",
                    replace=True)


_register_defaults()


def resolve_methods(spec: str | Sequence[str]) -> list[str]:
    """``"sparsefinder"``, ``"all"`` or a comma list (groups allowed) → method names."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for item in (s.strip() for s in items):
        if not item:
            continue
        expanded = list(METHODS) if item == "all" else GROUPS.get(item, [item])
        for name in expanded:
            if name not in METHODS:
                known = ", ".join(["all", *GROUPS, *METHODS])
                raise ValueError(f"unknown method {name!r}; choose from: {known}")
            if name not in names:
                names.append(name)
    if not names:
        raise ValueError("no methods given; use 'sparsefinder', 'all' or a comma list")
    return names


# ==================================================================== sweep


def _params_json(params: Params) -> str:
    return json.dumps(params, sort_keys=True)


def sweep(
    records: Sequence[AttentionRecord],
    projections: HeadProjections | None,
    methods: str | Sequence[str] = "sparsefinder",
    *,
    train_records: Sequence[AttentionRecord] | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Score every configuration of ``methods`` on ``records`` → one row per configuration.

    Each method's predictors get the input it declares (:class:`MethodSpec` ``inputs``):
    the projections of q/k, or the original q/k (e.g. ``topk``) — also when other methods in
    the same sweep need projections. Methods learned from training graphs (``fit``, e.g. the
    SparseBERT static masks) are fitted once on ``train_records`` (gold graphs of TRAINING
    texts, never the evaluation ones); without them they are skipped with a warning.

    Columns: ``method``, ``params`` (JSON), ``recall``, ``sparsity`` (macro averages),
    ``recall_per_layer``/``sparsity_per_layer`` (JSON lists), ``n_texts``. The gold sparsity
    (overall and per layer) is in ``df.attrs``.
    """
    if not records:
        raise ValueError("sweep needs at least one record (a text's gold graphs)")
    names = resolve_methods(methods)
    num_layers = records[0].num_layers
    for record in records:
        if record.num_layers != num_layers:
            raise ValueError("records come from models with different numbers of layers")
    if train_records is not None and not train_records:
        train_records = None
    if train_records is not None:
        for record in train_records:
            if record.num_layers != num_layers or record.num_heads != records[0].num_heads:
                raise ValueError("train_records come from a differently shaped model")
    untrained = [n for n in names if METHODS[n].needs_training and train_records is None]
    if untrained:
        warnings.warn(
            f"skipping {', '.join(untrained)}: they are learned from training gold graphs; "
            "pass train_records=... (sparsefinder sweep: --train-passages N > 0)",
            UserWarning, stacklevel=2,
        )
        names = [n for n in names if n not in untrained]
        if not names:
            raise ValueError(f"no method of {untrained} can run without train_records")
    needs_projection = any(METHODS[n].needs_projection for n in names)
    if needs_projection:
        _require(projections, f"methods {names}")
    if projections is not None:
        for record in records:
            projections.check_record(record)
    configs, predictors, projected_input, skipped = [], [], [], []
    for name in names:
        spec = METHODS[name]
        factory = spec.fit(train_records) if spec.fit is not None else spec.factory
        for params in spec.grid:
            try:
                built = [factory(params, projections, layer) for layer in range(num_layers)]
            except ProjectionsError as error:  # e.g. no centroids stored for this B
                skipped.append(f"{name} {_params_json(params)}: {error}")
                continue
            configs.append((name, params))
            predictors.append(built)
            projected_input.append(spec.needs_projection)
    if skipped:
        warnings.warn(f"skipping {len(skipped)} configurations: " + "; ".join(skipped),
                      UserWarning, stacklevel=2)
    if not configs:
        raise ValueError(f"no configuration of {names} can be built with these projections")
    scores: list[list[GraphScores]] = [[] for _ in configs]
    gold_scores: list[GraphScores] = []
    for record in tqdm(records, desc="sweep", unit="text", disable=not progress):
        projected = projections.project_record(record) if needs_projection else None
        recalls: list[list[torch.Tensor]] = [[] for _ in configs]
        sparsities: list[list[torch.Tensor]] = [[] for _ in configs]
        for layer, graph in enumerate(record.layers):
            original = (graph.queries, graph.keys)
            with torch.inference_mode():
                for c, per_layer in enumerate(predictors):
                    q, k = projected[layer] if projected_input[c] else original
                    mask = per_layer[layer].predict(q, k, causal=record.causal)
                    recalls[c].append(recall(mask, graph.gold))
                    sparsities[c].append(sparsity(mask, causal=record.causal))
        gold = torch.stack([sparsity(g.gold, causal=record.causal) for g in record.layers])
        gold_scores.append(GraphScores(recall=torch.ones_like(gold), sparsity=gold))
        for c in range(len(configs)):
            scores[c].append(
                GraphScores(recall=torch.stack(recalls[c]), sparsity=torch.stack(sparsities[c]))
            )
    rows = []
    for (name, params), per_text in zip(configs, scores, strict=True):
        avg = macro_average(per_text)
        rows.append({
            "method": name,
            "params": _params_json(params),
            "recall": avg["recall"],
            "sparsity": avg["sparsity"],
            "recall_per_layer": json.dumps([round(float(x), 6) for x in avg["recall_per_layer"]]),
            "sparsity_per_layer": json.dumps(
                [round(float(x), 6) for x in avg["sparsity_per_layer"]]
            ),
            "n_texts": int(avg["n_texts"]),
        })
    df = pd.DataFrame(rows)
    gold_avg = macro_average(gold_scores)
    df.attrs["gold_sparsity"] = float(gold_avg["sparsity"])
    df.attrs["gold_sparsity_per_layer"] = [float(x) for x in gold_avg["sparsity_per_layer"]]
    return df


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


# ==================================================================== figure

_PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
            "#17becf", "#bcbd22", "#7f7f7f"]


def pareto_figure(
    df: pd.DataFrame, gold_sparsity: float | None = None, title: str = "Sparsity–recall"
) -> go.Figure:
    """All points (faint) and each method's frontier (line); gold sparsity as a dashed line.

    ``<method>+window`` shares ``<method>``'s colour with a dashed line. Hover shows params.
    """
    fig = go.Figure()
    families: dict[str, str] = {}
    frontier = pareto_frontier(df)
    for method in dict.fromkeys(df["method"]):
        family = method.split("+")[0]
        color = families.setdefault(family, _PALETTE[len(families) % len(_PALETTE)])
        dash = "dash" if "+" in method else "solid"
        points = df[df["method"] == method]
        front = frontier[frontier["method"] == method]
        hover = "%{customdata}<br>sparsity=%{x:.4f}<br>recall=%{y:.4f}<extra>" + method + "</extra>"
        fig.add_trace(go.Scatter(
            x=points["sparsity"], y=points["recall"], customdata=points["params"],
            mode="markers", marker={"color": color, "opacity": 0.35, "size": 6},
            legendgroup=method, showlegend=False, name=f"{method} (all)",
            hovertemplate=hover,
        ))
        fig.add_trace(go.Scatter(
            x=front["sparsity"], y=front["recall"], customdata=front["params"],
            mode="lines+markers", line={"color": color, "dash": dash},
            marker={"color": color, "size": 8}, legendgroup=method, name=method,
            hovertemplate=hover,
        ))
    if gold_sparsity is None:
        gold_sparsity = df.attrs.get("gold_sparsity")
    if gold_sparsity is not None:
        fig.add_vline(
            x=gold_sparsity, line_dash="dash", line_color="black",
            annotation_text=f"gold sparsity {gold_sparsity:.3f}",
            annotation_position="bottom left",
        )
    fig.update_layout(
        title=title, xaxis_title="sparsity (1 − |Ĝ| / nm)", yaxis_title="recall (|Ĝ ∩ G| / |G|)",
        xaxis_range=[0, 1.0], yaxis_range=[0, 1.02], template="plotly_white",
        legend={"title": "method (frontier)"},
    )
    return fig


def write_figure_html(fig: go.Figure, path: str | Path) -> Path:
    """Self-contained HTML (plotly.js inlined, so it opens offline)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    return path
