"""Choose the floor m (keys per row) of ``distance-floor:budget`` on TRAIN texts only.

The thresholds are calibrated on the first ``--fit-passages`` train passages; the restricted
model's output is then compared with the full model on the next train texts (held out from
the calibration, still train), for each m and target. The chosen m is the one with the highest
mean output cosine over the targets; validation is never read.

    PYTHONPATH=$PWD .venv/bin/python tools/choose_floor.py --fit-passages 100 --select-passages 40
"""

from __future__ import annotations

import argparse

import pandas as pd

from sparsefinder.calibration.curves import DEFAULT_FLOOR
from sparsefinder.data.corpus import corpus_texts
from sparsefinder.data.records import extract
from sparsefinder.evaluation.accuracy_sweep import accuracy_sweep
from sparsefinder.evaluation.curves import register_curve
from sparsefinder.models.loading import load_model
from sparsefinder.projections.heads import HeadProjections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--projections",
                        default="assets/default/projections-r8-lowrank-logistic.pt")
    parser.add_argument("--fit-passages", type=int, default=100)
    parser.add_argument("--select-passages", type=int, default=40)
    parser.add_argument("--floors", default="1,2,4,8,16")
    parser.add_argument("--targets", default="0.75,0.9,0.95")
    parser.add_argument("--out", default="runs/choose-floor.csv")
    args = parser.parse_args()
    loaded = load_model("default")
    projections = HeadProjections.load(args.projections, expected_model_id=loaded.model_id)
    fit_texts = corpus_texts("default", "train", loaded.tokenizer, loaded.max_length,
                             args.fit_passages)
    every = corpus_texts("default", "train", loaded.tokenizer, loaded.max_length,
                         args.fit_passages + args.select_passages)
    select_texts = every[len(fit_texts):]
    print(f"calibrating on {len(fit_texts)} train texts, choosing on {len(select_texts)}")
    train_records = extract(loaded, fit_texts)
    targets = [float(t) for t in args.targets.split(",")]
    names = ["distance:budget@train"]
    register_curve(names[0], "distance:budget", [{"target_sparsity": t} for t in targets],
                   replace=True)
    for m in (int(x) for x in args.floors.split(",")):
        names.append(f"distance-floor:budget@m{m}")
        register_curve(names[-1], "distance-floor:budget",
                       [{"target_sparsity": t, "floor": m} for t in targets], replace=True)
    df = accuracy_sweep(loaded, select_texts, projections, names, train_records=train_records,
                        model_name="default")
    df.to_csv(args.out, index=False)
    pd.set_option("display.width", 200)
    print(df[["method", "params", "sparsity", "output_cosine", "embedding_cosine",
              "retrieval_top1", "repaired_rows"]].to_string(index=False))
    floors = df[df["method"].str.startswith("distance-floor")]
    best = floors.groupby("method")["output_cosine"].mean().idxmax()
    print(f"highest mean output cosine over targets {targets}: {best} "
          f"(current DEFAULT_FLOOR = {DEFAULT_FLOOR})")


if __name__ == "__main__":
    main()
