"""Sparsity–accuracy sweeps: every grid point run through the restricted model, and frontiers.

For each grid point of each curve (the same curves and grids as the sparsity–recall sweep,
:data:`sparsefinder.evaluation.curves.CURVES`, each point a
:class:`~sparsefinder.methods.spec.PredictorSpec`)
the model runs on every text with attention
restricted to that configuration's predicted graphs (:mod:`sparsefinder.evaluation.restricted`: each
layer predicts from its own restricted-run q/k), and the output is compared with one full
α-entmax run (:mod:`sparsefinder.evaluation.accuracy`). Sparsity here is measured on the graphs
entmax
actually ran over in the restricted run (the prediction, plus the diagonal of any row it left
empty; :class:`~sparsefinder.evaluation.restricted.RestrictionStats`), macro over texts, heads,
layers as
in :mod:`sparsefinder.metrics`. It differs slightly from the recall sweep's, which predicts
from the full run's q/k (``sweep_sparsity`` in the output files).

Frontiers are per method and measure: the points that no other point of that method beats
on both sparsity and the measure. :func:`dominance` asks, per measure and baseline, whether
the best Sparsefinder method is at least as accurate at every sparsity level where the
baseline has a configuration (the step rule of
:func:`sparsefinder.evaluation.frontier.recall_at_sparsity`:
the best value among frontier points at that sparsity or sparser).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sparsefinder.data.records import AttentionRecord
from sparsefinder.evaluation.accuracy import EncodedTexts, compare, encode
from sparsefinder.evaluation.curves import CURVES, resolve_methods, shown_params, with_labels
from sparsefinder.evaluation.frontier import SPARSITY_LEVELS
from sparsefinder.evaluation.plan import plan_sweep
from sparsefinder.evaluation.restricted import RestrictionStats, projections_required, spec_graph
from sparsefinder.methods.spec import PredictorSpec
from sparsefinder.models.loading import LoadedModel
from sparsefinder.projections.heads import HeadProjections

ProgressFn = Callable[[float, str], None]

MEASURES = ("output_cosine", "embedding_cosine", "retrieval_top1", "retrieval_ndcg10")
MEASURE_LABELS = {
    "output_cosine": "output cosine (token states)",
    "embedding_cosine": "sentence-embedding cosine",
    "retrieval_top1": "retrieval top-1 agreement",
    "retrieval_ndcg10": "retrieval nDCG@10 vs full",
}
#: Methods that are Sparsefinder proper (learned projections), with or without a window.
SPARSEFINDER_FAMILIES = ("distance", "kmeans", "kmeans-top2", "quantization")
DOMINANCE_BASELINES = ("window", "longformer", "bigbird")
DOMINANCE_LEVELS = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))  # 0.50 … 0.95


def is_sparsefinder(method: str) -> bool:
    return method.split("+")[0] in SPARSEFINDER_FAMILIES


@dataclasses.dataclass(frozen=True)
class ExtraPoint:
    """A setting an accuracy sweep adds to its grid, with what it is built from."""

    curve: str
    spec: PredictorSpec
    projections: HeadProjections | None = None
    fitted: Any = None


def accuracy_sweep(
    loaded: LoadedModel,
    texts: Sequence[str],
    projections: HeadProjections | None,
    methods: str | Sequence[str] = "sparsefinder",
    *,
    train_records: Sequence[AttentionRecord] | None = None,
    batch_size: int = 8,
    model_name: str = "MODEL",
    on_progress: ProgressFn | None = None,
    reference: EncodedTexts | None = None,
    extra: Sequence[ExtraPoint] = (),
) -> pd.DataFrame:
    """One row per grid point (then one per ``extra`` point: a setting built from parts the
    caller holds, e.g. a calibrated curve read from a bundled table, which a sweep fits on
    train graphs): in-run ``sparsity`` and every measure of
    :func:`sparsefinder.evaluation.accuracy.compare`. Curves learned from training graphs are
    skipped
    without ``train_records``; grid points the projections cannot build (k-means without
    centroids for that B) are skipped. ``repaired_rows`` is the fraction of (head, query) rows
    the graph left empty, which kept their diagonal (no warning per row here; the column
    reports them). ``on_progress(fraction, message)`` is called after each grid point."""
    names = resolve_methods(methods)
    if not texts:
        raise ValueError("the accuracy sweep needs at least one text")
    run = dict(batch_size=batch_size, max_length=loaded.max_length)
    if reference is None:
        reference = encode(loaded.model, loaded.tokenizer, texts, **run)
    if any(CURVES[n].needs_projections for n in names) and projections is None:
        raise projections_required(model_name, f"methods {names}")
    points = plan_sweep(names, projections, loaded.num_layers, train_records).points
    todo = [(p.curve, p.spec, functools.partial(spec_graph, p.spec, projections,
                                                predictors=p.predictors)) for p in points]
    todo += [(e.curve, e.spec, functools.partial(spec_graph, e.spec, e.projections,
                                                 fitted=e.fitted)) for e in extra]
    rows = []
    for index, (name, spec, graph_of) in enumerate(todo):
        clock = [0.0]
        graph_fn = _timed(graph_of(loaded.num_layers, model_name=model_name), clock)
        stats = RestrictionStats()
        restricted = encode(loaded.model, loaded.tokenizer, texts, graph_fn=graph_fn,
                            warn_empty=False, stats=stats, **run)
        scores = compare(reference, restricted)
        overall, per_layer = stats.sparsity()
        rows.append({
            "method": name, "params": shown_params(name, spec), "sparsity": overall,
            **{m: scores.get(m, math.nan) for m in MEASURES},
            "layer_cosine": json.dumps(scores.get("layer_cosine", [])),
            "sparsity_per_layer": json.dumps([round(x, 6) for x in per_layer]),
            "repaired_rows": stats.repaired_fraction, "n_texts": len(texts),
            "predict_ms": 1000 * clock[0] / len(texts),
        })
        if on_progress is not None:
            on_progress((index + 1) / len(todo), f"{name} {spec.params_json()}")
    return pd.DataFrame(rows)


def _timed(graph_fn: Callable[..., Any], clock: list[float]) -> Callable[..., Any]:
    """``graph_fn`` adding the seconds its calls take to ``clock[0]``: a point's prediction
    cost (every layer, its projections included) apart from the model's forward."""
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return graph_fn(*args, **kwargs)
        finally:
            clock[0] += time.perf_counter() - start
    return timed


