"""`sparsefinder fit-codebooks`: per-head key centroids for the routed k-means predictor.

Keys come from the gold-graph records of the corpus' TRAIN split (long passages chunked to
the model's maximum length); the validation split is never read. For the default model the
result is bundled as ``assets/default/key_codebooks.pt`` (`sparsefinder
fit-codebooks --out assets/default/key_codebooks.pt`, ~2 min on a laptop CPU).
"""

from __future__ import annotations

import argparse
import time

from sparsefinder.commands._common import add_fitting_arguments, fitting_records
from sparsefinder.projections.key_codebooks import DEFAULT_CLUSTERS, fit_codebooks


def _clusters(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers like 64,128, got {text!r}"
        ) from error
    if not values or min(values) < 2:
        raise argparse.ArgumentTypeError(f"expected integers >= 2, got {text!r}")
    return values


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "fit-codebooks",
        help="fit per-head key centroids (routed k-means predictor) on the train split",
    )
    add_fitting_arguments(parser)
    parser.add_argument(
        "--clusters", type=_clusters, default=list(DEFAULT_CLUSTERS),
        help="numbers of centroids B per head (default: "
             f"{','.join(map(str, DEFAULT_CLUSTERS))})",
    )
    parser.add_argument("--max-points", type=int, default=20000,
                        help="keys per head used to fit k-means (subsampled, seeded)")
    return parser


def run(args: argparse.Namespace) -> int:
    loaded, records = fitting_records(args)
    start = time.perf_counter()
    codebooks = fit_codebooks(
        records, args.clusters, model_id=loaded.model_id, alpha=loaded.alpha,
        random_state=args.seed, max_points=args.max_points,
        metadata={"corpus": str(args.corpus), "split": args.split},
    )
    path = codebooks.save(args.out)
    print(f"fitted B={','.join(map(str, args.clusters))} in {time.perf_counter() - start:.0f}s; "
          f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0
