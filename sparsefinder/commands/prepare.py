"""`sparsefinder prepare`: every learned file the app and the sweeps use, for any model.

One resumable run of the stages ``make assets`` runs for the bundled model (see
:mod:`sparsefinder.prepare`): gold graphs of the train split, r = 8 low-rank logistic
projections, key codebooks, hash codes, the calibration table with the floor, the atlas.
The bundle lands in ``--out`` (default ``$SPARSEFINDER_CACHE_DIR/bundles``) under the model's
weight fingerprint, where :func:`sparsefinder.model_bundles.find_bundle` finds it.

Under ``torchrun --nproc_per_node=N -m sparsefinder prepare ...`` the ranks split the gold
graphs and the atlas; the fits run on rank 0.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from sparsefinder.commands._common import add_model_arguments


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "prepare", help="fit everything the app needs for a model (resumable), into one bundle")
    add_model_arguments(parser)
    parser.add_argument("--corpus", default="default",
                        help="'default' (stdlib pydoc prose), a .txt/.jsonl file or a folder")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder of prepared bundles (default: "
                             "$SPARSEFINDER_CACHE_DIR/bundles, else ~/.cache/sparsefinder/"
                             "bundles); the bundle is OUT/FINGERPRINT")
    parser.add_argument("--max-passages", type=int, default=None,
                        help="use at most N passages of each split")
    parser.add_argument("--batch", type=int, default=8, help="texts per forward pass")
    parser.add_argument("--stop-after", default=None, help=argparse.SUPPRESS)
    return parser


def run(args: argparse.Namespace) -> int:
    from sparsefinder import distributed
    from sparsefinder.bundle import MANIFEST
    from sparsefinder.model_bundles import open_bundle
    from sparsefinder.models.loading import load_model
    from sparsefinder.models.offline import check_available
    from sparsefinder.prepare import finish, new_run, run_stages
    from sparsefinder.prepare_jobs import write_progress

    check_available(args.model)
    with distributed.torchrun_group(args.device) as world:
        loaded = load_model(args.model, alpha=args.alpha, alpha_layers=args.alpha_layers,
                            device=distributed.device_for(args.device, world))
        prepared = new_run(loaded, args.model, str(args.corpus), args.out, args.batch, world,
                           args.max_passages)
        if (prepared.folder / MANIFEST).is_file():
            open_bundle(prepared.folder)  # a damaged one is refused with its path
            if world.is_main:
                print(f"{args.model} is already prepared: {prepared.folder}")
            return 0
        if world.is_main:
            print(f"preparing {loaded.model_id} (fingerprint {prepared.fingerprint}, "
                  f"{loaded.num_layers} layers x {loaded.num_heads} heads) on corpus "
                  f"{args.corpus}: {len(prepared.train_texts)} train and "
                  f"{len(prepared.validation_texts)} validation texts -> {prepared.folder}"
                  + (f" over {world.size} ranks" if world.size > 1 else ""))
        progress = functools.partial(write_progress, prepared.folder)
        if not run_stages(prepared, stop_after=args.stop_after, log=_log(world.is_main),
                          on_progress=progress):
            if world.is_main:
                print(f"stopped after stage {args.stop_after}; rerun to resume")
            return 0
        if world.is_main:
            path = finish(prepared)
            total = sum(prepared.timings.values())
            print(f"prepared {loaded.model_id} in {total:.1f} s; wrote {path}")
    return 0


def _log(enabled: bool):
    from tqdm.auto import tqdm

    return (lambda line: tqdm.write(line)) if enabled else (lambda line: None)
