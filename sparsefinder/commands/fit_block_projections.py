"""`sparsefinder fit-block-projections`: projections of pooled query/key blocks (paper §6),
learned with Eq. 7 on the block pairs of the gold graphs of the corpus' TRAIN split; the
validation split is never read (unless asked, with a note).

For the default model the results are bundled as
``assets/default/block_projections-b{16,32}.pt`` (`make assets`); the
``block-learned`` method (curves ``block-learned``, ``block16-learned``) fits the same maps on
training graphs in a sweep, and ``benchmarks/restricted.py --selector learned`` reads them.
"""

from __future__ import annotations

import argparse
import time

from sparsefinder.commands._common import add_fitting_arguments, fitting_records
from sparsefinder.projections.blocks import (
    DEFAULT_BLOCK,
    DEFAULT_RANK,
    train_block_projections,
)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "fit-block-projections",
        help="learn projections of pooled query/key blocks (block-learned) on the train split",
    )
    add_fitting_arguments(parser)
    parser.add_argument("--block", type=int, default=DEFAULT_BLOCK, help="tokens per block")
    parser.add_argument("--rank", type=int, default=DEFAULT_RANK, help="projection dimension r")
    parser.add_argument("--epochs", type=int, default=None,
                        help="passes over the block pairs (default: chosen per block size on "
                             "the train split, block_projections.EPOCHS_BY_BLOCK)")
    parser.add_argument("--lr", type=float, default=0.01, help="Adam learning rate")
    parser.add_argument("--margin", type=float, default=1.0, help="hinge margin ω")
    parser.add_argument("--batch-size", type=int, default=1024,
                        help="positive block pairs per head per step")
    return parser


def run(args: argparse.Namespace) -> int:
    if args.block < 1:
        raise ValueError(f"--block must be a positive number of tokens, got {args.block}")
    loaded, records = fitting_records(args)
    start = time.perf_counter()
    projections = train_block_projections(
        records, block=args.block, rank=args.rank, margin=args.margin, lr=args.lr,
        epochs=args.epochs, batch_size=args.batch_size, seed=args.seed,
        model_id=loaded.model_id, alpha=loaded.alpha)
    trained = time.perf_counter() - start
    projections.metadata.update({"corpus": str(args.corpus), "split": args.split,
                                 "n_texts": len(records), "max_passages": args.max_passages,
                                 "train_seconds": round(trained, 2)})
    path = projections.save(args.out)
    meta = projections.metadata
    for layer, (first, last) in enumerate(zip(meta["loss_first"], meta["loss_last"],
                                              strict=True)):
        print(f"layer {layer}: {meta['positives_per_layer'][layer]} positive block pairs, "
              f"hinge loss {first:.4f} -> {last:.4f}")
    print(f"{meta['positive_tile_share']:.1%} of the {args.block}-token tiles hold a gold edge; "
          f"trained in {trained:.1f} s; wrote {path} ({path.stat().st_size / 1e3:.0f} KB)")
    return 0