# ==================================================================== frontiers


def frontier(df: pd.DataFrame, measure: str) -> pd.DataFrame:
    """Per method, the points no other point of that method beats on sparsity and
    ``measure`` (sorted by sparsity); NaN values are dropped."""
    parts = []
    for _, group in df.dropna(subset=[measure]).groupby("method", sort=False):
        ordered = group.sort_values(["sparsity", measure], ascending=False, kind="stable")
        keep, best = [], -math.inf
        for index, value in ordered[measure].items():
            if value > best:
                keep.append(index)
                best = value
        parts.append(group.loc[keep].sort_values("sparsity", kind="stable"))
    return pd.concat(parts) if parts else df.iloc[0:0]


def value_at(front: pd.DataFrame, measure: str, level: float) -> float:
    """Best ``measure`` among points at sparsity ≥ ``level``; NaN if none is that sparse."""
    above = front[front["sparsity"] >= level]
    return float(above[measure].max()) if len(above) else math.nan


def at_sparsity(
    df: pd.DataFrame, measures: Sequence[str] = MEASURES,
    levels: Sequence[float] = SPARSITY_LEVELS,
) -> pd.DataFrame:
    """One row per method: ``{measure}@{level}`` by the step rule (:func:`value_at`)."""
    rows = []
    for method in dict.fromkeys(df["method"]):
        row: dict[str, Any] = {"method": method}
        for measure in measures:
            front = frontier(df[df["method"] == method], measure)
            for level in levels:
                row[f"{measure}@{level:g}"] = value_at(front, measure, level)
        rows.append(row)
    return pd.DataFrame(rows)


#: Columns of :func:`accuracy_table`: the graph's own measures (from the recall sweep of the
#: same configuration) beside what it does to the model, and what its prediction cost
#: (``predict_ms``: per text, every layer, measured inside the restricted forward).
TABLE_COLUMNS = ("sparsity", "recall", "mass_recall", "exact_fraction", "output_cosine",
                 "embedding_cosine", "retrieval_top1", "retrieval_ndcg10", "predict_ms")


