"""`sparsefinder extract`: gold entmax graphs of a corpus, saved as compact edge lists."""

from __future__ import annotations

import argparse
from pathlib import Path

from sparsefinder.commands._common import add_corpus_arguments, add_model_arguments, load_from_args
from sparsefinder.data.corpus import corpus_texts
from sparsefinder.data.records import extract
from sparsefinder.data.records_io import save_records


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("extract", help="extract gold attention graphs of a corpus")
    add_model_arguments(parser)
    add_corpus_arguments(parser, default_split="train")
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--sharded", action="store_true",
        help="write a resumable shard store OUT/records-SPLIT/ (implied under torchrun: "
             "`torchrun --nproc_per_node=N -m sparsefinder extract ...`)",
    )
    parser.add_argument("--chunk-batches", type=int, default=8,
                        help="batches per shard chunk (the unit of resuming and of streaming)")
    return parser


def _run_sharded(args: argparse.Namespace) -> int:
    from sparsefinder import distributed
    from sparsefinder.data.shards import extract_sharded

    with distributed.torchrun_group(args.device) as world:
        device = distributed.device_for(args.device, world)
        loaded = load_from_args(args, device)
        passages = corpus_texts(args.corpus, args.split, loaded.tokenizer, loaded.max_length,
                                args.max_passages)
        folder = args.out / f"records-{args.split}"
        manifest = extract_sharded(
            loaded, passages, folder, batch_size=args.batch_size,
            chunk_batches=args.chunk_batches, progress=True,
            metadata={"corpus": str(args.corpus), "split": args.split},
        )
        if world.is_main:
            edges = sum(c["gold_edges"] or 0 for c in manifest["chunks"])
            print(f"saved {manifest['n_texts']} records ({edges} gold edges) in "
                  f"{len(manifest['chunks'])} chunks from {world.size} ranks to {folder} "
                  f"({manifest['chunks_written_this_run']} chunks written by this run)")
    return 0


def run(args: argparse.Namespace) -> int:
    from sparsefinder.distributed import launched_by_torchrun

    if args.sharded or launched_by_torchrun():
        return _run_sharded(args)
    loaded = load_from_args(args)
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
            "layer_alphas": loaded.layer_alphas,
            "corpus": str(args.corpus),
            "split": args.split,
        },
    )
    edges = sum(int(layer.gold.sum()) for record in records for layer in record.layers)
    print(f"saved {len(records)} records ({edges} gold edges) to {path}")
    return 0
