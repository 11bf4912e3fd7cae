"""Choose the floor of ``distance:budget`` (``floor`` m keys per row, ``floor_share`` c) on TRAIN.

The thresholds are calibrated on the first ``--fit-passages`` train passages; the restricted
model's output is then compared with the full model on the next train texts (held out from
the calibration, still train), for each setting and target; validation is never read.

The settings: every m of ``--floors`` with every cap c of ``--shares`` (``floor_share``: a row
keeps at most ``min(m, max(1, ⌊c · (1 − target) · allowed⌋))`` floor keys; ``none``: uncapped,
every row keeps m keys), plus the uncapped ``--reference-floor`` as the reference.

The rule (:func:`choose`), fixed before the run:

1. at each target t (a level), a setting qualifies when its in-run sparsity is at least
   t − 0.005; the level's winner is the qualifying setting with the highest output cosine;
2. if one setting wins every level, it is chosen ("one winner at every level");
3. else, among the settings that qualify at every level, the one with the highest mean
   output cosine over the levels is chosen ("best mean");
4. exact ties (same cosine) go to the uncapped reference, then to the smaller m, then to the
   smaller c; no setting qualifying at every level: none is chosen.

``--lengths`` splits the selection texts at their median token count into a short and a long
half and runs each half alone (a ``texts`` column says which): a setting then qualifies at a
level only when it reaches ``t − slack`` on BOTH halves, and its output cosine at the level is
the mean of the halves' (weighted by their text counts). A floor denser than the target on
short texts then fails there even where long texts hide it. ``--slack`` sets the slack
(default 0.005).

    PYTHONPATH=$PWD .venv/bin/python tools/choose_floor.py --fit-passages 100 --select-passages 40
"""

from __future__ import annotations

import argparse
import json

import pandas as pd

from sparsefinder.calibration.curves import DEFAULT_FLOOR, DEFAULT_FLOOR_SHARE
from sparsefinder.data.corpus import corpus_texts
from sparsefinder.data.records import extract
from sparsefinder.evaluation.accuracy_sweep import accuracy_sweep
from sparsefinder.evaluation.curves import register_curve
from sparsefinder.models.loading import load_model
from sparsefinder.projections.heads import HeadProjections

SLACK = 0.005


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--projections",
                        default="assets/default/projections-r8-lowrank-logistic.pt")
    parser.add_argument("--fit-passages", type=int, default=100)
    parser.add_argument("--select-passages", type=int, default=40)
    parser.add_argument("--floors", default="4,5,6,8")
    parser.add_argument("--shares", default="0.25,0.5,1.0")
    parser.add_argument("--reference-floor", type=int, default=5,
                        help="the uncapped floor run as the reference (0: none)")
    parser.add_argument("--targets", default="0.75,0.9,0.95")
    parser.add_argument("--out", default="runs/choose-floor.csv")
    parser.add_argument("--from-csv", help="only choose, from a CSV this tool wrote")
    parser.add_argument("--lengths", action="store_true",
                        help="run the short and the long half of the selection texts apart; "
                             "qualify on both")
    parser.add_argument("--slack", type=float, default=SLACK)
    args = parser.parse_args()
    targets = [float(t) for t in args.targets.split(",")]
    if args.from_csv:
        df = pd.read_csv(args.from_csv)
        for group in (df["texts"].unique() if "texts" in df.columns else [None]):
            print(table(df if group is None else df[df["texts"] == group], targets))
        print(describe(choose(df, targets, args.slack)))
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
    settings: list[tuple[int, float | None]] = []
    if args.reference_floor:
        settings.append((args.reference_floor, None))
    settings += [(int(m), None if c == "none" else float(c)) for m in args.floors.split(",")
                 for c in args.shares.split(",")]
    settings = list(dict.fromkeys(settings))  # the reference once
    for m, c in settings:
        names.append(curve_name(m, c))
        share = {} if c is None else {"floor_share": c}
        register_curve(names[-1], "distance:budget",
                       [{"target_sparsity": t, "floor": m, **share} for t in targets],
                       replace=True)
    groups = {"all": select_texts}
    if args.lengths:
        groups = split_by_length(select_texts, loaded.tokenizer)
        print(", ".join(f"{g}: {len(t)} texts, {min(c)}–{max(c)} tokens"
                        for g, t in groups.items()
                        for c in [[len(loaded.tokenizer(x)["input_ids"]) for x in t]]))
    parts = []
    for group, texts in groups.items():
        part = accuracy_sweep(loaded, texts, projections, names, train_records=train_records,
                              model_name="default")
        parts.append(part.assign(texts=group) if args.lengths else part)
    df = pd.concat(parts, ignore_index=True)
    df.to_csv(args.out, index=False)
    pd.set_option("display.width", 200)
    print(df[["method", "params", "sparsity", "output_cosine", "embedding_cosine",
              "retrieval_top1", "repaired_rows"]].to_string(index=False))
    for group in groups:
        print(f"\n{group} texts:" if args.lengths else "")
        print(table(df[df["texts"] == group] if args.lengths else df, targets))
    print(describe(choose(df, targets, args.slack)))


def split_by_length(texts: list[str], tokenizer) -> dict[str, list[str]]:
    """The shorter half (by token count; ties by position) and the longer half."""
    counts = [len(tokenizer(t)["input_ids"]) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: (counts[i], i))
    half = len(texts) // 2
    return {"short": [texts[i] for i in sorted(order[:half])],
            "long": [texts[i] for i in sorted(order[half:])]}


