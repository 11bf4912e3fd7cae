"""`sparsefinder sweep`: sparsity–recall points, Pareto frontiers and a plot on held-out text.

Writes DIR/points.csv, DIR/points.json (points plus gold sparsity), DIR/frontier.csv,
DIR/recall_at_sparsity.csv, DIR/metrics_at_sparsity.csv (precision, exact fraction, mass
recall and block recall of the configuration behind each R@level) and DIR/pareto.html
(self-contained, opens offline). Every point carries all metrics (``metrics.EXTRA_METRICS``).

Methods learned from training gold graphs (the SparseBERT static masks) are fitted on the
first ``--train-passages`` passages of the TRAIN split of the same corpus, never on the
split being evaluated.

Without ``--projections`` the default model is swept with the bundle's best projections
(:func:`sparsefinder.bundle.Bundle.best`: r = 8 lowrank-mass, the file the calibration
table was fitted for). They hold no k-means centroids, so the k-means curves are skipped and a
note names the bundle's projections with centroids to sweep them with.

``--records DIR`` sweeps a shard store instead of extracting (under torchrun each rank scores
its chunks; :mod:`sparsefinder.evaluation.sharded_sweep` reduces the sums exactly).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import pandas as pd

from sparsefinder.bundle import bundle
from sparsefinder.commands._common import (
    add_corpus_arguments,
    add_model_arguments,
    load_from_args,
    passages_label,
    progress_bar,
)
from sparsefinder.data.corpus import CorpusError, corpus_texts
from sparsefinder.data.records import AttentionRecord, extract
from sparsefinder.evaluation.curves import (
    CURVES,
    available_curves,
    curve_display_name,
    resolve_methods,
    with_labels,
)
from sparsefinder.evaluation.frontier import (
    metrics_at_sparsity,
    pareto_frontier,
    recall_at_sparsity,
)
from sparsefinder.evaluation.sweep import sweep
from sparsefinder.figures.common import write_figure_html
from sparsefinder.figures.pareto import pareto_figure
from sparsefinder.models.loading import DEFAULT_MODEL, LoadedModel
from sparsefinder.projections.heads import HeadProjections

_JSON_COLUMNS = ("params", "recall_per_layer", "sparsity_per_layer")


def methods_epilog() -> str:
    """``--methods`` choices, one a line: ``id — display name`` (the names the legends, the
    CSVs' ``label`` column and the app show)."""
    width = max(len(name) for name in CURVES)
    lines = [f"  {name:<{width}}  — {curve_display_name(name)}" for name in CURVES]
    return "curves for --methods (id — display name):\n" + "\n".join(lines)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "sweep", help="sparsity-recall sweep of predictors on held-out text, with Pareto plot",
        epilog=methods_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser)
    add_corpus_arguments(parser, default_split="validation")
    parser.add_argument(
        "--projections", type=Path, default=None,
        help="projections file from `sparsefinder train` (default for --model default: the "
             "bundle's best, assets/default/projections-r8-lowrank-mass.pt)",
    )
    parser.add_argument("--out", required=True, type=Path, help="folder for the results")
    parser.add_argument(
        "--methods", default="sparsefinder",
        help="'sparsefinder' (distance, kmeans, quantization, each +window, window), "
             "'calibrated' (each family with its parameters set per head from a target on "
             "train passages: distance:budget, rowfrac:budget, window:budget, …), 'baselines' "
             "(longformer, bigbird, reformer, routing, topk, sparsebert-*, ...), "
             "'long-context', 'all', or a comma list of curves (FAMILY or "
             "FAMILY:CALIBRATION, e.g. distance:budget); every curve with its name: below",
    )
    parser.add_argument("--batch", type=int, default=8, help="texts per forward pass")
    parser.add_argument(
        "--train-passages", type=int, default=60,
        help="passages of the TRAIN split (first N) whose gold graphs fit methods learned "
             "from training graphs (sparsebert-dams/-damu); 0 skips those methods",
    )
    parser.add_argument(
        "--accuracy", action="store_true",
        help="also run the model restricted to every grid point's predicted graphs and write "
             "sparsity-accuracy frontiers (accuracy_*.csv, accuracy.json, pareto_accuracy.html)",
    )
    parser.add_argument(
        "--records", type=Path, default=None,
        help="sweep a shard store from `sparsefinder extract --sharded`/torchrun "
             "(DIR/records-SPLIT) instead of extracting; under `torchrun --nproc_per_node=N "
             "-m sparsefinder sweep --records ...` each rank scores its chunks and the macro "
             "averages are all-reduced (model, alpha and split come from the store)",
    )
    return parser


