"""What the current setting costs the model on the current text (the Explorer's accuracy).

The live path scores a setting's graphs against the gold graphs without running the model;
this runs it once more, restricted to the setting's graphs (predicted inside the forward pass,
:mod:`sparsefinder.evaluation.restricted`), and compares the output with the full α-entmax run
(:mod:`sparsefinder.evaluation.accuracy`, the same measures ``sparsefinder sweep --accuracy``
reports).
One restricted forward of one text: ~0.1–0.5 s on a CPU. The full run is the ``reference``
the app computes once per text and caches.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sparsefinder.evaluation.accuracy import EncodedTexts, compare, encode
from sparsefinder.evaluation.accuracy_sweep import ExtraPoint
from sparsefinder.evaluation.restricted import RestrictionStats, spec_graph
from sparsefinder.explore import live
from sparsefinder.methods.spec import PredictorSpec
from sparsefinder.models.loading import LoadedModel
from sparsefinder.projections.heads import HeadProjections


@dataclass(frozen=True)
class SettingAccuracy:
    """Output/embedding cosine, per-layer cosine, and what the restricted run computed."""

    output_cosine: float
    embedding_cosine: float
    layer_cosine: list[float]
    sparsity: float  # of the graphs entmax ran over (repaired diagonals included)
    repaired_rows: float  # fraction of (head, query) rows the graph left empty


def reference(loaded: LoadedModel, text: str) -> EncodedTexts:
    """The full α-entmax run of ``text`` (cache it per model and text)."""
    return encode(loaded.model, loaded.tokenizer, [text], max_length=loaded.max_length)


def setting_accuracy(
    loaded: LoadedModel,
    text: str,
    spec: PredictorSpec,
    projections: HeadProjections | None,
    full: EncodedTexts | None = None,
    fitted: Any = None,
) -> SettingAccuracy:
    """Run ``text`` restricted to ``spec``'s graphs and compare with ``full`` (the reference);
    ``fitted``: what a calibrated method is built from (``prepared.fitted(spec.method_id)``)."""
    if full is None:
        full = reference(loaded, text)
    stats = RestrictionStats()
    graph = spec_graph(spec, projections, loaded.num_layers, fitted=fitted,
                       model_name=loaded.model_id)
    restricted = encode(loaded.model, loaded.tokenizer, [text], graph_fn=graph,
                        max_length=loaded.max_length, warn_empty=False, stats=stats)
    scores = compare(full, restricted)
    return SettingAccuracy(
        output_cosine=float(scores["output_cosine"]),
        embedding_cosine=float(scores["embedding_cosine"]),
        layer_cosine=list(scores.get("layer_cosine", [])),
        sparsity=stats.sparsity()[0],
        repaired_rows=stats.repaired_fraction,
    )


@dataclass(frozen=True)
class TaskAccuracy:
    """The default model's task under a setting: do passages keep their nearest neighbours?"""

    retrieval_top1: float
    retrieval_ndcg10: float
    embedding_cosine: float
    n_texts: int


def task_accuracy(
    loaded: LoadedModel,
    texts: list[str],
    spec: PredictorSpec,
    projections: HeadProjections | None,
    full: EncodedTexts | None = None,
    fitted: Any = None,
) -> TaskAccuracy:
    """Retrieval agreement of ``texts`` (e.g. validation passages) restricted to ``spec``'s
    graphs against their full α-entmax run (``full``, cache it): each passage's nearest
    neighbours among the others, top-1 agreement and nDCG@10
    (:mod:`sparsefinder.evaluation.accuracy`)."""
    if len(texts) < 2:
        raise ValueError("retrieval agreement needs at least two texts")
    if full is None:
        full = encode(loaded.model, loaded.tokenizer, texts, max_length=loaded.max_length)
    graph = spec_graph(spec, projections, loaded.num_layers, fitted=fitted,
                       model_name=loaded.model_id)
    restricted = encode(loaded.model, loaded.tokenizer, texts, graph_fn=graph,
                        max_length=loaded.max_length, warn_empty=False)
    scores = compare(full, restricted)
    return TaskAccuracy(retrieval_top1=float(scores["retrieval_top1"]),
                        retrieval_ndcg10=float(scores["retrieval_ndcg10"]),
                        embedding_cosine=float(scores["embedding_cosine"]), n_texts=len(texts))


#: Targets at which the accuracy axis draws the current method's calibrated curve (where the
#: bundled table has them): one restricted forward each.
CURVE_TARGETS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)


def current_curve(state: Any, prepared: Any) -> list[ExtraPoint]:
    """The current method's calibrated curve as accuracy-sweep points (its settings at
    :data:`CURVE_TARGETS`, built from the bundled table as the live view builds them), so the
    sparsity–accuracy chart shows the method on screen — the app's default on opening — which
    the grid sweep cannot fit without train graphs; [] for a method without a target."""
    table = prepared.calibration
    method = live.effective_method(state, prepared)
    if table is None or ":" not in method or not table.has(method):
        return []
    points = []
    for target in CURVE_TARGETS:
        if target not in table.targets:
            continue
        spec = live.spec_for(replace(state, target_sparsity=target), prepared)
        points.append(ExtraPoint(method, spec, prepared.projections_for(spec.method_id),
                                 prepared.fitted(spec.method_id)))
    return points