def _pooled(floors: pd.DataFrame) -> pd.DataFrame:
    """One row per (setting, target): with a ``texts`` column, the lowest sparsity of the
    groups (a level counts as reached only where every group reaches it) and the output
    cosine averaged over the groups, weighted by their text counts."""
    if "texts" not in floors.columns:
        return floors
    weight = floors["n_texts"] if "n_texts" in floors.columns else pd.Series(1.0, floors.index)
    floors = floors.assign(_w=weight, _wc=weight * floors["output_cosine"])
    out = floors.groupby(["setting", "target"], as_index=False).agg(
        sparsity=("sparsity", "min"), _wc=("_wc", "sum"), _w=("_w", "sum"))
    return out.assign(output_cosine=out["_wc"] / out["_w"]).drop(columns=["_wc", "_w"])


def curve_name(floor: int, share: float | None) -> str:
    """``distance-floor:budget@m5`` (uncapped) or ``distance-floor:budget@m5c0.5``."""
    return f"distance-floor:budget@m{floor}" + ("" if share is None else f"c{share:g}")


def _settings(df: pd.DataFrame) -> pd.DataFrame:
    """The floor rows with their target, m and c (0: uncapped) as columns."""
    floors = df[df["method"].str.startswith("distance-floor")].copy()
    params = floors["params"].map(json.loads)
    floors["target"] = params.map(lambda p: float(p["target_sparsity"]))
    floors["floor"] = params.map(lambda p: int(p["floor"]))
    floors["share"] = params.map(lambda p: float(p.get("floor_share") or 0.0))
    return floors


def _order(setting: tuple[int, float]) -> tuple:
    """Tie order: the uncapped reference first, then the smaller m, then the smaller c."""
    m, c = setting
    return (c != 0.0, m, c)


def _best(scores: dict[tuple[int, float], float]) -> tuple[int, float]:
    top = max(scores.values())
    return min((s for s, v in scores.items() if v == top), key=_order)


def choose(df: pd.DataFrame, targets: list[float], slack: float = SLACK) -> dict:
    """The rule of this tool's docstring. Returns ``{"winners": {target: setting or None},
    "qualify_all": [settings], "chosen": setting or None, "how": str}``; a setting is
    ``(m, c)``, c 0 for the uncapped floor."""
    floors = _settings(df)
    floors["setting"] = list(zip(floors["floor"], floors["share"], strict=True))
    floors = _pooled(floors)
    winners: dict[float, tuple[int, float] | None] = {}
    qualifying: list[set] = []
    for t in targets:
        at = floors[(floors["target"] - t).abs() < 1e-9]
        ok = at[at["sparsity"] >= t - slack]
        qualifying.append(set(ok["setting"]))
        winners[t] = (_best(dict(zip(ok["setting"], ok["output_cosine"], strict=True)))
                      if len(ok) else None)
    every = set.intersection(*qualifying) if qualifying else set()
    won = set(winners.values())
    out = {"winners": winners, "qualify_all": sorted(every, key=_order)}
    if len(won) == 1 and None not in won:
        return {**out, "chosen": won.pop(), "how": "one winner at every level"}
    if not every:
        return {**out, "chosen": None, "how": "no setting qualifies at every level"}
    at_levels = floors[floors["target"].map(lambda v: any(abs(v - t) < 1e-9 for t in targets))]
    means = at_levels.groupby("setting")["output_cosine"].mean()
    return {**out, "chosen": _best({s: float(means[s]) for s in every}), "how": "best mean"}


def _name(setting: tuple[int, float] | None) -> str:
    if setting is None:
        return "none"
    m, c = setting
    return f"m = {m}, " + ("uncapped" if c == 0.0 else f"c = {c:g}")


def describe(result: dict) -> str:
    """The rule's outcome in words."""
    levels = "; ".join(f"{t:g}: {_name(s)}" for t, s in result["winners"].items())
    every = ", ".join(f"({_name(s)})" for s in result["qualify_all"]) or "none"
    default = f"m = {DEFAULT_FLOOR}, " + ("uncapped" if DEFAULT_FLOOR_SHARE is None
                                           else f"c = {DEFAULT_FLOOR_SHARE:g}")
    return (f"winners per level: {levels}\nqualify at every level: {every}\n"
            f"chosen: {_name(result['chosen'])} ({result['how']}); current default: {default}")


def table(df: pd.DataFrame, targets: list[float]) -> str:
    """Markdown: one row per setting, output cosine (in-run sparsity) per target."""
    floors = _settings(df)
    rows = ["| m | c | " + " | ".join(f"out cos @{t:g}" for t in targets) + " |",
            "|---|---|" + "---|" * len(targets)]
    plain = df[df["method"] == "distance:budget@train"]
    if len(plain):
        plain_target = plain["params"].map(lambda p: float(json.loads(p)["target_sparsity"]))
        cells = []
        for t in targets:
            row = plain[(plain_target - t).abs() < 1e-9]
            cells.append("—" if row.empty else
                         f"{row['output_cosine'].iloc[0]:.4f} ({row['sparsity'].iloc[0]:.4f})")
        rows.append("| `distance:budget` | — | " + " | ".join(cells) + " |")
    for setting in sorted(set(zip(floors["floor"], floors["share"], strict=True)), key=_order):
        m, c = setting
        cells = []
        for t in targets:
            row = floors[(floors["floor"] == m) & (floors["share"] == c)
                         & ((floors["target"] - t).abs() < 1e-9)]
            cells.append("—" if row.empty else
                         f"{row['output_cosine'].iloc[0]:.4f} ({row['sparsity'].iloc[0]:.4f})")
        rows.append(f"| {m} | {'—' if c == 0.0 else f'{c:g}'} | " + " | ".join(cells)
                    + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
