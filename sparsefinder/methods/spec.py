"""From hyperparameters to a predictor, in one place: the method registry and ``PredictorSpec``.

A *method* (:class:`Method`) is a predictor family registered once in :data:`METHODS`: how to
build its predictor for one layer from a parameter dict, which parameters it takes, and what
its predictor reads (``inputs``):

- ``"projected"``: the learned low-dimensional projections of q/k (Sparsefinder's methods,
  Reformer, Routing) — the model must have a projections file;
- ``"original"``: the model's own q/k (the Top-k oracle, which computes the full QKᵀ);
- ``"shape"``: only the sizes (window, global tokens, Longformer, BigBird, static masks).

Methods learned from training *graphs* (SparseBERT's static masks) declare ``fit``; it runs
once on training records and its result is handed to ``build``.

A :class:`PredictorSpec` is a value — ``(method, params)`` plus the window and global-token
patterns united with it (paper §4.7) — that the URL state of the app, the sweep grids and the
CLI all turn into predictors through :meth:`PredictorSpec.build`. :func:`predict_record` then
runs the per-layer predictors of one record on the inputs they declared; the numbers a user
sees in the app, in a sweep CSV and in the CLI come from this one path.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from sparsefinder.attention.masks import layer_allowed
from sparsefinder.predictors import (
    BigBird,
    BlockSparsefinder,
    Distance,
    GlobalTokens,
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

if TYPE_CHECKING:
    from sparsefinder.data.records import AttentionRecord
    from sparsefinder.projections.heads import HeadProjections

Inputs = Literal["projected", "original", "shape"]
INPUTS: tuple[str, ...] = ("projected", "original", "shape")
GLOBAL_CHOICES: tuple[str, ...] = ("first", "last")
#: Window of the Longformer / BigBird baselines (paper's efficiency study uses w = 3).
BASELINE_WINDOW = 3
Params = Mapping[str, Any]


@dataclass(frozen=True)
class BuildContext:
    """What a method's ``build`` may use besides its parameters.

    ``layer`` seeds the random baselines (``seed = layer``) and selects per-layer learned
    parts; ``fitted`` is what the method's ``fit`` returned on training records.
    """

    projections: HeadProjections | None
    layer: int
    fitted: Any = None


Builder = Callable[[Params, BuildContext], Predictor | None]
Fitter = Callable[[Sequence["AttentionRecord"]], Any]


@dataclass(frozen=True)
class Method:
    """One predictor family: its parameters, its builder and what its predictor reads."""

    name: str
    label: str
    params: tuple[str, ...]
    build: Builder
    inputs: Inputs = "projected"
    fit: Fitter | None = None
    oracle: bool = False  # needs the full score matrix: shown as a bound, saves no work

    @property
    def needs_projections(self) -> bool:
        return self.inputs == "projected"


#: The one registry of predictor families, by name.
METHODS: dict[str, Method] = {}


def register_method(method: Method, *, replace: bool = False) -> Method:
    """Add a predictor family to :data:`METHODS` (e.g. a new baseline); returns it."""
    if method.inputs not in INPUTS:
        raise ValueError(f"inputs must be one of {INPUTS}, got {method.inputs!r}")
    if not method.name or "," in method.name or "+" in method.name:
        raise ValueError(f"method name must be non-empty without ',' or '+', got {method.name!r}")
    if method.name in METHODS and not replace:
        raise ValueError(f"method {method.name!r} is already registered; pass replace=True")
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    """The registered method ``name``, or a ValueError listing the known ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; choose from: {', '.join(METHODS)}") from None


def _require_projections(context: BuildContext, what: str) -> HeadProjections:
    if context.projections is None:
        raise ValueError(
            f"{what} needs learned projections for this model; train them with "
            "`sparsefinder train --model NAME --out DIR` and pass the projections file"
        )
    return context.projections


def _kmeans(p: Params, c: BuildContext) -> Predictor:
    projections = _require_projections(c, "k-means")
    return projections.kmeans(c.layer, int(p["n_clusters"]), top_k=int(p.get("top_k", 1)))


def _routed_kmeans(mode: str) -> Builder:
    """Routed k-means (issue 10) from the bundled key codebooks of the projections' model."""

    def build(p: Params, c: BuildContext) -> Predictor:
        from sparsefinder.projections.heads import ProjectionsError
        from sparsefinder.projections.key_codebooks import CodebooksError, bundled_codebooks

        try:
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
        except CodebooksError as error:  # sweeps skip such a configuration with a warning
            raise ProjectionsError(str(error)) from error

    return build


