"""Quality table of swept methods: R@levels plus the issue-10 metrics at sparsity 0.9.

Reads a ``sparsefinder sweep`` output folder (its points.csv), picks for every method the
configuration that gives its R@0.90 (step rule of
:func:`sparsefinder.evaluation.frontier.recall_at_sparsity`:
the best recall among frontier points with sparsity ≥ 0.9), re-runs that configuration on the
same corpus split and scores it with precision, exact fraction, attention-mass recall and block
recall (16, 64), macro-averaged like the sweep (texts, then heads, then layers). Prints a
markdown table; last line ``key=value`` per method.

    python benchmarks/quality_table.py runs/issue10-val --split validation

``--smoke`` (without a folder): sweeps distance and window on the first 2 passages of the
split into a temporary folder, then builds the table from it.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import parse, parser  # noqa: E402

from sparsefinder.bundle import bundle  # noqa: E402
from sparsefinder.data.corpus import corpus_texts  # noqa: E402
from sparsefinder.data.records import extract  # noqa: E402
from sparsefinder.evaluation.curves import CURVES, curve_name, with_labels  # noqa: E402
from sparsefinder.evaluation.frontier import pareto_frontier, recall_at_sparsity  # noqa: E402
from sparsefinder.evaluation.sweep import sweep  # noqa: E402
from sparsefinder.metrics.measures import (  # noqa: E402
    block_recall,
    exact_fraction,
    mass_recall,
    precision,
    recall,
    sparsity,
)
from sparsefinder.models.loading import load_model  # noqa: E402
from sparsefinder.projections.heads import HeadProjections  # noqa: E402

LEVELS = (0.75, 0.9, 0.95)
AT = 0.9


def _config_at(points: pd.DataFrame, method: str, level: float) -> dict | None:
    front = pareto_frontier(points[points["method"] == method])
    above = front[front["sparsity"] >= level]
    if above.empty:
        return None
    return json.loads(above.loc[above["recall"].idxmax(), "params"])


def main() -> None:
    made = parser(__doc__)
    made.add_argument("sweep_dir", type=Path, nargs="?",
                      help="folder written by `sparsefinder sweep` (optional with --smoke)")
    made.add_argument("--split", default="validation")
    made.add_argument("--corpus", default="default")
    made.add_argument("--max-passages", type=int, default=None,
                      help="the first N passages of the split (default: all)")
    args = parse(made, smoke={"max_passages": 2})
    if args.sweep_dir is None and not args.smoke:
        made.error("the sweep folder is required (a `sparsefinder sweep` output), except with "
                   "--smoke")
    torch.set_num_threads(1)
    loaded = load_model("default", device="cpu")
    projections = HeadProjections.load(bundle().path("projections.pt"),
                                       expected_model_id=loaded.model_id)
    texts = corpus_texts(args.corpus, args.split, loaded.tokenizer, loaded.max_length,
                         args.max_passages)
    records = extract(loaded, texts, batch_size=8)
    with tempfile.TemporaryDirectory() as scratch:
        sweep_dir = args.sweep_dir
        if sweep_dir is None:  # smoke: a tiny sweep of these records, as `sparsefinder sweep`
            sweep_dir = Path(scratch)
            with_labels(sweep(records, projections, ["distance", "window"])).to_csv(
                sweep_dir / "points.csv", index=False)
        points = pd.read_csv(sweep_dir / "points.csv")
    at = recall_at_sparsity(points, LEVELS).set_index("method")
    projected = [projections.project_record(r) for r in records]
    rows, summary = [], []
    for method in dict.fromkeys(points["method"]):
        params = _config_at(points, method, AT)
        row = {"method": method, **{f"R@{lv:g}": at.loc[method, f"recall@{lv:g}"]
                                    for lv in LEVELS}}
        chosen = [s for s in CURVES[curve_name(method)].specs if s.param_dict == params]
        if chosen and not chosen[0].needs_training:
            spec = chosen[0]
            predictors = spec.build_layers(projections, records[0].num_layers)
            per_text: dict[str, list[torch.Tensor]] = {}
            for r, proj in zip(records, projected, strict=True):
                scores: dict[str, list[torch.Tensor]] = {}
                for layer, graph in enumerate(r.layers):
                    q, k = proj[layer] if spec.inputs == "projected" else (graph.queries,
                                                                            graph.keys)
                    with torch.inference_mode():
                        pred = predictors[layer].predict(q, k, causal=r.causal)
                    gold = graph.gold
                    for name, value in (
                        ("recall", recall(pred, gold)),
                        ("sparsity", sparsity(pred, causal=r.causal)),
                        ("precision", precision(pred, gold, causal=r.causal)),
                        ("exact", exact_fraction(pred, gold)),
                        ("mass", mass_recall(pred, graph.probs())),
                        ("block16", block_recall(pred, gold, 16, causal=r.causal)),
                        ("block64", block_recall(pred, gold, 64, causal=r.causal)),
                    ):
                        scores.setdefault(name, []).append(value)
                for name, values in scores.items():
                    per_text.setdefault(name, []).append(torch.stack(values))
            # texts → (layers, heads) → heads → layers, as the sweep's macro average
            means = {n: float(torch.stack(v).mean(0).mean(-1).mean()) for n, v in
                     per_text.items()}
            row.update({"params@0.9": json.dumps(params), "sparsity@0.9": means["sparsity"],
                        "exact@0.9": means["exact"], "mass@0.9": means["mass"],
                        "precision@0.9": means["precision"], "block16@0.9": means["block16"],
                        "block64@0.9": means["block64"]})
            summary.append(f"{method}:R@0.9={row['R@0.9']:.4f},exact={means['exact']:.4f},"
                           f"mass={means['mass']:.4f}")
        rows.append(row)
    table = pd.DataFrame(rows)
    cells = [[f"{v:.4f}" if isinstance(v, float) else str(v) for v in row]
             for row in table.itertuples(index=False)]
    print("| " + " | ".join(table.columns) + " |")
    print("|" + "---|" * len(table.columns))
    for row in cells:
        print("| " + " | ".join(row) + " |")
    print(" ".join(summary))


if __name__ == "__main__":
    main()
