"""From hyperparameters to predictors, in one path: ``PredictorSpec`` and ``predict_record``.

A :class:`PredictorSpec` is a value — a registered family (:mod:`sparsefinder.methods.registry`)
with its parameters, plus the window and global-token patterns united with it (paper §4.7) —
that the URL state of the app, the sweep grids and the CLI all turn into predictors through
:meth:`PredictorSpec.build`. :class:`RecordInputs` offers a record's vectors as each family
declared it reads them, and :func:`predict_record` runs the per-layer predictors of one record
on them; the numbers a user sees in the app, in a sweep CSV and in the CLI come from this one
path.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from sparsefinder.attention.masks import layer_allowed
from sparsefinder.methods.registry import (
    METHODS,
    BuildContext,
    Inputs,
    Method,
    Params,
    Parts,
    Variant,
    alias_params,
    get_method,
    method_id,
    resolve_method,
)
from sparsefinder.predictors.base import Predictor, check_shapes, honours_window
from sparsefinder.predictors.global_tokens import GlobalTokens
from sparsefinder.predictors.union import Union, reads_shapes_only, shared_union
from sparsefinder.predictors.window import Window

if TYPE_CHECKING:
    from sparsefinder.data.records import AttentionRecord
    from sparsefinder.projections.heads import HeadProjections

GLOBAL_CHOICES: tuple[str, ...] = ("first", "last")


@dataclass(frozen=True)
class PredictorSpec:
    """``(method, calibration, params)`` ∪ window ∪ global tokens: a hashable value naming one
    predictor.

    Build it with :meth:`of`; ``params`` is stored as sorted ``(name, value)`` pairs so equal
    settings compare and hash equal (it keys caches). ``method`` is a family
    (:data:`~sparsefinder.methods.registry.METHODS`), ``calibration`` how its parameters are
    set (``none``: given raw; ``budget`` etc.: from a target, fitted on TRAIN graphs); an old
    name such as ``distance-budget`` or a written ``distance:budget`` is split into the two.
    ``window`` 0 and no ``global_tokens`` add nothing.
    """

    method: str
    params: tuple[tuple[str, Any], ...] = ()
    window: int = 0
    global_tokens: tuple[str, ...] = ()
    calibration: str = "none"
    _method: Method = field(init=False, repr=False, compare=False, hash=False)
    _variant: Variant = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.method not in METHODS or self.calibration != "none":
            fixed = alias_params(self.method)  # an old form's name: its params, fixed
            if fixed:
                given = dict(self.params)
                object.__setattr__(self, "params", tuple(sorted({**fixed, **given}.items())))
            family, calibration = resolve_method(self.method)
            if calibration != "none" and self.calibration not in ("none", calibration):
                raise ValueError(f"method {self.method!r} already names calibration "
                                 f"{calibration!r}, got calibration={self.calibration!r}")
            object.__setattr__(self, "method", family)
            object.__setattr__(self, "calibration", calibration if calibration != "none"
                               else self.calibration)
        method = get_method(self.method)
        variant = method.variant(self.calibration, dict(self.params))
        optional = {p.name for p in variant.params if p.optional}
        if any(value is None and name in optional for name, value in self.params):
            # an optional parameter given as None is the same setting as one left out
            object.__setattr__(self, "params", tuple(
                (name, value) for name, value in self.params
                if not (value is None and name in optional)))
        method.check_params(dict(self.params), self.calibration)
        declared = {p.name: p for p in variant.params if p.choices}
        if any(name in declared for name, _ in self.params):  # "false" from a link → False
            object.__setattr__(self, "params", tuple(
                (name, declared[name].coerce(value) if name in declared else value)
                for name, value in self.params))
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            raise ValueError(f"window must be an integer >= 0, got {self.window!r}")
        bad = [g for g in self.global_tokens if g not in GLOBAL_CHOICES]
        if bad:
            raise ValueError(f"global_tokens must be among {GLOBAL_CHOICES}, got {bad}")
        object.__setattr__(self, "_method", method)
        object.__setattr__(self, "_variant", variant)

    @classmethod
    def of(cls, method: str, params: Params | None = None, *, window: int = 0,
           global_tokens: Sequence[str] = (), calibration: str = "none") -> PredictorSpec:
        """A spec from a parameter dict, e.g. ``PredictorSpec.of("distance", {"threshold": 1})``
        or ``PredictorSpec.of("distance", {"target_sparsity": 0.9}, calibration="budget")``."""
        chosen = tuple(g for g in GLOBAL_CHOICES if g in set(global_tokens))
        return cls(method, tuple(sorted(dict(params or {}).items())), int(window), chosen,
                   calibration)

    @property
    def key(self) -> tuple:
        """Plain values that name the spec (for caches that pickle or hash their keys)."""
        return (self.method, self.calibration, self.params, self.window, self.global_tokens)

    @property
    def method_id(self) -> str:
        """The family with its calibration as written: ``distance``, ``distance:budget``."""
        return method_id(self.method, self.calibration)

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def inputs(self) -> Inputs:
        """What the built predictor reads (window/global patterns only read shapes)."""
        return self._variant.inputs

    @property
    def needs_projections(self) -> bool:
        return self._variant.inputs == "projected"

    @property
    def needs_training(self) -> bool:
        return self._variant.fit is not None

    @property
    def oracle(self) -> bool:
        return self._method.oracle

    def params_json(self, omit: Sequence[str] = ()) -> str:
        """The method's parameters as sorted JSON (the ``params`` column of a sweep; ``omit``:
        those its curve's name already says, e.g. ``sparsebert-dams``'s ``kind``)."""
        return json.dumps({k: v for k, v in self.params if k not in omit}, sort_keys=True)

    def label(self) -> str:
        """Short human label, e.g. ``"kmeans n_clusters=8 top_k=1 ∪ window 3"``."""
        pieces = []
        if not self.empty_base:
            values = " ".join(f"{k}={_fmt(v)}" for k, v in self.params)
            pieces.append(f"{self.method_id} {values}".strip())
        if self.window:
            pieces.append(f"window {self.window}")
        if self.global_tokens:
            pieces.append("global " + "+".join(self.global_tokens))
        return " ∪ ".join(pieces) or "empty graph"

    @property
    def empty_base(self) -> bool:
        """The family's own part keeps nothing (a window of 0: only the spec's window and
        global tokens, the setting once called ``fixed``)."""
        return self.method == "window" and self.calibration == "none" and \
            not self.param_dict.get("window")

    @property
    def variant(self) -> Variant:
        """What the family takes and does under this calibration and form."""
        return self._variant

    @property
    def needs(self) -> tuple[str, ...] | None:
        """The learned parts this setting's ``build`` reads (:data:`~sparsefinder.methods.
        parts.NEEDS`; None: the family declared none, so it gets every part at hand)."""
        return self._variant.needs

    def parts(self, projections: HeadProjections | None = None, fitted: Any = None) -> Parts:
        """The bundle of ``projections`` and what :meth:`fit` returned (put in the field the
        family's ``fit`` makes: ``calibration``, ``hash_codes``, ``block_projections``…)."""
        bundle = Parts(projections=projections)
        return bundle if fitted is None else bundle.with_fit(self._variant.fits, fitted)

    def build(self, parts: Parts | HeadProjections | None, layer: int,
              fitted: Any = None) -> Predictor | None:
        """The predictor of one layer (``None``: nothing switched on, the empty graph), built
        from ``parts`` cut to what the family declared. Projections (or None) with what
        :meth:`fit` returned are accepted too and bundled by :meth:`parts`."""
        if not isinstance(parts, Parts):
            parts = self.parts(parts, fitted)
        context = BuildContext(parts.only(self.needs), layer)
        pieces: list[Predictor] = []
        base = None if self.empty_base else self._variant.build(self.param_dict, context)
        if base is not None:
            pieces.append(base)
        if self.window > 0:
            pieces.append(Window(self.window))
        if self.global_tokens:
            pieces.append(GlobalTokens(first="first" in self.global_tokens,
                                       last="last" in self.global_tokens))
        if not pieces:
            return None
        return pieces[0] if len(pieces) == 1 else Union(*pieces)

    def build_layers(self, parts: Parts | HeadProjections | None, num_layers: int,
                     fitted: Any = None) -> list[Predictor | None]:
        """:meth:`build` for every layer."""
        if not isinstance(parts, Parts):
            parts = self.parts(parts, fitted)
        return [self.build(parts, layer) for layer in range(num_layers)]

    def fit(self, train_records: Sequence[AttentionRecord] | None) -> Any:
        """Run the method's ``fit`` on training records (None for methods without one)."""
        variant = self._variant
        if variant.fit is None:
            return None
        defaults = {p.name: p.default for p in variant.params}
        form = {name: self.param_dict.get(name, defaults.get(name)) for name in variant.fit_reads}
        return variant.fit(list(train_records or []), **form)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class RecordInputs:
    """The vectors one record offers to predictors, per layer and per declared ``inputs``.

    Original q/k come from the record; projected ones are computed on first use with the
    projections (after :meth:`HeadProjections.check_record`) and kept, so every setting that
    reads them — a slider move, a sweep grid point — reuses one projection per layer.
    """

    def __init__(self, record: AttentionRecord, projections: HeadProjections | None = None,
                 *, checked: bool = False):
        if projections is not None and not checked:  # checked: the caller already did
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


class LayerPrediction:
    """Predicts the layers of one record one at a time, as :func:`predict_record` does:
    shape-only patterns (window, global tokens) with ``shared`` are built once per kind of
    layer and reused; an absent predictor predicts the empty graph; a sliding-window layer's
    prediction is cut to its window."""

    def __init__(self, spec: PredictorSpec, predictors: Sequence[Predictor | None],
                 vectors: RecordInputs, *, shared: bool = False) -> None:
        if len(predictors) != vectors.record.num_layers:
            raise ValueError(f"got predictors for {len(predictors)} layers, the record has "
                             f"{vectors.record.num_layers}")
        self.spec, self.predictors, self.vectors, self.shared = spec, predictors, vectors, shared
        self._patterns: list[tuple[Predictor, Tensor]] = []  # shared patterns of the layers
        self._cut: dict[tuple[int, int | None], Tensor] = {}  # (pattern, window) → mask

    @torch.inference_mode()
    def __call__(self, layer: int) -> Tensor:
        """Bool (heads, n, m) mask of ``layer`` (an inference tensor: read-only)."""
        record, predictor = self.vectors.record, self.predictors[layer]
        graph = record.layers[layer]
        # the gold mask's shape, not the mask: unpacking every head's gold bits only to read
        # its shape cost ~50 ms a layer at 4096 tokens on each slider move
        shape, window, device = graph.gold_shape, graph.sliding_window, graph.queries.device
        if predictor is None:
            empty = torch.zeros(shape[1:] if self.shared else shape, dtype=torch.bool,
                                device=device)
            return empty.expand(shape)
        if self.shared and reads_shapes_only(predictor):  # one mask per kind of layer
            n, m = shape[1:]
            index = next((i for i, (p, _) in enumerate(self._patterns) if p == predictor), None)
            if index is None:
                index = len(self._patterns)
                self._patterns.append((predictor, shared_union(predictor, n, m, device)))
            if (index, window) not in self._cut:
                self._cut[index, window] = _cut(self._patterns[index][1], causal=record.causal,
                                                sliding_window=window)
            return self._cut[index, window].expand(shape)
        q, k = self.vectors.get(layer, self.spec.inputs)
        return predict_layer(predictor, q, k, causal=record.causal, sliding_window=window,
                             shared=self.shared)


@torch.inference_mode()
def predict_record(spec: PredictorSpec, predictors: Sequence[Predictor | None],
                   vectors: RecordInputs, *, shared: bool = False) -> list[Tensor]:
    """Bool (heads, n, m) masks of every layer of one record, from per-layer predictors built
    from ``spec`` (see :meth:`PredictorSpec.build_layers`); an absent predictor predicts the
    empty graph. A sliding-window layer's prediction is cut to its window, as the model's
    own mask cuts its attention. ``shared``: see :func:`predict_layer` (read-only masks).
    :class:`LazyMasks` predicts the same masks when they are read."""
    predict = LayerPrediction(spec, predictors, vectors, shared=shared)
    return [predict(layer) for layer in range(vectors.record.num_layers)]


def _cut(pattern: Tensor, *, causal: bool, sliding_window: int | None) -> Tensor:
    """A head-independent pattern cut to the pairs its layer allows: what ``predict`` then
    :func:`predict_layer`'s window cut give (a window ⊆ the causal triangle when causal)."""
    n, m = pattern.shape
    allowed = layer_allowed(n, m, causal=causal, sliding_window=sliding_window,
                            device=pattern.device)
    return pattern if allowed is None else pattern & allowed


def predict_layer(predictor: Predictor, q: Tensor, k: Tensor, *, causal: bool,
                  sliding_window: int | None = None, shared: bool = False) -> Tensor:
    """One layer's bool (heads, n, m) mask, as :func:`predict_record` predicts it: a
    sliding-window layer's prediction is cut to its window (a predictor that honours the
    window spends its per-row budget inside it). Exposed so that a view of one head
    (``explore.learned_space``) predicts exactly as a record does.

    ``shared``: a predictor that reads only shapes (window, global tokens) returns its one
    (n, m) mask broadcast over the heads (stride 0, read-only; the same values), so a long
    text costs one n² mask per layer, not one per head (the app's slider; the scorer reads
    such a mask once)."""
    if shared:
        check_shapes(q, k)
        pattern = shared_union(predictor, q.shape[1], k.shape[1], q.device)
        if pattern is not None:
            return _cut(pattern, causal=causal, sliding_window=sliding_window).expand(
                q.shape[0], -1, -1)
    if sliding_window and honours_window(predictor):  # a per-row budget inside the window
        mask = predictor.predict(q, k, causal=causal, sliding_window=sliding_window)
    else:
        mask = predictor.predict(q, k, causal=causal)
    if sliding_window:  # a local layer: keys outside its window can never be attended to
        n, m = mask.shape[-2:]
        mask = mask & layer_allowed(n, m, causal=causal, sliding_window=sliding_window,
                                    device=mask.device)
    return mask
