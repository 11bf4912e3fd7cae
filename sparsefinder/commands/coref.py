"""`sparsefinder coref`: find coreference heads and check that a predictor keeps their edges.

Ranks every head by how much gold attention flows from pronouns to their antecedents on the
``choose`` probes (see :mod:`sparsefinder.analysis.coref` for the exact definitions), prints the
top heads, then scores each ``--method`` on the best head(s) over the method's sweep grid
(:mod:`sparsefinder.evaluation.curves`): recall on the pronoun→antecedent gold edges against
the sparsity of that head's predicted graph. The setting is chosen on the ``choose`` probes
(the sparsest reaching ``--min-recall``, :mod:`sparsefinder.analysis.coref_eval`) and measured
on the held-out probes: the paper's coreference head keeps recall ≈ 0.80 at sparsity ≈ 0.75.
``--heldout-set NAME`` also measures the held-out probes of that set (e.g. ``fresh``) on their
own, beside the whole held-out split; the choice is the same with or without it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from sparsefinder.analysis.coref import DEFAULT_PROBES, load_probes, rank_heads, split_probes
from sparsefinder.analysis.coref_eval import evaluate_settings, mark_choice
from sparsefinder.bundle import bundle
from sparsefinder.commands._common import add_model_arguments, load_from_args
from sparsefinder.commands.clusters import add_projection_arguments
from sparsefinder.data.records import extract
from sparsefinder.evaluation.curves import CURVES, resolve_methods
from sparsefinder.learned_parts import LearnedParts
from sparsefinder.methods.registry import MethodUnavailable
from sparsefinder.projections.heads import HeadProjections

#: The project's best calibrated predictor (the app's default), evaluated unless told otherwise.
DEFAULT_METHOD = "distance:budget"
#: Families that need the shared query/key space with k-means centroids (the bundle's
#: ``best("centroids")``); the rest use its best projections (``best("projections")``).
CENTROID_FAMILIES = frozenset({"kmeans", "quantization"})


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "coref", help="rank heads by pronoun->antecedent attention; a method's recall on the best"
    )
    add_model_arguments(parser)
    add_projection_arguments(parser)
    parser.add_argument("--probes", type=Path, default=DEFAULT_PROBES, help="probe JSON file")
    parser.add_argument(
        "--no-cataphora",
        action="store_true",
        help="skip pairs whose pronoun comes before its antecedent",
    )
    parser.add_argument("--top", type=int, default=5, help="heads to print (default 5)")
    parser.add_argument(
        "--evaluate", type=int, default=1, help="score the methods on the best N heads (default 1)"
    )
    parser.add_argument(
        "--method",
        default=DEFAULT_METHOD,
        help="comma list of methods/curves to score over their sweep grids, e.g. "
             f"'distance:budget,kmeans,kmeans-top2,quantization' (default {DEFAULT_METHOD})",
    )
    parser.add_argument(
        "--min-recall", type=float, default=0.8,
        help="choose the sparsest setting whose recall on the choose probes reaches this",
    )
    parser.add_argument(
        "--min-sparsity", type=float, default=None,
        help="instead: choose the highest-recall setting whose head sparsity on the choose "
             "probes reaches this (e.g. 0.75, the paper's operating point)",
    )
    parser.add_argument(
        "--heldout-set", default=None, metavar="NAME",
        help="also measure the held-out probes of this set (their 'set' field, e.g. 'fresh') "
             "on their own: NAME_... columns beside the whole held-out split",
    )
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    return parser


def method_parts(name: str, args: argparse.Namespace, loaded) -> LearnedParts:
    """The learned parts curve ``name`` is built from: ``--projections`` if given, else the
    bundle's best (with centroids where the family needs them), with the bundled calibration
    table and its own projections for the calibrated forms."""
    family = CURVES[name].specs[0].method
    path = args.projections
    if path is None:
        path = bundle().best("centroids" if family in CENTROID_FAMILIES else "projections")
    projections = HeadProjections.load(
        path, expected_model_id=loaded.model_id, expected_alpha=loaded.alpha
    )
    return LearnedParts.bundled(loaded.model_id, projections=projections)


def score_methods(names: list[str], args: argparse.Namespace, loaded, heads, choose, heldout,
                  heldout_sets: dict[str, list[int]] | None = None) -> pd.DataFrame:
    """Every method × head × grid point scored on both splits (and on the named held-out
    sets, positions in ``heldout``), its choice marked."""
    tables = []
    for name in names:
        parts = method_parts(name, args, loaded)
        for layer, head in heads:
            try:
                table = evaluate_settings(CURVES[name].specs, parts, choose, heldout, layer, head,
                                          heldout_sets)
            except (MethodUnavailable, ValueError) as error:
                print(f"note: skipping {name}: {str(error).splitlines()[0]}", file=sys.stderr)
                break
            table.insert(0, "curve", name)
            tables.append(mark_choice(table, args.min_recall, args.min_sparsity))
    if not tables:
        raise ValueError(f"none of the methods {names} could be built here")
    return pd.concat(tables, ignore_index=True)


def run(args: argparse.Namespace) -> int:
    for name in ("top", "evaluate"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    names = resolve_methods(args.method)
    probes = load_probes(args.probes, include_cataphora=not args.no_cataphora)
    chosen_probes, held_probes = split_probes(probes)
    if not chosen_probes:
        raise ValueError(f"{args.probes} has no probe of split 'choose' to choose on")
    heldout_sets = {}
    if args.heldout_set is not None:
        picked = [i for i, p in enumerate(held_probes) if p.set == args.heldout_set]
        if not picked:
            raise ValueError(f"{args.probes} has no held-out probe of set {args.heldout_set!r}")
        heldout_sets[args.heldout_set] = picked
    loaded = load_from_args(args)
    records = extract(loaded, [p.text for p in probes], long_text="error")
    by_id = dict(zip((p.id for p in probes), records, strict=True))
    choose = ([by_id[p.id] for p in chosen_probes], chosen_probes)
    heldout = ([by_id[p.id] for p in held_probes], held_probes)
    ranking = rank_heads(*choose)
    args.out.mkdir(parents=True, exist_ok=True)
    ranking.to_csv(args.out / "coref_heads.csv", index=False)
    n_pairs = int(ranking["n_pairs"].iloc[0])
    n_held = sum(len(p.pairs) for p in held_probes)
    print(f"{len(chosen_probes)} probes to choose on ({n_pairs} pronoun->antecedent pairs), "
          f"{len(held_probes)} held out ({n_held} pairs) ({loaded.model_id})")
    for group, picked in heldout_sets.items():
        print(f"  of the held out, set {group!r}: {len(picked)} probes "
              f"({sum(len(held_probes[i].pairs) for i in picked)} pairs), also measured alone")
    print("heads with the most gold pronoun->antecedent attention on the choose probes "
          "(mean mass over pairs):")
    print(ranking.head(args.top).to_string(index=False, float_format="%.3f"))
    heads = [(int(r.layer), int(r.head)) for r in ranking.head(args.evaluate).itertuples()]
    table = score_methods(names, args, loaded, heads, choose, heldout, heldout_sets)
    table.to_csv(args.out / "coref_recall.csv", index=False)
    _print_table(table, args, list(heldout_sets))
    print(f"wrote coref_heads.csv and coref_recall.csv to {args.out}")
    return 0


def _bar(recall: float, sparsity: float) -> str:
    return "met" if recall >= 0.8 and sparsity >= 0.75 else "missed"


def _print_table(table: pd.DataFrame, args: argparse.Namespace, sets: list[str]) -> None:
    rule = (f"sparsest with R >= {args.min_recall}" if args.min_sparsity is None
            else f"highest R with S >= {args.min_sparsity}")
    names = {"choose": "choose", "heldout": "held-out", **{g: g for g in sets}}
    columns = {f"{split}_{score}": f"{short} {label}" for split, label in names.items()
               for score, short in (("pronoun_recall", "R"), ("sparsity", "S"))}
    shown = table.assign(pick=table["chosen"].map({True: "*", False: ""}))[
        ["curve", "layer", "head", "setting", *columns, "pick"]].rename(columns=columns)
    print("\nrecall on gold pronoun->antecedent edges (pooled) and sparsity of the head's graph "
          f"(mean over probes); * = chosen on the choose probes ({rule})")
    print(shown.to_string(index=False, float_format="%.3f"))
    print("\nchosen settings, measured on the held-out probes:")
    for row in table[table["chosen"]].itertuples():
        if pd.isna(row.heldout_pronoun_recall):
            print(f"  {row.curve} on layer {row.layer} head {row.head}, {row.setting}: "
                  "no held-out probe to measure it on")
            continue
        note = "" if row.reached else " (no setting meets the rule on the choose probes)"
        print(f"  {row.curve} on layer {row.layer} head {row.head}, {row.setting}: held-out "
              f"recall {row.heldout_pronoun_recall:.3f} at sparsity {row.heldout_sparsity:.3f}"
              f" [bar R >= 0.80 at S >= 0.75: "
              f"{_bar(row.heldout_pronoun_recall, row.heldout_sparsity)}]{note}")
        for group in sets:
            r, sp = getattr(row, f"{group}_pronoun_recall"), getattr(row, f"{group}_sparsity")
            print(f"    set {group} alone: recall {r:.3f} at sparsity {sp:.3f} "
                  f"[bar: {_bar(r, sp)}]")
    print("(paper, RoBERTa coreference head: recall ~0.80 at sparsity ~0.75)")