def _topp(p: Params, c: BuildContext) -> Predictor:
    from sparsefinder.predictors.topp import TopP

    return TopP(float(p["p"]))


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
    if c.fitted is None:
        raise ValueError("this method is learned from training graphs; pass train_records=...")
    # A shallow copy shares the learned (read-only) tensors; its keep() cache is keyed by the
    # target, so the copy recomputes it for its own target.
    mask = copy.copy(c.fitted[c.layer])
    mask.target_sparsity = float(p["target_sparsity"])
    mask._check_target()
    return mask


def _quest(p: Params, c: BuildContext) -> Predictor:
    from sparsefinder.predictors.quest import QuestPages

    return QuestPages(int(p["pages"]), int(p["page_size"]))


def _training_graphs(
    train_records: Sequence[AttentionRecord], what: str
) -> Sequence[AttentionRecord]:
    """``train_records``, or the error a learned method gives when it has none."""
    if not train_records:
        raise ValueError(f"{what} are learned from training graphs; pass train_records=...")
    return train_records


def _hash_codes_fit(train_records: Sequence[AttentionRecord]) -> Any:
    from sparsefinder.predictors.hash_codes import fit_hash_codes

    return fit_hash_codes(_training_graphs(train_records, "hashattention codes"))


def _hash_codes(p: Params, c: BuildContext) -> Predictor:
    from sparsefinder.predictors.hash_codes import HammingCodes

    if c.fitted is None:
        raise ValueError("this method is learned from training graphs; pass train_records=...")
    w_query, w_key = c.fitted[c.layer]
    return HammingCodes(w_query, w_key, int(p["max_distance"]))


def _block_projections_fit(train_records: Sequence[AttentionRecord]) -> Any:
    from sparsefinder.projections.blocks import train_block_projections_by_size

    return train_block_projections_by_size(
        _training_graphs(train_records, "block-learned projections"))


def _learned_block(p: Params, c: BuildContext) -> Predictor:
    """``fitted``: block projections by block size (the fit's result or
    ``block_projections.bundled_block_projections_by_size``), or one size's projections."""
    from sparsefinder.predictors.block import LearnedBlockSparsefinder
    from sparsefinder.projections.blocks import check_block_projections

    if c.fitted is None:
        raise ValueError("this method is learned from training graphs; pass train_records=... "
                         "(or the bundled block projections as fitted=...)")
    block = int(p["block"])
    fitted = c.fitted.get(block) if isinstance(c.fitted, dict) else c.fitted
    if fitted is None:
        raise ValueError(f"no block projections for blocks of {block} tokens (fitted: "
                         f"{sorted(c.fitted)}); train them with `sparsefinder "
                         f"fit-block-projections --block {block}`")
    check_block_projections(fitted, block)
    return LearnedBlockSparsefinder(fitted.weight[c.layer], block, int(p["n_blocks"]))


