"""Sparsity–recall sweeps: every spec of the chosen curves scored on held-out records.

:func:`sweep` scores every spec of the chosen curves with :func:`score_specs`: for each text
it builds a :class:`~sparsefinder.metrics.scorer.Scorer` once, runs the per-layer predictors of each
spec through :func:`~sparsefinder.methods.spec.predict_record` (projections computed once per text
and
layer) and macro-averages recall and sparsity (texts, then heads, then layers). The app's live
view scores a setting with the very same two calls, so its numbers equal the sweep's.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from sparsefinder.data.records import AttentionRecord
from sparsefinder.evaluation.curves import CURVES, resolve_methods, shown_params
from sparsefinder.evaluation.plan import plan_sweep
from sparsefinder.methods.spec import PredictorSpec, RecordInputs, predict_record
from sparsefinder.metrics.measures import EXTRA_METRICS, GraphScores, block_recall
from sparsefinder.metrics.scorer import Scorer, counted_layers, macro_average
from sparsefinder.predictors.base import Predictor
from sparsefinder.projections.heads import HeadProjections

ProgressFn = Callable[[float, str], None]


@dataclass
class SpecScores:
    """Macro-averaged scores of one spec over a set of records."""

    recall: float
    sparsity: float
    recall_per_layer: list[float]
    sparsity_per_layer: list[float]
    n_texts: int
    #: macro averages of the :data:`~sparsefinder.metrics.measures.EXTRA_METRICS` (precision, exact
    #: fraction, mass recall, block recall at 16 and 64), same averaging as recall
    extra: dict[str, float] = field(default_factory=dict)
    #: tile recall at the method's own ``block`` parameter (metrics.block_recall); NaN
    #: for token-level methods
    block_recall: float = math.nan
    #: softmax layers (α = 1, dense gold) left out of the overall averages
    n_softmax_layers: int = 0

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
    built: Sequence[Sequence[Predictor | None]] | None = None,
    on_progress: ProgressFn | None = None,
    records_checked: bool = False,
) -> tuple[list[SpecScores], GraphScores]:
    """Macro-averaged scores of every spec on ``records`` and the gold sparsity.

    Per text: one :class:`Scorer`, one :class:`RecordInputs` (projections computed once per
    layer), then for each spec ``scorer.score(predict_record(...))`` — the same calls the
    app makes for one setting. ``fitted[i]`` is what ``specs[i].fit(train_records)`` returned
    (for methods learned from training graphs); ``built[i]``, when given, the per-layer
    predictors of ``specs[i]`` already built (a :class:`~.plan.SweepPlan`'s), else they are
    built here. ``records_checked``: the caller already ran ``projections.check_record`` on
    every record. ``on_progress(fraction, message)`` is called after each text.
    """
    if not records:
        raise ValueError("scoring needs at least one record (a text's gold graphs)")
    num_layers = records[0].num_layers
    if any(r.num_layers != num_layers for r in records):
        raise ValueError("records come from models with different numbers of layers")
    if any(s.needs_projections for s in specs) and projections is None:
        raise ValueError("these methods need learned projections; pass projections=... "
                         "(train them with `sparsefinder train --model NAME --out DIR`)")
    if built is None:
        fitted = list(fitted) if fitted is not None else [None] * len(specs)
        built = [spec.build_layers(projections, num_layers, fit)
                 for spec, fit in zip(specs, fitted, strict=True)]
    per_spec: list[list[GraphScores]] = [[] for _ in specs]
    extras: list[list[Tensor]] = [[] for _ in specs]  # (layers, heads) per text
    gold: list[GraphScores] = []
    for index, record in enumerate(records):
        scorer = Scorer(record)
        vectors = RecordInputs(record, projections, checked=records_checked)
        for c, spec in enumerate(specs):
            preds = predict_record(spec, built[c], vectors)
            per_spec[c].append(scorer.score(preds))
            extras[c].append(own_block_recall(spec, preds, scorer))
        gold.append(GraphScores(recall=torch.ones_like(scorer.gold_sparsity),
                                sparsity=scorer.gold_sparsity, counted=scorer.counted))
        if on_progress is not None:
            on_progress((index + 1) / len(records),
                        f"text {index + 1} of {len(records)} ({len(specs)} settings)")
    results = []
    for scores, extra in zip(per_spec, extras, strict=True):
        avg = macro_average(scores)
        # macro over texts, heads, counted layers (equal shapes: the mean of means is the mean)
        counted = counted_layers(scores)
        counted = counted if bool(counted.any()) else torch.ones_like(counted)
        block = float(torch.stack(extra)[:, counted].mean()) if extra else math.nan
        results.append(SpecScores(
            recall=float(avg["recall"]), sparsity=float(avg["sparsity"]),
            recall_per_layer=[float(x) for x in avg["recall_per_layer"]],
            sparsity_per_layer=[float(x) for x in avg["sparsity_per_layer"]],
            n_texts=int(avg["n_texts"]), block_recall=block,
            extra={name: float(avg[name]) for name in EXTRA_METRICS if name in avg},
            n_softmax_layers=int(avg["n_softmax_layers"]),
        ))
    gold_avg = macro_average(gold)
    gold_scores = GraphScores(recall=gold_avg["recall_per_layer"],
                              sparsity=gold_avg["sparsity_per_layer"],
                              counted=counted_layers(gold))
    return results, gold_scores


def own_block_recall(spec: PredictorSpec, preds: Sequence[Tensor], scorer: Scorer) -> Tensor:
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
    (macro averages, :data:`~sparsefinder.metrics.measures.EXTRA_METRICS`),
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
    if projections is not None:  # before any fit: a wrong model fails at once
        for record in records:
            projections.check_record(record)
    plan = plan_sweep(names, projections, records[0].num_layers, train_records)
    if plan.skipped:
        warnings.warn(f"skipping {len(plan.skipped)} configurations: "
                      + skipped_summary(plan.skipped), UserWarning, stacklevel=2)
    if not plan.points:
        raise ValueError(f"no configuration of {names} can be built with these projections")
    rows = [(point.curve, point.spec) for point in plan.points]
    results, gold = score_specs(records, projections, plan.specs,
                                built=[point.predictors for point in plan.points],
                                on_progress=on_progress, records_checked=True)
    frame = points_frame(rows, results)
    counted = gold.counted if gold.counted is not None and bool(gold.counted.any()) else (
        torch.ones(gold.sparsity.shape[0], dtype=torch.bool))
    frame.attrs["gold_sparsity"] = float(gold.sparsity[counted].mean())
    frame.attrs["gold_sparsity_per_layer"] = [float(x) for x in gold.sparsity]
    frame.attrs["softmax_layers"] = [i for i, c in enumerate(counted.tolist()) if not c]
    return frame


def skipped_summary(skipped: Sequence[str]) -> str:
    """``"curve {params}: reason"`` lines grouped per curve and reason, e.g. ``"kmeans
    (3 settings): no k-means centroids for B=6"``: one clause per cause, not per point."""
    groups: dict[tuple[str, str], int] = {}
    for line in skipped:
        curve, _, rest = line.partition(" ")
        reason = rest.split("}: ", 1)[1] if "}: " in rest else rest
        groups[curve, reason] = groups.get((curve, reason), 0) + 1
    return "; ".join(f"{curve} ({count} setting{'s' * (count > 1)}): {reason}"
                     for (curve, reason), count in groups.items())


def points_frame(rows: Sequence[tuple[str, PredictorSpec]],
                 results: Sequence[SpecScores]) -> pd.DataFrame:
    """The one column set of a sweep's points (every sweep writes it; see :func:`sweep`)."""
    return pd.DataFrame([
        {
            "method": name,
            "family": spec.method,
            "calibration": spec.calibration,
            "params": shown_params(name, spec),
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
