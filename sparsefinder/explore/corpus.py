"""Corpus runs of the app: gold graphs of a validation split and its sweep, with progress.

Both report ``on_progress(fraction, message)`` so the app draws one progress bar; the sweep
itself is ``pareto.sweep`` (one call for every method, not one call per method).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from sparsefinder import pareto
from sparsefinder.calibration import CalibrationTable
from sparsefinder.corpus import corpus_texts
from sparsefinder.graphs import AttentionRecord, extract
from sparsefinder.projections import HeadProjections

ProgressFn = Callable[[float, str], None]


def corpus_records(
    loaded: Any,
    corpus: str = "default",
    split: str = "validation",
    max_passages: int | None = None,
    batch_size: int = 8,
    on_progress: ProgressFn | None = None,
) -> list[AttentionRecord]:
    """Gold graphs of a corpus split (chunked to the model's length, never truncated)."""
    texts = corpus_texts(corpus, split, loaded.tokenizer, loaded.max_length, max_passages)
    records: list[AttentionRecord] = []
    for start in range(0, len(texts), batch_size):
        if on_progress:
            on_progress(start / max(len(texts), 1),
                        f"gold graphs: text {start + 1}–{min(start + batch_size, len(texts))} "
                        f"of {len(texts)}")
        records.extend(extract(loaded, texts[start:start + batch_size], batch_size=batch_size,
                               long_text="error"))
    if on_progress:
        on_progress(1.0, f"{len(records)} texts")
    return records


def sweep_records(
    records: Sequence[AttentionRecord],
    projections: HeadProjections | None,
    methods: Sequence[str],
    on_progress: ProgressFn | None = None,
    calibration: CalibrationTable | None = None,
    calibration_projections: HeadProjections | None = None,
) -> pd.DataFrame:
    """``pareto.sweep`` of ``methods`` on ``records``, reporting progress; with a
    ``calibration`` table, also the curves of its calibrated methods (which a sweep fits on
    train records the app has not extracted), read from the table and built with its own
    projections (``calibration_projections``; default ``projections``)."""
    if not methods and calibration is None:
        raise ValueError("no sweep method can run here (learned methods need projections)")
    frames = []
    if methods:
        frames.append(pareto.sweep(records, projections, list(methods), on_progress=on_progress))
    if calibration is not None:
        frames.append(calibrated_curves(records, calibration_projections or projections,
                                        calibration))
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    frame.attrs = dict(frames[0].attrs)
    return frame


def calibrated_curves(records: Sequence[AttentionRecord], projections: HeadProjections | None,
                      table: CalibrationTable) -> pd.DataFrame:
    """Rows of :func:`pareto.sweep` for each calibrated curve the table holds, at the
    table's targets: the same specs and scoring (``pareto.score_specs``), the predictors
    built from the table (fitted on TRAIN graphs) instead of a fit at sweep time."""
    rows, specs, fitted = [], [], []
    for method in table.params:
        curve = pareto.CURVES.get(method)
        if curve is None:
            continue
        build = table.fitted_for(method)
        for spec in curve.specs:
            if float(spec.param_dict["target_sparsity"]) not in table.targets:
                continue
            try:
                spec.build(projections, 0, build)
            except ValueError:  # e.g. routed k-means without its codebooks
                break
            rows.append(method)
            specs.append(spec)
            fitted.append(build)
    if not specs:
        raise ValueError("the calibration table holds no curve that can run here")
    results, gold = pareto.score_specs(records, projections, specs, fitted=fitted)
    frame = pd.DataFrame([
        {"method": method, "params": spec.params_json(), "recall": result.recall,
         "sparsity": result.sparsity, **result.extra,
         "recall_per_layer": json.dumps([round(x, 6) for x in result.recall_per_layer]),
         "sparsity_per_layer": json.dumps([round(x, 6) for x in result.sparsity_per_layer]),
         "n_texts": result.n_texts}
        for method, spec, result in zip(rows, specs, results, strict=True)
    ])
    frame.attrs["gold_sparsity"] = float(gold.sparsity.mean())
    frame.attrs["gold_sparsity_per_layer"] = [float(x) for x in gold.sparsity]
    return frame
