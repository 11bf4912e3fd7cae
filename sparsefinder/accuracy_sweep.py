"""Sparsity–accuracy sweeps: every grid point run through the restricted model, and frontiers.

For each configuration of each method (the same registry and grids as the sparsity–recall
sweep, :data:`sparsefinder.pareto.METHODS`) the model runs on every text with attention
restricted to that configuration's predicted graphs (:mod:`sparsefinder.restricted`: each
layer predicts from its own restricted-run q/k), and the output is compared with one full
α-entmax run (:mod:`sparsefinder.accuracy`). Sparsity here is measured on the graphs entmax
actually ran over in the restricted run (the prediction, plus the diagonal of any row it left
empty; :class:`~sparsefinder.restricted.RestrictionStats`), macro over texts, heads, layers as
in :mod:`sparsefinder.metrics`. It differs slightly from the recall sweep's, which predicts
from the full run's q/k (``sweep_sparsity`` in the output files).

Frontiers are per method and measure: the points that no other point of that method beats
on both sparsity and the measure. :func:`dominance` asks, per measure and baseline, whether
the best Sparsefinder method is at least as accurate at every sparsity level where the
baseline has a configuration (the step rule of :func:`sparsefinder.pareto.recall_at_sparsity`:
the best value among frontier points at that sparsity or sparser).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from tqdm.auto import tqdm

from sparsefinder.accuracy import EncodedTexts, compare, encode
from sparsefinder.graphs import AttentionRecord
from sparsefinder.models import LoadedModel
from sparsefinder.pareto import METHODS, resolve_methods
from sparsefinder.predictors.base import Predictor
from sparsefinder.projections import HeadProjections, ProjectionsError
from sparsefinder.restricted import GraphFn, RestrictionStats, predictor_graph

MEASURES = ("output_cosine", "embedding_cosine", "retrieval_top1", "retrieval_ndcg10")
MEASURE_LABELS = {
    "output_cosine": "output cosine (token states)",
    "embedding_cosine": "sentence-embedding cosine",
    "retrieval_top1": "retrieval top-1 agreement",
    "retrieval_ndcg10": "retrieval nDCG@10 vs full",
}
SPARSITY_LEVELS = (0.75, 0.9, 0.95)
#: Methods that are Sparsefinder proper (learned projections), with or without a window.
SPARSEFINDER_FAMILIES = ("distance", "kmeans", "kmeans-top2", "quantization")
DOMINANCE_BASELINES = ("window", "longformer", "bigbird")
DOMINANCE_LEVELS = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))  # 0.50 … 0.95


def is_sparsefinder(method: str) -> bool:
    return method.split("+")[0] in SPARSEFINDER_FAMILIES


def config_graph(
    method: str,
    params: dict[str, Any],
    projections: HeadProjections | None,
    num_layers: int,
    *,
    factory: Callable[..., Predictor] | None = None,
    model_name: str = "MODEL",
) -> GraphFn:
    """The restricted-attention graph function of one grid point of a registered method.

    ``factory`` overrides the method's own (for methods fitted on training graphs). Every
    layer's predictor is built up front, so a missing centroid set fails before any forward.
    """
    spec = METHODS[method]
    if spec.inputs == "projected" and projections is None:
        from sparsefinder.restricted import projections_required

        raise projections_required(model_name, f"method {method!r}")
    build = factory or spec.factory
    built = [build(params, projections, layer) for layer in range(num_layers)]
    return predictor_graph(
        built.__getitem__, spec.inputs, projections, model_name=model_name,
        what=f"method {method!r}",
    )


def accuracy_sweep(
    loaded: LoadedModel,
    texts: Sequence[str],
    projections: HeadProjections | None,
    methods: str | Sequence[str] = "sparsefinder",
    *,
    train_records: Sequence[AttentionRecord] | None = None,
    batch_size: int = 8,
    model_name: str = "MODEL",
    progress: bool = False,
    reference: EncodedTexts | None = None,
) -> pd.DataFrame:
    """One row per configuration: in-run ``sparsity`` and every measure of
    :func:`sparsefinder.accuracy.compare`. Methods needing training graphs are skipped
    without ``train_records``; configurations the projections cannot build are skipped.
    ``repaired_rows`` is the fraction of (head, query) rows the graph left empty, which kept
    their diagonal (no warning per row here; the column reports them)."""
    names = resolve_methods(methods)
    if not texts:
        raise ValueError("the accuracy sweep needs at least one text")
    run = dict(batch_size=batch_size, max_length=loaded.max_length)
    if reference is None:
        reference = encode(loaded.model, loaded.tokenizer, texts, **run)
    configs: list[tuple[str, dict[str, Any], Callable[..., Predictor] | None]] = []
    for name in names:
        spec = METHODS[name]
        if spec.fit is not None:
            if not train_records:
                continue
            factory = spec.fit(train_records)
        else:
            factory = None
        configs.extend((name, dict(p), factory) for p in spec.grid)
    rows = []
    bar = tqdm(configs, desc="accuracy", unit="config", disable=not progress)
    for name, params, factory in bar:
        bar.set_postfix_str(f"{name} {json.dumps(params, sort_keys=True)}")
        try:
            graph_fn = config_graph(name, params, projections, loaded.num_layers,
                                    factory=factory, model_name=model_name)
        except ProjectionsError:  # e.g. no centroids stored for this B
            continue
        stats = RestrictionStats()
        restricted = encode(loaded.model, loaded.tokenizer, texts, graph_fn=graph_fn,
                            warn_empty=False, stats=stats, **run)
        scores = compare(reference, restricted)
        overall, per_layer = stats.sparsity()
        per_layer = [round(x, 6) for x in per_layer]
        rows.append({
            "method": name, "params": json.dumps(params, sort_keys=True), "sparsity": overall,
            **{m: scores.get(m, math.nan) for m in MEASURES},
            "layer_cosine": json.dumps(scores.get("layer_cosine", [])),
            "sparsity_per_layer": json.dumps(per_layer),
            "repaired_rows": stats.repaired_fraction, "n_texts": len(texts),
        })
    bar.close()
    return pd.DataFrame(rows)


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


# ==================================================================== figure and files

_PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
            "#17becf", "#bcbd22", "#7f7f7f"]


def accuracy_figure(
    df: pd.DataFrame, gold_sparsity: float | None, title: str = "Sparsity–accuracy",
    measures: Sequence[str] = MEASURES,
) -> go.Figure:
    """One panel per measure: every point (faint), each method's frontier (line), full
    entmax as a star (accuracy 1 at the gold sparsity) and the gold sparsity as a line."""
    cols = 2
    rows = math.ceil(len(measures) / cols)
    fig = make_subplots(rows=rows, cols=cols,
                        subplot_titles=[MEASURE_LABELS.get(m, m) for m in measures])
    families: dict[str, str] = {}
    for index, measure in enumerate(measures):
        r, c = index // cols + 1, index % cols + 1
        front = frontier(df, measure)
        for method in dict.fromkeys(df["method"]):
            color = families.setdefault(method.split("+")[0],
                                        _PALETTE[len(families) % len(_PALETTE)])
            dash = "dash" if "+" in method else "solid"
            hover = ("%{customdata}<br>sparsity=%{x:.4f}<br>" + measure + "=%{y:.4f}<extra>"
                     + method + "</extra>")
            points = df[df["method"] == method]
            line = front[front["method"] == method]
            fig.add_trace(go.Scatter(
                x=points["sparsity"], y=points[measure], customdata=points["params"],
                mode="markers", marker={"color": color, "opacity": 0.3, "size": 5},
                legendgroup=method, showlegend=False, hovertemplate=hover,
            ), row=r, col=c)
            fig.add_trace(go.Scatter(
                x=line["sparsity"], y=line[measure], customdata=line["params"],
                mode="lines+markers", line={"color": color, "dash": dash},
                marker={"color": color, "size": 7}, legendgroup=method, name=method,
                showlegend=index == 0, hovertemplate=hover,
            ), row=r, col=c)
        if gold_sparsity is not None:
            fig.add_trace(go.Scatter(
                x=[gold_sparsity], y=[1.0], mode="markers", name="full entmax",
                marker={"symbol": "star", "size": 15, "color": "black"},
                legendgroup="full", showlegend=index == 0,
                hovertemplate="full α-entmax<br>gold sparsity=%{x:.4f}<extra></extra>",
            ), row=r, col=c)
            fig.add_vline(x=gold_sparsity, line_dash="dash", line_color="black", row=r, col=c)
        fig.update_xaxes(title_text="sparsity", range=[0, 1.0], row=r, col=c)
    fig.update_layout(title=title, template="plotly_white", height=420 * rows,
                      legend={"title": "method (frontier)"})
    return fig


def write_outputs(
    df: pd.DataFrame, out: Path, *, gold_sparsity: float | None, title: str,
    summary: dict[str, Any], recall_points: pd.DataFrame | None = None,
) -> dict[str, pd.DataFrame]:
    """Write accuracy_points.csv, accuracy_frontier.csv, accuracy_at_sparsity.csv,
    accuracy_dominance.csv, accuracy.json and pareto_accuracy.html into ``out``."""
    from sparsefinder.pareto import write_figure_html

    out.mkdir(parents=True, exist_ok=True)
    if recall_points is not None and len(recall_points) and len(df):
        joined = recall_points[["method", "params", "recall", "sparsity"]].rename(
            columns={"sparsity": "sweep_sparsity"})
        df = df.merge(joined, on=["method", "params"], how="left")
    fronts = pd.concat(
        [frontier(df, m).assign(measure=m) for m in MEASURES if m in df], ignore_index=True
    ) if len(df) else df
    at = at_sparsity(df) if len(df) else df
    dom = dominance(df) if len(df) else df
    df.to_csv(out / "accuracy_points.csv", index=False)
    fronts.to_csv(out / "accuracy_frontier.csv", index=False)
    at.to_csv(out / "accuracy_at_sparsity.csv", index=False)
    dom.to_csv(out / "accuracy_dominance.csv", index=False)
    payload = {
        **summary, "gold_sparsity": gold_sparsity, "measures": list(MEASURES),
        "points": json.loads(df.to_json(orient="records")),
        "at_sparsity": json.loads(at.to_json(orient="records")),
        "dominance": json.loads(dom.to_json(orient="records")),
    }
    (out / "accuracy.json").write_text(json.dumps(payload, indent=1), encoding="utf-8")
    if len(df):
        write_figure_html(accuracy_figure(df, gold_sparsity, title), out / "pareto_accuracy.html")
    return {"points": df, "frontier": fronts, "at_sparsity": at, "dominance": dom}
