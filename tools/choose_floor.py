"""Choose the floor m (keys per row) of ``distance-floor:budget`` on TRAIN texts only.

The thresholds are calibrated on the first ``--fit-passages`` train passages; the restricted
model's output is then compared with the full model on the next train texts (held out from
the calibration, still train), for each m and target; validation is never read. Two rules
read the table: one m for every target (the highest mean output cosine among the floors whose
sparsity meets every target, :func:`choose`) and one m per target (the highest output cosine
at that target among the floors whose sparsity reaches it, :func:`choose_per_target`).

    PYTHONPATH=$PWD .venv/bin/python tools/choose_floor.py --fit-passages 100 --select-passages 40
"""

from __future__ import annotations

import argparse
import json

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
    parser.add_argument("--from-csv", help="only choose, from a CSV this tool wrote")
    args = parser.parse_args()
    targets = [float(t) for t in args.targets.split(",")]
    if args.from_csv:
        df = pd.read_csv(args.from_csv)
        print(choose(df, targets))
        print(choose_per_target(df))
        return
    loaded = load_model("default")
    projections = HeadProjections.load(args.projections, expected_model_id=loaded.model_id)
    fit_texts = corpus_texts("default", "train", loaded.tokenizer, loaded.max_length,
                             args.fit_passages)
    every = corpus_texts("default", "train", loaded.tokenizer, loaded.max_length,
                         args.fit_passages + args.select_passages)
    select_texts = every[len(fit_texts):]
    print(f"calibrating on {len(fit_texts)} train texts, choosing on {len(select_texts)}")
    train_records = extract(loaded, fit_texts)
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
    print(choose(df, targets))
    print(choose_per_target(df))


def _floors(df: pd.DataFrame) -> pd.DataFrame:
    floors = df[df["method"].str.startswith("distance-floor")].copy()
    floors["target"] = floors["params"].map(lambda p: json.loads(p)["target_sparsity"])
    floors["floor"] = floors["params"].map(lambda p: json.loads(p)["floor"])
    return floors


def per_target(df: pd.DataFrame, slack: float = 0.005) -> dict[float, int]:
    """Target → the floor m with the highest output cosine at that target, among the floors
    whose in-run sparsity is at most ``slack`` below it; a target no floor reaches is left
    out."""
    floors = _floors(df)
    kept = floors[floors["sparsity"] >= floors["target"] - slack]
    return {float(t): int(g.loc[g["output_cosine"].idxmax(), "floor"])
            for t, g in kept.groupby("target")}


def choose_per_target(df: pd.DataFrame, slack: float = 0.005) -> str:
    """:func:`per_target`, printed."""
    chosen = per_target(df, slack)
    return (f"per target (sparsity at most {slack} below it): "
            + ", ".join(f"{t:g} -> m = {m}" for t, m in sorted(chosen.items())))


def choose(df: pd.DataFrame, targets: list[float], slack: float = 0.01) -> str:
    """The floor with the highest mean output cosine over the targets, among the floors
    whose in-run sparsity is within ``slack`` of every target (a floor denser than the
    target allows buys its cosine with sparsity, so it is not comparable)."""
    floors = _floors(df)
    meets = floors.groupby("method").apply(
        lambda g: bool((g["sparsity"] >= g["target"] - slack).all()), include_groups=False)
    kept = floors[floors["method"].map(meets)]
    if kept.empty:
        return "no floor meets every target"
    best = kept.groupby("method")["output_cosine"].mean().idxmax()
    return (f"floors meeting every target {targets}: {sorted(set(kept['method']))}; highest "
            f"mean output cosine: {best} (DEFAULT_FLOOR = {DEFAULT_FLOOR})")

if __name__ == "__main__":
    main()
