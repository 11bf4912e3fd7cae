"""`sparsefinder sweep --accuracy`: the sparsity–accuracy half of a sweep (files and table)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from sparsefinder.commands._common import progress_bar
from sparsefinder.data.records import AttentionRecord
from sparsefinder.evaluation.accuracy_sweep import accuracy_sweep, write_outputs
from sparsefinder.figures.accuracy import accuracy_figure
from sparsefinder.figures.common import write_figure_html
from sparsefinder.models.loading import LoadedModel
from sparsefinder.projections.heads import HeadProjections

#: Short headers of the printed accuracy table.
TABLE_HEADERS = {"level": "at", "sparsity": "sparsity", "recall": "recall",
                 "mass_recall": "mass rec", "exact_fraction": "exact rows",
                 "output_cosine": "out cos", "embedding_cosine": "emb cos",
                 "retrieval_top1": "top-1", "retrieval_ndcg10": "nDCG@10"}


def format_table(table: pd.DataFrame) -> str:
    """The accuracy table as printed (method, level, then every measure, 4 decimals)."""
    shown = table.drop(columns=["params"]).rename(columns=TABLE_HEADERS)
    return shown.to_string(index=False, float_format=lambda x: f"{x:.4f}")


def run_accuracy(
    args: argparse.Namespace, loaded: LoadedModel, texts: Sequence[str],
    projections: HeadProjections | None, methods: list[str],
    train_records: Sequence[AttentionRecord] | None, points: pd.DataFrame, out: Path,
) -> None:
    """Run every grid point through the restricted model and write the accuracy files."""
    print(f"accuracy: {len(texts)} texts, full α-entmax reference + one restricted run per "
          "configuration")
    with progress_bar("accuracy") as on_progress:
        df = accuracy_sweep(
            loaded, texts, projections, methods, train_records=train_records,
            batch_size=args.batch, model_name=args.model, on_progress=on_progress,
        )
    gold = points.attrs.get("gold_sparsity")
    title = f"Sparsity–accuracy, {loaded.model_id}, {args.split} split ({len(texts)} texts)"
    summary = {"model": loaded.model_id, "alpha": loaded.alpha, "corpus": str(args.corpus),
               "split": args.split, "n_texts": len(texts)}
    tables = write_outputs(df, out, gold_sparsity=gold, summary=summary, recall_points=points)
    if len(df):
        write_figure_html(accuracy_figure(tables["points"], gold, title),
                          out / "pareto_accuracy.html")
    print(tables["at_sparsity"].to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    if len(tables["table"]):
        print("\nper method and sparsity level, the configuration with the highest output "
              "cosine at that sparsity or sparser (recall, mass recall, exact rows: the same "
              "configuration in the recall sweep):")
        print(format_table(tables["table"]))
    if len(tables["dominance"]):
        print(tables["dominance"].to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"wrote {len(df)} accuracy points to {out}/ (accuracy_points.csv, "
          "accuracy_frontier.csv, accuracy_at_sparsity.csv, accuracy_table.csv, "
          "accuracy_dominance.csv, "
          "accuracy.json, pareto_accuracy.html)")