def _register_defaults() -> None:
    defaults = [
        Method("distance", "Distance (t)", ("threshold",),
               lambda p, c: Distance(float(p["threshold"]))),
        Method("quantization", "Quantization (β)", ("bins",),
               lambda p, c: Quantization(int(p["bins"]))),
        Method("kmeans", "k-means (B, k)", ("n_clusters", "top_k"), _kmeans),
        Method("fixed", "Window / global only", (), lambda p, c: None, inputs="shape"),
        Method("window", "Window (w)", ("window",), lambda p, c: Window(int(p["window"])),
               inputs="shape"),
        Method("longformer", "Longformer", ("n_global",),
               lambda p, c: Longformer(BASELINE_WINDOW, int(p["n_global"]), seed=c.layer),
               inputs="shape"),
        Method("bigbird", "BigBird", ("n_random",),
               lambda p, c: BigBird(BASELINE_WINDOW, int(p["n_random"]), seed=c.layer),
               inputs="shape"),
        Method("reformer", "Reformer (LSH)", ("n_buckets",),
               lambda p, c: Reformer(int(p["n_buckets"]), seed=c.layer)),
        Method("routing", "Routing (k-means)", ("n_clusters",),
               lambda p, c: Routing(int(p["n_clusters"]), seed=c.layer)),
        Method("topk", "Top-k (ORACLE)", ("k",), lambda p, c: TopK(int(p["k"])),
               inputs="original", oracle=True),
        Method("sparsebert-dams", "SparseBERT DAMs (static)", ("target_sparsity",),
               _static_mask, inputs="shape", fit=_static_mask_fitter("structured")),
        Method("sparsebert-damu", "SparseBERT DAMu (static)", ("target_sparsity",),
               _static_mask, inputs="shape", fit=_static_mask_fitter("unstructured")),
        Method("distance-nodiag", "Distance, no diagonal (SparseBERT)", ("threshold",),
               lambda p, c: NoDiagonal(Distance(float(p["threshold"])))),
        # Issue 10 (buckets): keys clustered offline, queries routed by q·c; top-p oracle.
        Method("kmeans-routed", "Routed k-means (B, key budget)", ("n_clusters", "budget"),
               _routed_kmeans("budget"), inputs="original"),
        Method("kmeans-routed-top", "Routed k-means (B, routes)", ("n_clusters", "n_routes"),
               _routed_kmeans("top"), inputs="original"),
        Method("topp", "Top-p of entmax (ORACLE)", ("p",), _topp, inputs="original",
               oracle=True),
        # Issue 14: long-context baselines (training-free page bounds; learned hash codes).
        Method("quest", "Quest pages (min/max key bounds)", ("page_size", "pages"), _quest,
               inputs="original"),
        Method("hashattention", "HashAttention (learned bit codes)", ("max_distance",),
               _hash_codes, inputs="original", fit=_hash_codes_fit),
        # Issue 13: block Sparsefinder (paper §6): nearest key blocks (and single keys) of
        # pooled projected query blocks; what sparsefinder.attention.block_sparse computes
        # attention on.
        Method("block", "Block Sparsefinder (block, key blocks, single keys)",
               ("block", "n_blocks", "n_keys"),
               lambda p, c: BlockSparsefinder(int(p["block"]), int(p["n_blocks"]),
                                              int(p["n_keys"]))),
        # The same selection (n_keys = 0) scored by projections learned on the pooled blocks
        # themselves (sparsefinder.projections.blocks), fitted on TRAIN gold graphs.
        Method("block-learned", "Block Sparsefinder, learned block projections",
               ("block", "n_blocks"), _learned_block, inputs="original",
               fit=_block_projections_fit),
    ]
    from sparsefinder.calibration.curves import calibrated_methods, fitted_build

    labels = {"distance-calibrated": "Distance, per-head t for a target sparsity",
              "distance-budget": "Distance, per-head t, sparsity budget across heads",
              "distance-calibrated-recall": "Distance, per-head t for a target recall",
              "rowfrac-calibrated": "Nearest keys, per-head row fraction for a target",
              "rowfrac-budget": "Nearest keys, row fractions, sparsity budget",
              "window-budget": "Window, per-head w, sparsity budget",
              "quantization-budget": "Quantization, per-head β, sparsity budget",
              "kmeans-budget": "k-means, per-head (B, k), sparsity budget",
              "kmeans-routed-budget": "Routed k-means, per-head key budget, sparsity budget"}
    from sparsefinder.calibration.grid import HEAD_GRIDS

    raw_inputs = {method.name: method.inputs for method in defaults}
    for name, grid, fitter in calibrated_methods():
        # a per-head setting of a raw family reads what that family reads
        inputs = raw_inputs[HEAD_GRIDS[name][0]] if name in HEAD_GRIDS else "projected"
        defaults.append(Method(name, labels.get(name, name), tuple(grid[0]), fitted_build,
                               inputs=inputs, fit=fitter))
    for method in defaults:
        register_method(method, replace=True)


_register_defaults()


