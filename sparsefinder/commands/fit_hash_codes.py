"""`sparsefinder fit-hash-codes`: HashAttention-style codes (the ``hashattention`` method)
learned on the gold graphs of the corpus' TRAIN split; the validation split is never read.

For the default model the result is bundled as ``assets/default/hash_codes.pt``
(`make assets`), which lets the app offer the method without extracting training graphs.
"""

from __future__ import annotations

import argparse
import time

from sparsefinder.commands._common import add_fitting_arguments, fitting_records
from sparsefinder.predictors.hash_codes import HASH_BITS
from sparsefinder.projections.hash_code_table import HashCodeTable
from sparsefinder.projections.hash_fit import fit_hash_codes


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "fit-hash-codes",
        help="learn HashAttention-style q/k codes (hashattention method) on the train split",
    )
    add_fitting_arguments(parser)
    parser.add_argument("--bits", type=int, default=HASH_BITS, help="code length per head")
    parser.add_argument("--steps", type=int, default=300, help="Adam steps per layer")
    return parser


def run(args: argparse.Namespace) -> int:
    if args.bits < 1 or args.steps < 1:
        raise ValueError(f"--bits and --steps must be positive, got {args.bits} and {args.steps}")
    loaded, records = fitting_records(args)
    start = time.perf_counter()
    maps = fit_hash_codes(records, bits=args.bits, steps=args.steps, seed=args.seed)
    table = HashCodeTable(
        model_id=loaded.model_id, alpha=loaded.alpha, maps=maps,
        metadata={"corpus": str(args.corpus), "split": args.split, "texts": len(records),
                  "bits": args.bits, "steps": args.steps, "seed": args.seed})
    path = table.save(args.out)
    print(f"fitted {args.bits}-bit codes for {len(maps)} layers in "
          f"{time.perf_counter() - start:.0f}s; wrote {path} ({path.stat().st_size / 1e3:.0f} KB)")
    return 0
