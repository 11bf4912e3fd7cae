"""Sweeps over record shards: each rank scores its records, macro averages reduced exactly.

The macro average (``metrics.macro_average``) is a mean over texts per (layer, head), then over
heads, then over layers. Only the first step touches texts, and it is linear: every rank adds
up its texts' per-(layer, head) recall, sparsity and extra metrics (float64) and counts them;
one ``all_reduce(SUM)`` of those sums and the text count gives the global per-head means, and
the head/layer means follow on every rank. Records are consumed as an iterable, one at a time
(e.g. :meth:`sparsefinder.data.shards.ShardedRecords.iter_records`), so memory holds one chunk,
whatever the corpus size. Identical maths to ``sweep.score_specs``; the numbers differ from it
only by float64 summation order (≤ 1e-15 relative).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd
import torch

from sparsefinder import distributed
from sparsefinder.data.records import AttentionRecord
from sparsefinder.evaluation.curves import CURVES, resolve_methods
from sparsefinder.evaluation.plan import plan_sweep
from sparsefinder.evaluation.sweep import SpecScores, own_block_recall, points_frame
from sparsefinder.methods.spec import PredictorSpec, RecordInputs, predict_record
from sparsefinder.metrics.measures import EXTRA_METRICS
from sparsefinder.metrics.scorer import Scorer
from sparsefinder.projections.heads import HeadProjections


def score_specs_streaming(
    records: Iterable[AttentionRecord],
    projections: HeadProjections | None,
    specs: Sequence[PredictorSpec],
    num_layers: int,
    *,
    fitted: Sequence[Any] | None = None,
) -> tuple[list[SpecScores], dict[str, list[float] | float]]:
    """Macro-averaged scores of every spec over the records of ALL ranks.

    ``num_layers`` is the model's (a rank may hold no record). Returns the spec scores and
    ``{"gold_sparsity": float, "gold_sparsity_per_layer": [...]}``.
    """
    fitted = list(fitted) if fitted is not None else [None] * len(specs)
    built = [spec.build_layers(projections, num_layers, fit)
             for spec, fit in zip(specs, fitted, strict=True)]
    names = ("recall", "sparsity", *EXTRA_METRICS, "block_recall")
    sums: torch.Tensor | None = None  # (specs + 1, metrics, layers, heads)
    count = 0
    softmax = torch.zeros(num_layers, dtype=torch.float64)  # records where a layer is softmax
    for record in records:
        scorer = Scorer(record)
        softmax += (~scorer.counted).double()
        vectors = RecordInputs(record, projections)
        rows = []
        for c, spec in enumerate(specs):
            preds = predict_record(spec, built[c], vectors)
            metrics = scorer.score(preds).metrics()
            metrics["block_recall"] = own_block_recall(spec, preds, scorer)
            rows.append(torch.stack([metrics[name].double() for name in names]))
        gold = scorer.gold_sparsity.double()
        rows.append(torch.stack([torch.ones_like(gold), gold,
                                 *[torch.zeros_like(gold)] * (len(names) - 2)]))
        part = torch.stack(rows)
        sums = part if sums is None else sums + part
        count += 1
    heads = torch.tensor([0 if sums is None else sums.shape[-1]])
    heads = int(distributed.all_reduce(heads, "max")[0])
    if sums is None:
        sums = torch.zeros(len(specs) + 1, len(names), num_layers, heads, dtype=torch.float64)
    packed = distributed.all_reduce(torch.cat([sums.reshape(-1), softmax,
                                               torch.tensor([float(count)],
                                                            dtype=torch.float64)]))
    n_texts = int(packed[-1])
    if n_texts == 0:
        raise ValueError("scoring needs at least one record (a text's gold graphs)")
    per_head = packed[:sums.numel()].view_as(sums) / n_texts
    # softmax layers (α = 1, dense gold) stay out of the overall values, as in macro_average
    counted = packed[sums.numel():-1] == 0
    n_softmax = int((~counted).sum())
    counted = counted if bool(counted.any()) else torch.ones_like(counted)
    per_layer = per_head.mean(-1)  # (specs + 1, metrics, layers)
    overall = per_layer[..., counted].mean(-1)  # (specs + 1, metrics)
    results = [
        SpecScores(recall=float(overall[c, 0]), sparsity=float(overall[c, 1]),
                   recall_per_layer=per_layer[c, 0].tolist(),
                   sparsity_per_layer=per_layer[c, 1].tolist(), n_texts=n_texts,
                   extra={name: float(overall[c, 2 + i])
                          for i, name in enumerate(EXTRA_METRICS)},
                   block_recall=float(overall[c, -1]), n_softmax_layers=n_softmax)
        for c in range(len(specs))
    ]
    gold = {"gold_sparsity": float(overall[-1, 1]),
            "gold_sparsity_per_layer": per_layer[-1, 1].tolist()}
    return results, gold


def sweep_streaming(
    records: Iterable[AttentionRecord],
    projections: HeadProjections | None,
    num_layers: int,
    methods: str | Sequence[str] = "sparsefinder",
) -> pd.DataFrame:
    """``sweep.sweep`` over streamed (sharded) records: the same rows, reduced over ranks.

    Methods learned from training graphs are not offered here (fit them on a list of train
    records with ``sweep.sweep``); grid points that cannot be built are skipped.
    """
    names = [n for n in resolve_methods(methods) if not CURVES[n].needs_training]
    if any(CURVES[n].needs_projections for n in names) and projections is None:
        raise ValueError(f"methods {names} need learned projections; pass projections=...")
    plan = plan_sweep(names, projections, num_layers)
    rows = [(point.curve, point.spec) for point in plan.points]
    results, gold = score_specs_streaming(records, projections, plan.specs, num_layers)
    frame = points_frame(rows, results)
    frame.attrs.update(gold)
    return frame
