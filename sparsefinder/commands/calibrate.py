"""`sparsefinder calibrate`: per-head calibrated settings for a grid of target sparsities.

Fits ``distance:budget`` (per-head distance thresholds; and the same with ``floor``, each
row's ``DEFAULT_FLOOR`` nearest keys capped by the row's length with
``DEFAULT_FLOOR_SHARE``, the floor's density included),
``rowfrac:budget`` (per-head row fractions), ``kmeans-routed:budget`` (per-head key budgets)
and ``window:budget`` (per-head windows) on the TRAIN split's gold graphs for the given
projections and writes a small table the app drives its "target sparsity" slider and its
text sweep's calibrated curves from (see :mod:`sparsefinder.calibration.table`). The table
names its projections file, which the app loads for the table's methods.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sparsefinder.calibration.table import CalibrationTable, file_digest
from sparsefinder.commands._common import add_model_arguments, load_from_args, passages_label
from sparsefinder.data.corpus import corpus_texts
from sparsefinder.data.records import extract
from sparsefinder.projections.heads import HeadProjections


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "calibrate", help="fit calibrated per-head settings (target sparsity) on train graphs")
    add_model_arguments(parser)
    parser.add_argument("--corpus", default="default",
                        help="'default' or a corpus file/folder; its TRAIN split is used")
    parser.add_argument("--max-passages", type=int, default=None, help="use at most N passages")
    parser.add_argument("--projections", required=True, type=Path,
                        help="projections file the table is for (from `sparsefinder train`)")
    parser.add_argument("--out", required=True, type=Path, help="calibration file to write")
    parser.add_argument("--batch", type=int, default=8, help="texts per forward pass")
    return parser


def run(args: argparse.Namespace) -> int:
    loaded = load_from_args(args)
    projections = HeadProjections.load(args.projections, expected_model_id=loaded.model_id,
                                       expected_alpha=loaded.alpha)
    texts = corpus_texts(args.corpus, "train", loaded.tokenizer, loaded.max_length,
                         args.max_passages)
    print(f"model {loaded.model_id}; {passages_label(args.max_passages)} passages of the "
          f"train split -> {len(texts)} texts")
    records = extract(loaded, texts, batch_size=args.batch, progress=True)
    table = CalibrationTable.fit(records, projections, file_digest(args.projections))
    # the app loads these projections for the table's methods, looked up next to the table
    table.projections_file = args.projections.name
    if args.projections.resolve().parent != args.out.resolve().parent:
        print(f"note: the app looks for {args.projections.name} next to {args.out}; copy it "
              "there to use this table in the app")
    table.metadata.update({"corpus": str(args.corpus), "split": "train",
                           "alpha": loaded.alpha})
    path = table.save(args.out)
    for method in table.params:
        at = table.index(0.9)
        print(f"{method}:budget: train sparsity at target 0.90 = "
              f"{float(table.train_sparsity[method][at].mean()):.4f}, train recall = "
              f"{float(table.train_recall[method][at].mean()):.4f}")
    print(f"wrote {path} ({path.stat().st_size // 1024} KiB, {len(table.targets)} targets)")
    return 0
