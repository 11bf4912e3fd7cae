"""`sparsefinder atlas`: every head of a model across a corpus — what it does, where the
predictor fails.

Writes DIR/heads.csv (one row per layer and head: every statistic and the pattern type) and
DIR/atlas.json (also the head-to-head similarity, its cluster order, the 2-D head map, three
typical example rows per head and the histograms), and prints the pattern types per layer
and the heads where the predictor loses most.

The predictor is the app's default setting (:mod:`sparsefinder.analysis.atlas_predictor`):
for the bundled model, ``distance:budget`` at ``--target`` from the bundled calibration table;
another model needs ``--calibration FILE`` from `sparsefinder calibrate` (without it, the
atlas has no predictor columns).

Under ``torchrun --nproc_per_node=N -m sparsefinder atlas ...`` every rank extracts every
N-th text (or, with ``--records``, reads its chunks of a shard store) and the sums are
all-reduced: the files equal a one-process run's.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from sparsefinder.analysis.atlas import MIN_TEXTS, AtlasInputError, HeadAtlas, compute_atlas
from sparsefinder.analysis.atlas_io import save_atlas
from sparsefinder.analysis.atlas_predictor import (
    AtlasPredictor,
    bundled_predictor,
    calibrated_predictor,
    default_spec,
)
from sparsefinder.commands._common import (
    add_corpus_arguments,
    add_model_arguments,
    passages_label,
    progress_bar,
)
from sparsefinder.data.corpus import corpus_texts
from sparsefinder.data.records import extract

#: Heads listed as the predictor's worst.
WORST = 5


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "atlas", help="per-head statistics, pattern types, similarity and predictor failures")
    add_model_arguments(parser)
    add_corpus_arguments(parser, default_split="validation")
    parser.add_argument("--out", required=True, type=Path, help="folder for the results")
    parser.add_argument("--batch", type=int, default=8, help="texts per forward pass")
    parser.add_argument("--target", type=float, default=0.9,
                        help="target sparsity of the scored predictor (a calibrated target)")
    parser.add_argument("--calibration", type=Path, default=None,
                        help="calibration table from `sparsefinder calibrate` (default for "
                             "--model default: the bundled one)")
    parser.add_argument("--no-predictor", action="store_true",
                        help="skip the predictor's per-head recall")
    parser.add_argument("--records", type=Path, default=None,
                        help="read a shard store (DIR/records-SPLIT from `sparsefinder extract "
                             "--sharded`) instead of extracting; model, alpha and split come "
                             "from the store")
    return parser


def _predictor(args: argparse.Namespace, model_id: str) -> AtlasPredictor | None:
    if args.no_predictor:
        return None
    spec = default_spec(args.target)
    if args.calibration is not None:
        return calibrated_predictor(args.calibration, model_id, spec)
    predictor = bundled_predictor(model_id)  # None unless the bundle calibrates this model
    if predictor is not None:
        predictor.spec = spec
        return predictor
    print(f"note: no calibration table for {model_id}; the atlas has no predictor columns "
          "(pass --calibration FILE from `sparsefinder calibrate`)")
    return None


def _report(atlas: HeadAtlas) -> None:
    counts = atlas.type_counts()
    print("pattern types per layer:")
    print(counts.to_string())
    if atlas.meta.get("predictor"):
        worst = atlas.heads.sort_values("pred_recall").head(WORST)
        print(f"heads where {atlas.meta['predictor']} loses most:")
        print(worst[["layer", "head", "type", "pred_recall", "pred_mass_recall",
                     "pred_exact_fraction", "gold_sparsity"]].to_string(
            index=False, float_format=lambda x: f"{x:.4f}"))


def _run_from_store(args: argparse.Namespace) -> int:
    from sparsefinder import distributed
    from sparsefinder.data.shards import ShardedRecords

    with distributed.torchrun_group(args.device) as world:
        store = ShardedRecords(args.records)
        model_id, alpha = store.manifest["model_id"], float(store.manifest["alpha"])
        predictor = _predictor(args, model_id)
        meta = {"model": model_id, "records": str(args.records),
                "corpus": store.manifest.get("corpus"), "split": store.manifest.get("split"),
                "ranks": world.size}
        atlas = compute_atlas(lambda: store.iter_records(world.rank, world.size), predictor,
                              alpha=alpha, meta=meta)
        if world.is_main:
            _finish(atlas, args.out)
    return 0


def _finish(atlas: HeadAtlas, out: Path) -> None:
    csv_path, json_path = save_atlas(atlas, out)
    _report(atlas)
    print(f"wrote {csv_path} and {json_path}")


def run(args: argparse.Namespace) -> int:
    if args.records is not None:
        return _run_from_store(args)
    from sparsefinder import distributed
    from sparsefinder.models.loading import load_model

    if args.max_passages is not None and args.max_passages < 1:
        raise ValueError(f"--max-passages must be >= 1 (the atlas needs at least {MIN_TEXTS} "
                         "texts)")
    with distributed.torchrun_group(args.device) as world:
        loaded = load_model(args.model, alpha=args.alpha,
                            device=distributed.device_for(args.device, world))
        texts = corpus_texts(args.corpus, args.split, loaded.tokenizer, loaded.max_length,
                             args.max_passages)
        if len(texts) < MIN_TEXTS:
            raise AtlasInputError(
                f"the {args.split} split of corpus {args.corpus} gives {len(texts)} texts; the "
                f"atlas needs at least {MIN_TEXTS} (use a larger corpus, --split all, or drop "
                "--max-passages)")
        predictor = _predictor(args, loaded.model_id)
        mine = texts[world.rank::world.size]
        if world.is_main:
            print(f"model {loaded.model_id}; {passages_label(args.max_passages)} passages of "
                  f"the {args.split} split -> {len(texts)} texts"
                  + (f" over {world.size} ranks" if world.size > 1 else "")
                  + (f"; predictor {predictor.label}" if predictor else ""))
        records = extract(loaded, mine, batch_size=args.batch, long_text="error",
                          progress=world.is_main) if mine else []
        meta = {"model": loaded.model_id, "corpus": str(args.corpus), "split": args.split,
                "max_passages": args.max_passages, "ranks": world.size}
        bar = progress_bar("atlas") if world.is_main else contextlib.nullcontext(None)
        with bar as on_progress:
            atlas = compute_atlas(lambda: records, predictor, alpha=loaded.alpha, meta=meta,
                                  total=len(records), on_progress=on_progress)
        if world.is_main:
            _finish(atlas, args.out)
    return 0
