"""Corpus runs of the app: gold graphs of a validation split and its sweep, with progress.

Both report ``on_progress(fraction, message)`` so the app draws one progress bar; the sweep
itself is ``sweeps.sweep`` (one call for every method, not one call per method).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from sparsefinder.calibration.table import CalibrationTable
from sparsefinder.data.corpus import corpus_texts
from sparsefinder.data.records import AttentionRecord, extract
from sparsefinder.evaluation import curves
from sparsefinder.evaluation import sweep as sweeps
from sparsefinder.methods.spec import PredictorSpec
from sparsefinder.metrics.measures import GraphScores
from sparsefinder.projections.hash_code_table import HashCodeTable
from sparsefinder.projections.heads import HeadProjections

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
    hash_codes: HashCodeTable | None = None,
) -> pd.DataFrame:
    """``sweeps.sweep`` of ``methods`` on ``records``, reporting progress; with a
    ``calibration`` table, also the curves of its calibrated methods (which a sweep fits on
    train records the app has not extracted), read from the table and built with its own
    projections (``calibration_projections``; default ``projections``); with ``hash_codes``
    (learned on train graphs), the ``hashattention`` curve."""
    if not methods and calibration is None and hash_codes is None:
        raise ValueError("no sweep method can run here (learned methods need projections)")
    frames = []
    if methods:
        frames.append(sweeps.sweep(records, projections, list(methods), on_progress=on_progress))
    if calibration is not None:
        frames.append(calibrated_curves(records, calibration_projections or projections,
                                        calibration))
    if hash_codes is not None:
        frames.append(fitted_curve(records, "hashattention", hash_codes.maps))
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    frame.attrs = dict(frames[0].attrs)
    return frame


def text_curves(methods: Sequence[str], calibration: CalibrationTable | None = None,
                hash_codes: HashCodeTable | None = None) -> list[str]:
    """Every curve :func:`sweep_records` draws with these parts, in its row order: the swept
    ``methods``, the table's calibrated curves, then ``hashattention`` when codes are given."""
    table_curves = [m for m in calibration.methods() if m in curves.CURVES] if (
        calibration is not None) else []
    return [*methods, *table_curves, *(["hashattention"] if hash_codes is not None else [])]


def sweep_curve(
    records: Sequence[AttentionRecord],
    projections: HeadProjections | None,
    curve: str,
    calibration: CalibrationTable | None = None,
    calibration_projections: HeadProjections | None = None,
    hash_codes: HashCodeTable | None = None,
) -> pd.DataFrame:
    """The rows of ONE curve of :func:`sweep_records` (same specs, same scoring): a view that
    draws a few curves sweeps only those, and caches each on its own. A calibrated curve the
    table holds but cannot build here (routed k-means without its codebooks) has no rows."""
    if calibration is not None and curve in calibration.methods():
        try:
            return calibrated_curves(records, calibration_projections or projections,
                                     calibration, names=[curve])
        except ValueError:  # the table's curve cannot run with these parts
            return pd.DataFrame(columns=["method"])
    if curve == "hashattention" and hash_codes is not None:
        return fitted_curve(records, curve, hash_codes.maps)
    return sweeps.sweep(records, projections, [curve])


def fitted_curve(records: Sequence[AttentionRecord], name: str, fitted: Any) -> pd.DataFrame:
    """Rows of :func:`sweeps.sweep` for curve ``name`` built from ``fitted`` (what
    ``spec.fit(train_records)`` would return, e.g. bundled hash codes): same specs, same
    scoring, no training graphs needed."""
    specs = list(curves.CURVES[name].specs)
    results, gold = sweeps.score_specs(records, None, specs, fitted=[fitted] * len(specs))
    return _points_frame([name] * len(specs), specs, results, gold)


def _points_frame(names: Sequence[str], specs: Sequence[PredictorSpec],
                  results: Sequence[sweeps.SpecScores], gold: GraphScores) -> pd.DataFrame:
    """Scored specs as rows shaped like :func:`sweeps.sweep`'s (gold sparsity in attrs)."""
    frame = sweeps.points_frame(list(zip(names, specs, strict=True)), results)
    frame.attrs["gold_sparsity"] = float(gold.sparsity.mean())
    frame.attrs["gold_sparsity_per_layer"] = [float(x) for x in gold.sparsity]
    return frame


def calibrated_curves(records: Sequence[AttentionRecord], projections: HeadProjections | None,
                      table: CalibrationTable, names: Sequence[str] | None = None
                      ) -> pd.DataFrame:
    """Rows of :func:`sweeps.sweep` for each calibrated curve the table holds (or those of
    ``names`` it holds), at the table's targets: the same specs and scoring
    (``sweeps.score_specs``), the predictors built from the table (fitted on TRAIN graphs)
    instead of a fit at sweep time."""
    rows, specs, fitted = [], [], []
    for method in table.methods() if names is None else [m for m in table.methods()
                                                          if m in names]:
        curve = curves.CURVES.get(method)
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
    results, gold = sweeps.score_specs(records, projections, specs, fitted=fitted)
    return _points_frame(rows, specs, results, gold)
