"""Per-row budgets from predicted mass (:class:`MassRowBudget`) against the row fraction it
re-splits, and the default floor, in the restricted model.

``rowfrac:budget`` fractions are calibrated on the first ``--fit-passages`` train passages;
``rowfrac:budget+mass`` keeps each head's total of those fractions and splits it over the rows
by predicted mass. Both, and ``distance:budget`` with a floor of 5, are then run on
the next ``--select-passages`` train texts (``--split train``: to choose) or on the validation
split (``--split validation``: to report).

    PYTHONPATH=$PWD .venv/bin/python tools/mass_budget.py --split train --out runs/mass-budget.csv
"""

from __future__ import annotations

import argparse

import pandas as pd

from sparsefinder.calibration.curves import calibrated_fitter
from sparsefinder.calibration.estimators import CalibratedRowFraction
from sparsefinder.data.corpus import corpus_texts
from sparsefinder.data.records import extract
from sparsefinder.evaluation.accuracy_sweep import ExtraPoint, accuracy_sweep
from sparsefinder.evaluation.curves import register_curve
from sparsefinder.methods.spec import PredictorSpec
from sparsefinder.models.loading import load_model
from sparsefinder.predictors.mass_budget import MassRowBudget
from sparsefinder.projections.heads import HeadProjections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--projections",
                        default="assets/default/projections-r8-lowrank-logistic.pt")
    parser.add_argument("--split", choices=("train", "validation"), default="train")
    parser.add_argument("--fit-passages", type=int, default=100)
    parser.add_argument("--select-passages", type=int, default=40)
    parser.add_argument("--targets", default="0.9,0.95")
    parser.add_argument("--out", default="runs/mass-budget.csv")
    args = parser.parse_args()
    targets = [float(t) for t in args.targets.split(",")]
    loaded = load_model("default")
    projections = HeadProjections.load(args.projections, expected_model_id=loaded.model_id)
    fit_texts = corpus_texts("default", "train", loaded.tokenizer, loaded.max_length,
                             args.fit_passages)
    if args.split == "train":
        every = corpus_texts("default", "train", loaded.tokenizer, loaded.max_length,
                             args.fit_passages + args.select_passages)
        texts = every[len(fit_texts):]
    else:
        texts = corpus_texts("default", "validation", loaded.tokenizer, loaded.max_length)
    print(f"calibrating on {len(fit_texts)} train texts, measuring on {len(texts)} "
          f"{args.split} texts")
    train_records = extract(loaded, fit_texts)
    names = ["rowfrac:budget@fit", "distance-floor:budget@fit"]
    register_curve(names[0], "rowfrac:budget", [{"target_sparsity": t} for t in targets],
                   replace=True)
    register_curve(names[1], "distance:budget",
                   [{"target_sparsity": t, "floor": 5} for t in targets], replace=True)
    build = calibrated_fitter("budget", "target_sparsity", CalibratedRowFraction)(train_records)

    def by_mass(params: dict, projections_: HeadProjections, layer: int) -> MassRowBudget:
        return MassRowBudget(build(params, projections_, layer).fractions)

    extra = [ExtraPoint("rowfrac:budget+mass",
                        PredictorSpec.of("rowfrac", {"target_sparsity": t}, calibration="budget"),
                        projections, by_mass) for t in targets]
    df = accuracy_sweep(loaded, texts, projections, names, train_records=train_records,
                        model_name="default", extra=extra)
    df.to_csv(args.out, index=False)
    pd.set_option("display.width", 200)
    print(df[["method", "params", "sparsity", "output_cosine", "embedding_cosine",
              "retrieval_top1", "repaired_rows", "predict_ms"]].to_string(index=False))


if __name__ == "__main__":
    main()
