"""The live path of the app: a view state → its spec → per-layer masks → scores.

It adds nothing to the library's maths: :func:`predict` is
``spec.predict_record(spec, spec.build_layers(...), prepared.vectors)`` and :func:`score` is the
prepared text's :class:`~sparsefinder.metrics.scorer.Scorer` — the two calls ``sweeps.sweep`` makes
for every grid point — so a setting shows the same numbers here as in a sweep.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from sparsefinder.data.records import AttentionRecord
from sparsefinder.evaluation import sweep as sweeps
from sparsefinder.explore.app_methods import APP_CALIBRATIONS, method_label
from sparsefinder.explore.availability import available_methods
from sparsefinder.explore.layer_masks import LazyMasks
from sparsefinder.explore.prepared import PreparedText
from sparsefinder.explore.state import ViewState, to_spec
from sparsefinder.explore.text_ranges import fit
from sparsefinder.methods.registry import get_method
from sparsefinder.methods.spec import (
    LayerPrediction,
    PredictorSpec,
    predict_layer,
)
from sparsefinder.metrics.measures import GraphScores
from sparsefinder.predictors.row_floor import floor_counts
from sparsefinder.projections.heads import HeadProjections


def effective_method(state: ViewState, prepared: PreparedText) -> str:
    """The method that actually runs, written with its calibration (``distance:budget``): a
    learned one without projections becomes "window" (the app's window and global tokens
    only)."""
    wanted = state.method_id
    return wanted if wanted in available_methods(prepared) else "window"


def clamp(state: ViewState, prepared: PreparedText) -> tuple[ViewState, list[str]]:
    """Fit a (possibly URL-given) state to this text and model; say what was changed.

    Each slider's value goes into this text's range (:func:`.text_ranges.fit`: B to an
    available number of centroids), layer/head/query into range. The method is
    kept (so a shared URL keeps it) but a note says when it cannot run here.
    """
    notes: list[str] = []
    changes: dict[str, Any] = {}
    offered = APP_CALIBRATIONS.get(state.method, ("none",))
    if state.calibration not in offered:  # another family was chosen: its default calibration
        state = replace(state, calibration=offered[0])
        changes["calibration"] = offered[0]
    if effective_method(state, prepared) != state.method_id:
        if state.calibration != "none" and prepared.has_projections:
            why = ("needs settings calibrated for these projections (`sparsefinder calibrate "
                   "--projections FILE --out calibration.pt`), which are not loaded")
        else:
            why = "needs learned projections for this model, which are not loaded"
        notes.append(f"{method_label(state.method_id)} {why}: it is off, and only the "
                     "window/global patterns are predicted.")
    targets = prepared.calibration.targets if prepared.calibration is not None else []
    wanted = state.target_sparsity
    if targets and not any(abs(wanted - t) < 1e-9 for t in targets):
        changes["target_sparsity"] = min(targets, key=lambda t: abs(t - wanted))
        notes.append(f"target sparsity {wanted:g} is not calibrated: showing the "
                     f"nearest calibrated target, {changes['target_sparsity']:g}.")
    # every slider's value into this text's range (t up to its distance quantile, B one the
    # projections hold, k up to B), an unset one on its first value (text_ranges)
    changes.update(fit(prepared, replace(state, **changes)))
    for name, size in (
        ("layer", prepared.num_layers),
        ("head", prepared.num_heads),
        ("query", prepared.n_tokens),
    ):
        if getattr(state, name) >= size:
            changes[name] = size - 1
            notes.append(f"{name}={getattr(state, name)} is beyond this text and model "
                         f"(0–{size - 1}): showing {name} {size - 1} instead.")
    clusters = changes.get("clusters", state.clusters)
    top_k = changes.get("top_k", state.top_k)
    if state.method == "kmeans" and clusters and 2 * int(top_k) > int(clusters):
        notes.append(f"k={top_k} of B={clusters} clusters: every query and key joins more than "
                     "half of the clusters, so every pair shares one and the graph is full.")
    return replace(state, **changes), notes


def spec_for(state: ViewState, prepared: PreparedText) -> PredictorSpec:
    """The spec the sliders stand for on this text (learned methods off without projections)."""
    return to_spec(state, effective_method(state, prepared))


def predict(prepared: PreparedText, spec: PredictorSpec) -> LazyMasks:
    """Predicted bool masks (heads, n, n) of every layer of the prepared text, read-only and
    predicted when read (:class:`~.layer_masks.LazyMasks`: a long text holds a few layers,
    not all): a window/global pattern is one (n, n) mask broadcast over the heads
    (``shared``), which the scorer reads once per layer, so a slider move on a long text
    costs no per-head n² work (the numbers are the same)."""
    predictors = spec.build_layers(prepared.parts_for(spec), prepared.num_layers)
    heads, n, m = prepared.record.layers[0].gold_shape
    return LazyMasks(LayerPrediction(spec, predictors, prepared.inputs_for(spec), shared=True),
                     prepared.num_layers, heads * n * m)


def score(prepared: PreparedText, preds: Sequence[Tensor]) -> GraphScores:
    """Every metric of every (layer, head) (the prepared scorer): recall, sparsity, gold
    sparsity and ``metrics.EXTRA_METRICS``."""
    return prepared.scorer.score(preds).to("cpu")  # a few numbers; a no-op on a CPU


def predict_layers(prepared: PreparedText, state: ViewState) -> list[Tensor]:
    """:func:`predict` for a view state (what the sliders show)."""
    return predict(prepared, spec_for(state, prepared))


@dataclass(frozen=True)
class Summary:
    """Recall / sparsity / gold sparsity at one scope (a head, a layer or the model)."""

    recall: float
    sparsity: float
    gold_sparsity: float
    #: the other metrics present (``metrics.EXTRA_METRICS``: precision, exact fraction…)
    extra: dict[str, float] = field(default_factory=dict)


def representative_head(scores: GraphScores) -> tuple[int, int]:
    """The (layer, head) whose recall and sparsity are nearest the model's (each measured in
    units of its spread over heads): the first head a newcomer sees shows the method as it
    does on average, not its weakest head (layer 0, head 0 was both the first and often the
    hardest)."""
    points = torch.stack([scores.recall, scores.sparsity], -1).double()  # (L, H, 2)
    centre = points.mean((0, 1))
    spread = points.flatten(0, 1).std(0).clamp_min(1e-12)
    distance = ((points - centre) / spread).square().sum(-1)
    flat = int(distance.flatten().argmin())
    return divmod(flat, int(scores.recall.shape[1]))


def softmax_layers(scores: GraphScores) -> list[int]:
    """The layers that ran softmax (α = 1, dense gold graphs), as the sweep lists them: the
    ones ``scores.counted`` leaves out of overall values."""
    if scores.counted is None:
        return []
    return [index for index, counted in enumerate(scores.counted.tolist()) if not counted]


def summarize(scores: GraphScores, layer: int, head: int) -> dict[str, Summary]:
    """Head, layer (mean over heads) and model (mean over layers of layer means) values.

    The model value is the macro average of ``metrics.macro_average`` for one text: softmax
    layers (dense gold graphs, :func:`softmax_layers`) are left out of it, as the sweep does,
    unless no layer is entmax.
    """
    counted = scores.counted
    if counted is None or not bool(counted.any()):
        counted = torch.ones(scores.recall.shape[0], dtype=torch.bool)

    def at(select: Callable[[Tensor], Tensor]) -> Summary:
        gold = scores.gold_sparsity if scores.gold_sparsity is not None else scores.sparsity
        extra = {name: float(select(values)) for name, values in scores.metrics().items()
                 if name not in ("recall", "sparsity")}
        return Summary(recall=float(select(scores.recall)),
                       sparsity=float(select(scores.sparsity)),
                       gold_sparsity=float(select(gold)), extra=extra)

    return {
        "head": at(lambda x: x[layer, head]),
        "layer": at(lambda x: x[layer].mean()),
        "model": at(lambda x: x.mean(-1)[counted].mean()),
    }


def score_setting(records: Sequence[AttentionRecord], projections: HeadProjections | None,
                  spec: PredictorSpec, fitted: Any = None) -> Summary:
    """Macro-averaged recall/sparsity of one setting on several texts (the Pareto star): the
    sweep's own scoring, :func:`sparsefinder.evaluation.sweep.score_specs` (``fitted``: what a
    calibrated method is built from, e.g. ``prepared.fitted(spec.method_id)``)."""
    results, gold = sweeps.score_specs(records, projections, [spec], fitted=[fitted])
    return Summary(recall=results[0].recall, sparsity=results[0].sparsity,
                   gold_sparsity=float(gold.sparsity.mean()), extra=dict(results[0].extra))


def describe(spec: PredictorSpec) -> str:
    """Short label of a setting, e.g. "k-means B=8 k=1 ∪ window 3"."""
    p = spec.param_dict
    labels = {
        "rowfrac:budget": lambda: f"nearest keys, target sparsity {p['target_sparsity']:g}",
        "distance:budget": lambda: (f"distance ∪ {p['floor']} nearest keys per row, "
                                    if p.get("floor") else "distance, ")
        + f"target sparsity {p['target_sparsity']:g}",
        "kmeans-routed:budget": lambda: (f"routed k-means, target sparsity "
                                         f"{p['target_sparsity']:g}"),
        "distance": lambda: f"distance t={p['threshold']:.3g}",
        "quantization": lambda: f"quantization β={p['bins']}",
        "kmeans": lambda: f"k-means B={p['n_clusters']} k={p['top_k']}",
    }
    if spec.method_id in labels:
        pieces = [labels[spec.method_id]()]
    elif spec.empty_base:
        pieces = []
    else:  # a generated family: its name, each parameter by its slider label
        declared = {param.name: param.label for param in get_method(spec.method).params}
        words = [get_method(spec.method).label.split(" (")[0]]
        for name, value in spec.params:
            label = declared.get(name) or name
            words.append(f"{label}={_short(value)}" if len(label) <= 3
                         else f"{label} {_short(value)}")
        pieces = [", ".join(words) if any(" " in w for w in words[1:])
                  else " ".join(words)]
    if spec.window:
        pieces.append(f"window {spec.window}")
    if spec.global_tokens:
        pieces.append("global " + "+".join(spec.global_tokens))
    return " ∪ ".join(pieces) or "empty graph"


def short_text_note(spec: PredictorSpec, n_keys: int, sparsity: float) -> str | None:
    """Why a target sparsity is not reached on a short text (None when it is, or no target
    is set): every row keeps at least one key (the floor's methods: its ``floor`` nearest),
    so a row of ``n_keys`` keys drops at most ``1 − kept / n_keys`` of them, and a 3-word text
    at target 0.90 shows sparsity 0.000 with no fault of the predictor."""
    params = spec.param_dict
    target = params.get("target_sparsity")
    if target is None or n_keys < 1:
        return None
    kept = max(int(params.get("floor", 1) or 1), 1)
    if params.get("floor_share") is not None:  # the floor capped by the row's length
        share = float(params["floor_share"]) * (1.0 - float(target))
        kept = int(floor_counts(kept, share, torch.tensor(n_keys)))
    reachable = max(0.0, 1.0 - kept / n_keys)
    if reachable >= float(target):
        return None
    keeps = (f"keeps each row's {kept} nearest keys whatever the target" if kept > 1
             else "keeps at least one key in each row")
    return (f"Sparsity {sparsity:.3f} against the target {float(target):.2f}: this text has "
            f"only {n_keys} keys per row (tokens, special ones included), and the method "
            f"{keeps}, so no row can drop more than {reachable:.0%} of its keys. The target "
            f"needs rows of at least {math.ceil(kept / (1.0 - float(target)) - 1e-9)} keys: paste "
            "a longer text.")


def _short(value: Any) -> str:
    """A parameter value as a label shows it (``0.1``, ``23``)."""
    return f"{value:.3g}" if isinstance(value, float) else str(value)


@torch.inference_mode()
def kmeans_layer_mask(prepared: PreparedText, layer: int, clusters: int, top_k: int) -> Tensor:
    """Sparsefinder k-means graph alone (no window/global) of one layer: bool (heads, n, m),
    cut to a local layer's window as every prediction (:func:`predict_layer`)."""
    if not prepared.has_projections or int(clusters) not in prepared.cluster_choices:
        raise ValueError(f"no projections with B={clusters} centroids for this text")
    spec = PredictorSpec.of("kmeans", {"n_clusters": int(clusters), "top_k": int(top_k)})
    predictor = spec.build(prepared.projections, layer)
    q, k = prepared.vectors.get(layer, spec.inputs)
    return predict_layer(predictor, q, k, causal=prepared.record.causal,
                         sliding_window=prepared.record.layers[layer].sliding_window)