def _projections_path(args: argparse.Namespace) -> Path:
    if args.projections is not None:
        return args.projections
    if args.model == DEFAULT_MODEL:
        return bundle().best("projections")
    raise ValueError(
        f"--projections is required for model {args.model!r}; create them with "
        f"`sparsefinder train --model {args.model} --out DIR` and pass DIR/projections.pt"
    )


def _note_centroids(args: argparse.Namespace, projections: HeadProjections,
                    methods: list[str]) -> None:
    """With the default projections, say which curves need centroids they lack, and how to
    sweep them (the bundle's best projections with centroids)."""
    if args.projections is not None:
        return
    untrained = [m for m in methods if not CURVES[m].needs_training]
    _, skipped = available_curves(projections, untrained)
    lacking = [m for m, why in skipped.items() if "centroids" in why]
    if lacking:
        print(f"note: the default projections ({bundle().best('projections').name}, the best "
              f"bundled) hold no k-means centroids: skipping {', '.join(lacking)}; sweep them "
              f"with --projections {bundle().best('centroids')}")


def _train_records(
    args: argparse.Namespace, loaded: LoadedModel, methods: list[str]
) -> list[AttentionRecord] | None:
    """Gold graphs of the first ``--train-passages`` TRAIN passages, if a method needs them."""
    trained = [m for m in methods if CURVES[m].needs_training]
    if not trained or args.train_passages <= 0:
        return None
    try:
        texts = corpus_texts(args.corpus, "train", loaded.tokenizer, loaded.max_length,
                             args.train_passages)
    except CorpusError as error:  # e.g. a tiny corpus whose passages are all validation
        print(f"warning: {error}; skipping {', '.join(trained)}")
        return None
    print(f"fitting {', '.join(trained)} on the first {args.train_passages} passages of the "
          f"train split -> {len(texts)} texts")
    return extract(loaded, texts, batch_size=args.batch, progress=True)


