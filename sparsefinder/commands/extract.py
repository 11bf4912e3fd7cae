"""`sparsefinder extract`: gold entmax graphs of a corpus, saved as compact edge lists."""

from __future__ import annotations

import argparse
from pathlib import Path

from sparsefinder.commands._common import add_corpus_arguments, add_model_arguments
from sparsefinder.corpus import corpus_texts
from sparsefinder.graphs import extract
from sparsefinder.models import load_model
from sparsefinder.records_io import save_records


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("extract", help="extract gold attention graphs of a corpus")
    add_model_arguments(parser)
    add_corpus_arguments(parser, default_split="train")
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--batch-size", type=int, default=8)
    return parser


def run(args: argparse.Namespace) -> int:
    loaded = load_model(args.model, alpha=args.alpha, device=args.device)
    passages = corpus_texts(args.corpus, args.split, loaded.tokenizer, loaded.max_length,
                            args.max_passages)
    records = extract(
        loaded, passages, batch_size=args.batch_size, long_text="error", progress=True
    )
    path = save_records(
        records,
        args.out / f"records-{args.split}.pt",
        metadata={
            "model_id": loaded.model_id,
            "alpha": loaded.alpha,
            "corpus": str(args.corpus),
            "split": args.split,
        },
    )
    edges = sum(int(layer.gold.sum()) for record in records for layer in record.layers)
    print(f"saved {len(records)} records ({edges} gold edges) to {path}")
    return 0
