"""`sparsefinder train`: learn per-head projections and k-means centroids, save one file.

Gold graphs come from the corpus' train split (long passages are chunked to the model's
maximum length, so nothing is silently truncated); the validation split is never read here.

``--objective`` picks how the projections are obtained (recorded in the file's metadata), one
of :data:`sparsefinder.projections.objectives.OBJECTIVES`: ``paper`` (Eq. 7 hinge),
``logistic`` (pointwise logistic with a per-head bias), ``lowrank`` (training-free low-rank
approximation of each head's scores with the distance augmentation) or ``lowrank-logistic``
(that fit refined with a logistic loss);
:func:`~sparsefinder.projections.objectives.fit_projections` fits it with the options that
objective takes. ``make assets-projections`` rebuilds the bundled
``assets/default/projections-r{4,8}-<objective>.pt`` files.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sparsefinder.commands._common import (
    add_corpus_arguments,
    add_model_arguments,
    load_from_args,
    passages_label,
)
from sparsefinder.data.corpus import corpus_texts
from sparsefinder.data.records import extract
from sparsefinder.projections.centroids import fit_centroids
from sparsefinder.projections.objectives import OBJECTIVES, fit_projections

DEFAULT_CLUSTERS = "2,4,6,8,10,12,16,20"


def parse_int_list(text: str) -> list[int]:
    """``"2,4,8"`` → [2, 4, 8] (``"none"`` → []); argparse turns errors into usage errors."""
    if text.strip().lower() == "none":
        return []
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers like {DEFAULT_CLUSTERS}, got {text!r}"
        ) from error
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train", help="learn projections (paper Eq. 7) and k-means centroids on the train split"
    )
    add_model_arguments(parser)
    add_corpus_arguments(parser, default_split="train")
    parser.add_argument("--out", required=True, type=Path, help="folder for the projections file")
    parser.add_argument("--filename", default="projections.pt",
                        help="name of the file written in --out (default projections.pt)")
    parser.add_argument(
        "--objective", default="paper", choices=list(OBJECTIVES),
        help="paper: Eq. 7 hinge; logistic: pointwise logistic with a per-head bias; "
             "lowrank: training-free rank-r approximation of each head's scores "
             "(projected vectors then have r + 3 coordinates, see "
             "sparsefinder.projections.lowrank); "
             "lowrank-logistic: lowrank refined with a logistic loss; lowrank-mass: the "
             "same with each gold edge weighted by its entmax probability; "
             "lowrank-pairwise / lowrank-listwise: lowrank-mass plus a pairwise / listwise "
             "term within each row",
    )
    parser.add_argument("--rank", type=int, default=4,
                        help="projection dimension r (lowrank: rank of the score approximation)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=None,
                        help="Adam learning rate (default 0.01; 0.003 for lowrank-logistic)")
    parser.add_argument("--margin", type=float, default=1.0, help="hinge margin ω")
    parser.add_argument("--batch-size", type=int, default=1024, help="positives per head per step")
    parser.add_argument("--negatives", type=int, default=1, help="negatives per positive")
    parser.add_argument("--init", default="discriminative", choices=["discriminative", "random"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--clusters", type=parse_int_list, default=parse_int_list(DEFAULT_CLUSTERS),
        help=f"numbers of k-means clusters B to fit (default {DEFAULT_CLUSTERS}; 'none': skip)",
    )
    parser.add_argument("--kmeans-max-points", type=int, default=10_000,
                        help="points per head used to fit k-means")
    parser.add_argument("--kmeans-n-init", type=int, default=10, help="k-means restarts")
    parser.add_argument("--batch", type=int, default=8, help="texts per forward pass")
    parser.add_argument(
        "--records", type=Path, default=None,
        help="train on a shard store from `sparsefinder extract --sharded`/torchrun "
             "(DIR/records-SPLIT) instead of extracting; under torchrun data-parallel, each "
             "rank on its chunks (k-means centroids: sampled from every rank's chunks)",
    )
    return parser


def _run_from_store(args: argparse.Namespace) -> int:
    from sparsefinder import distributed
    from sparsefinder.data.shards import ShardedRecords
    from sparsefinder.projections.data_parallel import train_projections_sharded
    from sparsefinder.projections.distributed_centroids import fit_centroids_sharded

    if args.objective != "paper":
        raise ValueError(f"--records trains the paper objective only (data-parallel hinge), "
                         f"not --objective {args.objective}; drop --records to train it")
    lr = args.lr if args.lr is not None else 0.01
    with distributed.torchrun_group(args.device) as world:
        store = ShardedRecords(args.records)
        model_id, alpha = store.manifest["model_id"], float(store.manifest["alpha"])
        indexed = list(store.iter_indexed(world.rank, world.size))
        records = [record for _, record in indexed]
        start = time.perf_counter()
        projections = train_projections_sharded(
            [records], rank=args.rank, margin=args.margin, lr=lr, epochs=args.epochs,
            batch_size=args.batch_size, negatives_per_positive=args.negatives,
            seed=args.seed, init=args.init, model_id=model_id, alpha=alpha,
        )
        trained = time.perf_counter() - start
        if args.clusters:  # every rank: the sample is drawn from all ranks' records
            fit_centroids_sharded(projections, records, [i for i, _ in indexed],
                                  args.clusters, max_points=args.kmeans_max_points,
                                  n_init=args.kmeans_n_init, seed=args.seed)
        if world.is_main:
            projections.metadata.update({"records": str(args.records), "n_texts": len(store),
                                         "train_seconds": round(trained, 2)})
            path = projections.save(Path(args.out) / args.filename)
            print(f"trained on {len(store)} texts of {args.records} with {world.size} "
                  f"rank(s) in {trained:.1f} s; wrote {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.records is not None:
        return _run_from_store(args)
    if args.split == "validation":
        print("note: training on the validation split; evaluate on another split")
    loaded = load_from_args(args)
    texts = corpus_texts(args.corpus, args.split, loaded.tokenizer, loaded.max_length,
                         args.max_passages)
    print(f"model {loaded.model_id} (alpha={loaded.alpha}, {loaded.device}); "
          f"{passages_label(args.max_passages)} passages of the {args.split} split "
          f"-> {len(texts)} texts")
    records = extract(loaded, texts, batch_size=args.batch, progress=True)
    start = time.perf_counter()
    projections = fit_projections(
        records, args.objective, rank=args.rank, lr=args.lr, margin=args.margin,
        epochs=args.epochs, batch_size=args.batch_size, negatives_per_positive=args.negatives,
        seed=args.seed, init=args.init, progress=True, model_id=loaded.model_id,
        alpha=loaded.alpha,
    )
    trained = time.perf_counter() - start
    if args.clusters and projections.kind == "augmented":
        print("note: no k-means centroids for augmented (low-rank) projections: queries and "
              "keys sit in different coordinates, clusters would separate them")
    elif args.clusters:
        fit_centroids(projections, records, args.clusters, max_points=args.kmeans_max_points,
                      n_init=args.kmeans_n_init, seed=args.seed, progress=True)
    projections.metadata.update({
        "corpus": str(args.corpus), "split": args.split, "n_texts": len(texts),
        "max_passages": args.max_passages,
        "train_seconds": round(trained, 2),
    })
    path = projections.save(Path(args.out) / args.filename)
    meta = projections.metadata
    for layer, (first, last) in enumerate(zip(meta.get("loss_first", []),
                                              meta.get("loss_last", []), strict=True)):
        positives = meta.get("positives_per_layer")
        count = f"{positives[layer]} positives, " if positives else ""
        loss = "hinge" if args.objective == "paper" else "logistic"
        print(f"layer {layer}: {count}{loss} loss {first:.4f} -> {last:.4f}")
    for layer, kept in enumerate(meta.get("energy_kept_per_layer", [])):
        print(f"layer {layer}: rank-{args.rank} approximation keeps {kept:.1%} of the score energy")
    print(f"trained in {trained:.1f} s; wrote {path} ({path.stat().st_size / 1024:.0f} KiB, "
          f"centroids for B={sorted(projections.centroids)})")
    return 0