def _write_results(points: pd.DataFrame, out: Path, summary: dict, title: str) -> None:
    """points.csv/.json, frontier.csv, recall_at_sparsity.csv, metrics_at_sparsity.csv and
    pareto.html in ``out``."""
    frontier = pareto_frontier(points)  # once: a frontier's own frontier is itself
    at = recall_at_sparsity(frontier)
    metrics_at = metrics_at_sparsity(frontier)
    out.mkdir(parents=True, exist_ok=True)
    with_labels(points).to_csv(out / "points.csv", index=False)
    with_labels(frontier).to_csv(out / "frontier.csv", index=False)
    with_labels(at).to_csv(out / "recall_at_sparsity.csv", index=False)
    with_labels(metrics_at).to_csv(out / "metrics_at_sparsity.csv", index=False)
    gold = points.attrs["gold_sparsity"]
    gold_layers = points.attrs["gold_sparsity_per_layer"]
    summary = {
        **summary, "gold_sparsity": gold, "gold_sparsity_per_layer": gold_layers,
        "points": [
            {**row, **{key: json.loads(row[key]) for key in _JSON_COLUMNS}}
            for row in json.loads(points.to_json(orient="records"))
        ],
    }
    (out / "points.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    figure = pareto_figure(points, gold, title=title, frontier=frontier)
    write_figure_html(figure, out / "pareto.html")
    print(f"gold sparsity: {gold:.4f} (per layer: "
          f"{', '.join(f'{x:.4f}' for x in gold_layers)})")
    print(at.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    at_90 = metrics_at[metrics_at["level"] == 0.9].drop(columns=["level", "params"])
    if not at_90.empty:
        print("every metric at the configuration behind R@0.9:")
        print(at_90.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"wrote {len(points)} points to {out}/ (points.csv, points.json, frontier.csv, "
          "recall_at_sparsity.csv, metrics_at_sparsity.csv, pareto.html)")


def _run_from_store(args: argparse.Namespace, methods: list[str]) -> int:
    """Sweep a shard store: each torchrun rank streams its chunks, sums are all-reduced."""
    from sparsefinder import distributed
    from sparsefinder.data.shards import ShardedRecords
    from sparsefinder.evaluation.sharded_sweep import sweep_streaming

    if args.accuracy:
        raise ValueError("--accuracy reruns the model on texts and cannot read --records; "
                         "drop --records (or --accuracy)")
    learned = [m for m in methods if CURVES[m].needs_training]
    if learned:
        print(f"note: skipping {', '.join(learned)} with --records (they are fitted on "
              "training gold graphs; sweep without --records to include them)")
        methods = [m for m in methods if m not in learned]
        if not methods:
            raise ValueError(f"--records cannot sweep only {', '.join(learned)}; add other "
                             "--methods or drop --records")
    with distributed.torchrun_group(args.device) as world:
        store = ShardedRecords(args.records)
        model_id, alpha = store.manifest["model_id"], float(store.manifest["alpha"])
        if args.projections is None and model_id != DEFAULT_MODEL:
            raise ValueError(f"--projections is required for the shards of model {model_id!r} "
                             f"in {args.records}; pass the file from `sparsefinder train`")
        path = (args.projections if args.projections is not None
                else bundle().best("projections"))
        projections = HeadProjections.load(path, expected_model_id=model_id,
                                           expected_alpha=alpha)
        if world.is_main:
            _note_centroids(args, projections, methods)
        split = store.manifest.get("split")
        if split == "train" or projections.metadata.get("split") == split:
            print(f"warning: evaluating on the {split} split the projections were trained on")
        points = sweep_streaming(store.iter_records(world.rank, world.size), projections,
                                 projections.num_layers, methods)
        if world.is_main:
            n_texts = int(points["n_texts"].iloc[0])
            summary = {"model": model_id, "alpha": alpha, "records": str(args.records),
                       "corpus": store.manifest.get("corpus"), "split": split,
                       "n_texts": n_texts, "ranks": world.size}
            title = f"Sparsity–recall, {model_id}, {split} split ({n_texts} texts)"
            _write_results(points, Path(args.out), summary, title)
    return 0


def _resolve(spec: str) -> list[str]:
    """``--methods`` → curve names; an old method name is read as its new one, with a note."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FutureWarning)
        methods = resolve_methods(spec)  # fail on a typo before loading anything
    for warning in caught:
        print(f"note: {warning.message}", file=sys.stderr)
    return methods


def run(args: argparse.Namespace) -> int:
    methods = _resolve(args.methods)
    if args.records is not None:
        return _run_from_store(args, methods)
    loaded = load_from_args(args)
    projections = HeadProjections.load(
        _projections_path(args), expected_model_id=loaded.model_id, expected_alpha=loaded.alpha
    )
    if args.max_passages is not None and args.max_passages < 1:
        raise ValueError(
            f"the {args.split} split of corpus {args.corpus} has no passages to evaluate on "
            f"with --max-passages {args.max_passages}; raise --max-passages"
        )
    texts = corpus_texts(args.corpus, args.split, loaded.tokenizer, loaded.max_length,
                         args.max_passages)
    if args.split == "train" or projections.metadata.get("split") == args.split:
        print(f"warning: evaluating on the {args.split} split the projections were trained on")
    _note_centroids(args, projections, methods)
    print(f"model {loaded.model_id}; {passages_label(args.max_passages)} passages of the "
          f"{args.split} split -> {len(texts)} texts; "
          f"methods: {', '.join(methods)}")
    records = extract(loaded, texts, batch_size=args.batch, progress=True)
    train_records = _train_records(args, loaded, methods)
    with progress_bar("sweep") as on_progress:
        points = sweep(records, projections, methods, train_records=train_records,
                       on_progress=on_progress)
    summary = {"model": loaded.model_id, "alpha": loaded.alpha, "corpus": str(args.corpus),
               "split": args.split, "n_texts": len(records)}
    title = f"Sparsity–recall, {loaded.model_id}, {args.split} split ({len(records)} texts)"
    out = Path(args.out)
    _write_results(points, out, summary, title)
    if args.accuracy:
        from sparsefinder.commands._accuracy import run_accuracy

        run_accuracy(args, loaded, texts, projections, methods, train_records, points, out)
    return 0