def accuracy_table(df: pd.DataFrame, levels: Sequence[float] = SPARSITY_LEVELS,
                   by: str = "output_cosine") -> pd.DataFrame:
    """One row per method and sparsity level: the configuration behind ``{by}@{level}`` of
    :func:`at_sparsity` (the highest ``by`` among points at in-run sparsity ≥ level), with
    all of its :data:`TABLE_COLUMNS` (recall, mass recall and exact rows need the recall
    sweep's columns, see :func:`write_outputs`; NaN without them). Why one configuration per
    row: the measures of a row then describe one graph, not the best of each measure."""
    rows = []
    for method in dict.fromkeys(df["method"]):
        points = df[(df["method"] == method)].dropna(subset=[by])
        for level in levels:
            row: dict[str, Any] = {"method": method, "level": level}
            above = points[points["sparsity"] >= level]
            if len(above):
                best = above.loc[above[by].idxmax()]
                row["params"] = best["params"]
                row.update({c: float(best[c]) if c in best else math.nan
                            for c in TABLE_COLUMNS})
            else:
                row.update({"params": "", **dict.fromkeys(TABLE_COLUMNS, math.nan)})
            rows.append(row)
    return pd.DataFrame(rows, columns=["method", "level", "params", *TABLE_COLUMNS])


def dominance(
    df: pd.DataFrame, measures: Sequence[str] = MEASURES,
    baselines: Sequence[str] = DOMINANCE_BASELINES, levels: Sequence[float] = DOMINANCE_LEVELS,
) -> pd.DataFrame:
    """Per measure and baseline: at how many levels the best Sparsefinder method is at least
    as accurate as the baseline (levels where the baseline has no point are not compared)."""
    ours = df[df["method"].map(is_sparsefinder)]
    rows = []
    for measure in measures:
        best = frontier(ours.assign(method="sparsefinder"), measure) if len(ours) else ours
        for baseline in baselines:
            theirs = frontier(df[df["method"] == baseline], measure)
            if theirs.empty or best.empty:
                continue
            compared, wins, worst = 0, 0, math.inf
            for level in levels:
                b = value_at(theirs, measure, level)
                if math.isnan(b):
                    continue
                s = value_at(best, measure, level)
                compared += 1
                margin = (s - b) if not math.isnan(s) else -math.inf
                wins += margin >= 0
                worst = min(worst, margin)
            rows.append({
                "measure": measure, "baseline": baseline, "levels_compared": compared,
                "levels_sparsefinder_ge": wins, "dominates": compared > 0 and wins == compared,
                "worst_margin": worst if compared else math.nan,
            })
    return pd.DataFrame(rows)


# ==================================================================== files

def write_outputs(
    df: pd.DataFrame, out: Path, *, gold_sparsity: float | None,
    summary: dict[str, Any], recall_points: pd.DataFrame | None = None,
) -> dict[str, pd.DataFrame]:
    """Write accuracy_points.csv, accuracy_frontier.csv, accuracy_at_sparsity.csv,
    accuracy_table.csv (:func:`accuracy_table`), accuracy_dominance.csv and accuracy.json
    into ``out``; the tables (and the figure the
    caller draws from them, :func:`sparsefinder.figures.accuracy.accuracy_figure`)."""
    out.mkdir(parents=True, exist_ok=True)
    if recall_points is not None and len(recall_points) and len(df):
        graph_columns = [c for c in ("recall", "mass_recall", "exact_fraction")
                         if c in recall_points]
        joined = recall_points[["method", "params", *graph_columns, "sparsity"]].rename(
            columns={"sparsity": "sweep_sparsity"})
        df = df.merge(joined, on=["method", "params"], how="left")
    fronts = pd.concat(
        [frontier(df, m).assign(measure=m) for m in MEASURES if m in df], ignore_index=True
    ) if len(df) else df
    at = at_sparsity(df) if len(df) else df
    table = accuracy_table(df) if len(df) else df
    dom = dominance(df) if len(df) else df
    with_labels(df).to_csv(out / "accuracy_points.csv", index=False)
    with_labels(fronts).to_csv(out / "accuracy_frontier.csv", index=False)
    with_labels(at).to_csv(out / "accuracy_at_sparsity.csv", index=False)
    with_labels(table).to_csv(out / "accuracy_table.csv", index=False)
    with_labels(dom).to_csv(out / "accuracy_dominance.csv", index=False)
    payload = {
        **summary, "gold_sparsity": gold_sparsity, "measures": list(MEASURES),
        "points": json.loads(df.to_json(orient="records")),
        "at_sparsity": json.loads(at.to_json(orient="records")),
        "table": json.loads(table.to_json(orient="records")),
        "dominance": json.loads(dom.to_json(orient="records")),
    }
    (out / "accuracy.json").write_text(json.dumps(payload, indent=1), encoding="utf-8")
    return {"points": df, "frontier": fronts, "at_sparsity": at, "table": table,
            "dominance": dom}