@dataclass(frozen=True)
class PredictorSpec:
    """``(method, params)`` ∪ window ∪ global tokens: a hashable value naming one predictor.

    Build it with :meth:`of`; ``params`` is stored as sorted ``(name, value)`` pairs so equal
    settings compare and hash equal (it keys caches). ``window`` 0 and no ``global_tokens``
    add nothing.
    """

    method: str
    params: tuple[tuple[str, Any], ...] = ()
    window: int = 0
    global_tokens: tuple[str, ...] = ()
    _method: Method = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        method = get_method(self.method)
        missing = [name for name in method.params if name not in dict(self.params)]
        unknown = [name for name, _ in self.params if name not in method.params]
        if missing or unknown:
            raise ValueError(
                f"method {self.method!r} takes parameters {list(method.params)}; "
                f"missing {missing}, unknown {unknown}"
            )
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            raise ValueError(f"window must be an integer >= 0, got {self.window!r}")
        bad = [g for g in self.global_tokens if g not in GLOBAL_CHOICES]
        if bad:
            raise ValueError(f"global_tokens must be among {GLOBAL_CHOICES}, got {bad}")
        object.__setattr__(self, "_method", method)

    @classmethod
    def of(cls, method: str, params: Params | None = None, *, window: int = 0,
           global_tokens: Sequence[str] = ()) -> PredictorSpec:
        """A spec from a parameter dict, e.g. ``PredictorSpec.of("distance", {"threshold": 1})``."""
        chosen = tuple(g for g in GLOBAL_CHOICES if g in set(global_tokens))
        return cls(method, tuple(sorted(dict(params or {}).items())), int(window), chosen)

    @property
    def key(self) -> tuple:
        """Plain values that name the spec (for caches that pickle or hash their keys)."""
        return (self.method, self.params, self.window, self.global_tokens)

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def inputs(self) -> Inputs:
        """What the built predictor reads (window/global patterns only read shapes)."""
        return self._method.inputs

    @property
    def needs_projections(self) -> bool:
        return self._method.needs_projections

    @property
    def needs_training(self) -> bool:
        return self._method.fit is not None

    @property
    def oracle(self) -> bool:
        return self._method.oracle

    def params_json(self) -> str:
        """The method's parameters as sorted JSON (the ``params`` column of a sweep)."""
        return json.dumps(self.param_dict, sort_keys=True)

    def label(self) -> str:
        """Short human label, e.g. ``"kmeans n_clusters=8 top_k=1 ∪ window 3"``."""
        pieces = []
        if self.method != "fixed":
            values = " ".join(f"{k}={_fmt(v)}" for k, v in self.params)
            pieces.append(f"{self.method} {values}".strip())
        if self.window:
            pieces.append(f"window {self.window}")
        if self.global_tokens:
            pieces.append("global " + "+".join(self.global_tokens))
        return " ∪ ".join(pieces) or "empty graph"

    def build(self, projections: HeadProjections | None, layer: int,
              fitted: Any = None) -> Predictor | None:
        """The predictor of one layer (``None``: nothing switched on, the empty graph)."""
        context = BuildContext(projections=projections, layer=layer, fitted=fitted)
        parts: list[Predictor] = []
        base = self._method.build(self.param_dict, context)
        if base is not None:
            parts.append(base)
        if self.window > 0:
            parts.append(Window(self.window))
        if self.global_tokens:
            parts.append(GlobalTokens(first="first" in self.global_tokens,
                                      last="last" in self.global_tokens))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else Union(*parts)

    def build_layers(self, projections: HeadProjections | None, num_layers: int,
                     fitted: Any = None) -> list[Predictor | None]:
        """:meth:`build` for every layer."""
        return [self.build(projections, layer, fitted) for layer in range(num_layers)]

    def fit(self, train_records: Sequence[AttentionRecord] | None) -> Any:
        """Run the method's ``fit`` on training records (None for methods without one)."""
        if self._method.fit is None:
            return None
        return self._method.fit(list(train_records or []))


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class RecordInputs:
    """The vectors one record offers to predictors, per layer and per declared ``inputs``.

    Original q/k come from the record; projected ones are computed on first use with the
    projections (after :meth:`HeadProjections.check_record`) and kept, so every setting that
    reads them — a slider move, a sweep grid point — reuses one projection per layer.
    """

    def __init__(self, record: AttentionRecord, projections: HeadProjections | None = None):
        if projections is not None:
            projections.check_record(record)
        self.record = record
        self.projections = projections
        self._projected: dict[int, tuple[Tensor, Tensor]] = {}

    @property
    def has_projections(self) -> bool:
        return self.projections is not None

    def projected(self, layer: int) -> tuple[Tensor, Tensor]:
        """``(q', k')`` of one layer, each (heads, n|m, r) float32."""
        if self.projections is None:
            raise ValueError(
                "this method needs learned projections for this model; train them with "
                "`sparsefinder train --model NAME --out DIR` and pass the projections file"
            )
        if layer not in self._projected:
            graph = self.record.layers[layer]
            with torch.inference_mode():
                self._projected[layer] = (
                    self.projections.project_queries(layer, graph.queries).float().contiguous(),
                    self.projections.project_keys(layer, graph.keys).float().contiguous(),
                )
        return self._projected[layer]

    def get(self, layer: int, inputs: str) -> tuple[Tensor, Tensor]:
        """The (q, k) a predictor declaring ``inputs`` reads on ``layer``."""
        if inputs == "projected":
            return self.projected(layer)
        graph = self.record.layers[layer]
        return graph.queries, graph.keys


@torch.inference_mode()
def predict_record(spec: PredictorSpec, predictors: Sequence[Predictor | None],
                   vectors: RecordInputs) -> list[Tensor]:
    """Bool (heads, n, m) masks of every layer of one record, from per-layer predictors built
    from ``spec`` (see :meth:`PredictorSpec.build_layers`); an absent predictor predicts the
    empty graph. A sliding-window layer's prediction is cut to its window, as the model's
    own mask cuts its attention."""
    record = vectors.record
    if len(predictors) != record.num_layers:
        raise ValueError(f"got predictors for {len(predictors)} layers, the record has "
                         f"{record.num_layers}")
    masks = []
    for layer, predictor in enumerate(predictors):
        if predictor is None:
            masks.append(torch.zeros_like(record.layers[layer].gold))
            continue
        q, k = vectors.get(layer, spec.inputs)
        mask = predictor.predict(q, k, causal=record.causal)
        window = record.layers[layer].sliding_window
        if window:  # a local layer: keys outside its window can never be attended to
            n, m = mask.shape[-2:]
            mask = mask & layer_allowed(n, m, causal=record.causal, sliding_window=window,
                                        device=mask.device)
        masks.append(mask)
    return masks
