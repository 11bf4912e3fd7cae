"""Everything the app and the sweeps need for one model, fitted in one resumable run.

The stages are the library's own fitting steps, in the order ``make assets`` runs them for
the bundled model: the gold graphs of the corpus' train split (a shard store, resumable and
split over torchrun ranks), the best projections (r = 8 low-rank logistic), the k-means key
codebooks, the HashAttention codes, the calibration table (with the floor) for those
projections, and the atlas of the validation split. Each finished stage writes a marker (its
files' SHA-256) atomically, so a rerun skips it; a file that no longer matches its marker is
refused with its path. The last step writes ``bundle.json`` (:mod:`sparsefinder.model_bundles`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparsefinder import distributed
from sparsefinder.bundle import MANIFEST, BundleError
from sparsefinder.files import atomic_write, file_sha256
from sparsefinder.model_bundles import bundle_folder, manifest_extras, model_fingerprint

#: Train texts below which the per-head calibration is refused: a table fitted on fewer gold
#: graphs sets each head's threshold from a handful of rows.
MIN_TRAIN_TEXTS = 8
PROJECTIONS = "projections-r8-lowrank-logistic.pt"
RANK = 8
#: (stage, relative cost) in run order; the costs weight the overall bar's time estimate.
STAGES = (("gold", 3.0), ("projections", 3.0), ("codebooks", 1.0), ("hash-codes", 2.0),
          ("calibration", 2.0), ("atlas", 2.0))
_MARKERS = ".stages"
_WORK = ".work"


class PrepareError(ValueError):
    """The model or corpus cannot be prepared; the message says why and what to do."""


@dataclass
class PrepareRun:
    """One ``prepare``: the loaded model, its texts and where its bundle goes."""

    loaded: Any
    model: str
    corpus: str
    folder: Path
    fingerprint: str
    train_texts: list[str]
    validation_texts: list[str]
    batch: int = 8
    world: distributed.World = field(default_factory=distributed.World)
    done: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    _records: list | None = None

    @property
    def records_folder(self) -> Path:
        return self.folder / _WORK / "records-train"

    def records(self) -> list:
        """The train split's gold graphs (read once from the shard store)."""
        if self._records is None:
            from sparsefinder.data.shards import ShardedRecords

            self._records = ShardedRecords(self.records_folder).load_all()
        return self._records

    def meta(self) -> dict[str, Any]:
        return {"corpus": self.corpus, "split": "train", "prepared": self.fingerprint}


def _marker(folder: Path, stage: str) -> Path:
    return folder / _MARKERS / f"{stage}.json"


def stage_done(folder: Path, stage: str) -> bool:
    """Whether ``stage`` finished in an earlier run; its files must still match."""
    path = _marker(folder, stage)
    if not path.is_file():
        return False
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise BundleError(f"the stage marker {path} is damaged ({error}); delete {folder} "
                          "and run `sparsefinder prepare` again") from error
    for name, sha in files.items():
        target = folder / name
        if not target.is_file() or file_sha256(target) != sha:
            raise BundleError(f"the prepared bundle at {folder} is corrupt: {target} does not "
                              f"match the stage marker {path}; delete {folder} and run "
                              "`sparsefinder prepare` again")
    return True


def _mark(folder: Path, stage: str, files: list[str], seconds: float) -> None:
    record = {"stage": stage, "seconds": round(seconds, 2),
              "files": {name: file_sha256(folder / name) for name in files}}
    text = json.dumps(record, indent=1).encode()
    atomic_write(_marker(folder, stage), lambda handle: handle.write(text))


def _gold(run: PrepareRun) -> list[str]:
    from sparsefinder.data.shards import extract_sharded

    extract_sharded(run.loaded, run.train_texts, run.records_folder, batch_size=run.batch,
                    progress=run.world.is_main, metadata={"corpus": run.corpus, "split": "train"})
    return []


def _projections(run: PrepareRun) -> list[str]:
    from sparsefinder.projections.objectives import fit_projections

    rank = min(RANK, run.loaded.head_dim)
    projections = fit_projections(run.records(), "lowrank-logistic", rank=rank, progress=True,
                                  model_id=run.loaded.model_id, alpha=run.loaded.alpha)
    projections.metadata.update({**run.meta(), "n_texts": len(run.train_texts)})
    projections.save(run.folder / PROJECTIONS)
    return [PROJECTIONS]


def codebook_clusters(records: list) -> list[int]:
    """The default numbers of centroids the keys can fill (4 keys a centroid at least)."""
    from sparsefinder.projections.key_codebooks import DEFAULT_CLUSTERS

    keys = sum(r.n_tokens for r in records)
    fits = [b for b in DEFAULT_CLUSTERS if 4 * b <= keys]
    return fits or [max(2, keys // 4)]


def _codebooks(run: PrepareRun) -> list[str]:
    from sparsefinder.projections.key_codebooks import fit_codebooks

    records = run.records()
    books = fit_codebooks(records, codebook_clusters(records), model_id=run.loaded.model_id,
                          alpha=run.loaded.alpha, metadata=run.meta())
    books.save(run.folder / "key_codebooks.pt")
    return ["key_codebooks.pt"]


def _hash_codes(run: PrepareRun) -> list[str]:
    from sparsefinder.predictors.hash_codes import HASH_BITS
    from sparsefinder.projections.hash_code_table import HashCodeTable
    from sparsefinder.projections.hash_fit import fit_hash_codes

    records = run.records()
    maps = fit_hash_codes(records, bits=HASH_BITS, steps=300, seed=0)
    table = HashCodeTable(model_id=run.loaded.model_id, alpha=run.loaded.alpha, maps=maps,
                          metadata={**run.meta(), "texts": len(records), "bits": HASH_BITS,
                                    "steps": 300, "seed": 0})
    table.save(run.folder / "hash_codes.pt")
    return ["hash_codes.pt"]


def _calibration(run: PrepareRun) -> list[str]:
    from sparsefinder.calibration.table import CalibrationTable
    from sparsefinder.projections.heads import HeadProjections
    from sparsefinder.projections.key_codebooks import KeyCodebooks

    path = run.folder / PROJECTIONS
    projections = HeadProjections.load(path, expected_model_id=run.loaded.model_id)
    books = KeyCodebooks.load(run.folder / "key_codebooks.pt")  # bundle.json comes last
    table = CalibrationTable.fit(run.records(), projections, file_sha256(path), codebooks=books)
    table.projections_file = PROJECTIONS
    table.metadata.update({**run.meta(), "alpha": run.loaded.alpha})
    table.save(run.folder / "calibration.pt")
    return ["calibration.pt"]


def _atlas(run: PrepareRun) -> list[str]:
    from sparsefinder.analysis.atlas import compute_atlas
    from sparsefinder.analysis.atlas_io import save_atlas
    from sparsefinder.analysis.atlas_predictor import calibrated_predictor
    from sparsefinder.data.records import extract

    predictor = calibrated_predictor(run.folder / "calibration.pt", run.loaded.model_id)
    mine = run.validation_texts[run.world.rank::run.world.size]
    records = extract(run.loaded, mine, batch_size=run.batch, long_text="error",
                      progress=run.world.is_main) if mine else []
    meta = {"model": run.loaded.model_id, "corpus": run.corpus, "split": "validation",
            "ranks": run.world.size}
    atlas = compute_atlas(lambda: records, predictor, alpha=run.loaded.alpha, meta=meta,
                          total=len(records))
    if run.world.is_main:
        save_atlas(atlas, run.folder / "atlas")
    return ["atlas/heads.csv", "atlas/atlas.json"]


_RUNNERS: dict[str, Callable[[PrepareRun], list[str]]] = {
    "gold": _gold, "projections": _projections, "codebooks": _codebooks,
    "hash-codes": _hash_codes, "calibration": _calibration, "atlas": _atlas}
#: Stages every torchrun rank runs (the others run on rank 0 while the rest wait).
_SHARED = ("gold", "atlas")


def write_manifest(run: PrepareRun) -> Path:
    """``bundle.json`` of the finished bundle, in the bundled format plus its provenance."""
    from sparsefinder.bundle_manifest import _dump, build_bundle_manifest

    manifest = build_bundle_manifest(run.folder)
    command = f"sparsefinder prepare --model {run.model} --corpus {run.corpus}"
    for entry in manifest["files"]:
        entry.update({"rebuild": command, "make": None})
    if "projections" in manifest["best"]:  # the bundled reason quotes the bundled model's numbers
        manifest["best"]["projections"]["why"] = (
            "the calibration table was fitted for it; the recipe measured best on the bundled "
            "model (r = 8 low-rank logistic, docs/results/quality.md)")
    manifest["note"] = ("Written by `sparsefinder prepare`; read with "
                        "sparsefinder.model_bundles.find_bundle().")
    manifest.update(manifest_extras(run.fingerprint, run.model, run.corpus, run.done,
                                    run.timings))
    manifest["atlas"] = ["atlas/heads.csv", "atlas/atlas.json"]
    text = _dump(manifest).encode()
    return atomic_write(run.folder / MANIFEST, lambda handle: handle.write(text))


@contextlib.contextmanager
def _overall_bar(enabled: bool) -> Iterator[Any]:
    """One bar over the stages, weighted by cost, whose rate gives the time left."""
    if not enabled:
        yield None
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=sum(cost for _, cost in STAGES), desc="prepare", unit="stage-cost",
               bar_format="{l_bar}{bar}| {postfix} [{elapsed}<{remaining}]")
    try:
        yield bar
    finally:
        bar.close()


#: ``on_progress(stage, fraction, seconds_left)``: the stage starting, the cost-weighted
#: fraction of the work done and the seconds left (None until a stage ran in this run).
ProgressFn = Callable[[str, float, "float | None"], None]


def run_stages(run: PrepareRun, stop_after: str | None = None,
               log: Callable[[str], None] = print, on_progress: ProgressFn | None = None
               ) -> bool:
    """Run the stages not yet done, in order; True when all are done (``stop_after``: end
    after that stage, as an interruption would)."""
    total = sum(cost for _, cost in STAGES)
    done_cost = ran_cost = ran_seconds = 0.0
    with _overall_bar(run.world.is_main) as bar:
        for stage, cost in STAGES:
            if bar is not None:
                bar.set_postfix_str(stage)
            if on_progress is not None and run.world.is_main:
                left = ran_seconds / ran_cost * (total - done_cost) if ran_cost else None
                on_progress(stage, done_cost / total, left)
            done = distributed.broadcast_object(
                stage_done(run.folder, stage) if run.world.is_main else None)
            if done:
                run.done.append(stage)
                if run.world.is_main:
                    log(f"stage {stage}: done in an earlier run, kept")
            else:
                start = time.perf_counter()
                files = (_RUNNERS[stage](run) if stage in _SHARED or run.world.is_main
                         else [])
                run.timings[stage] = time.perf_counter() - start
                if run.world.is_main:
                    _mark(run.folder, stage, files, run.timings[stage])
                    log(f"stage {stage}: done in {run.timings[stage]:.1f} s")
                run.done.append(stage)
                ran_cost, ran_seconds = ran_cost + cost, ran_seconds + run.timings[stage]
                distributed.barrier()
            done_cost += cost
            if bar is not None:
                bar.update(cost)
            if stage == stop_after:
                return False
    if on_progress is not None and run.world.is_main:
        on_progress("done", 1.0, 0.0)
    return True


def finish(run: PrepareRun) -> Path:
    """Write the manifest and drop the work files (the train gold graphs)."""
    path = write_manifest(run)
    shutil.rmtree(run.folder / _WORK, ignore_errors=True)
    return path


def check_corpus(train: list[str], validation: list[str], corpus: str) -> None:
    """Refuse a corpus too small to calibrate or to draw the atlas from, naming the minimum."""
    from sparsefinder.analysis.atlas import MIN_TEXTS

    if len(train) < MIN_TRAIN_TEXTS:
        raise PrepareError(
            f"corpus {corpus} gives {len(train)} train texts; calibrating needs at least "
            f"{MIN_TRAIN_TEXTS} (a .txt file with more blank-line separated passages, or "
            "--corpus default)")
    if len(validation) < MIN_TEXTS:
        raise PrepareError(
            f"corpus {corpus} gives {len(validation)} validation texts; the atlas needs at "
            f"least {MIN_TEXTS} (every 10th passage is validation: give more passages)")


def new_run(loaded: Any, model: str, corpus: str, root: Path | None, batch: int,
            world: distributed.World, max_passages: int | None = None) -> PrepareRun:
    """The run of ``loaded`` on ``corpus``: texts checked, bundle folder chosen."""
    from sparsefinder.data.chunking import chunk_passages
    from sparsefinder.data.corpus import load_corpus, split_of

    passages = load_corpus(corpus, None)  # unreadable or empty: the loader's own error
    texts = {}
    for split in ("train", "validation"):
        chosen = [p for p in passages if split_of(p) == split]
        if max_passages is not None:
            chosen = chosen[:max_passages]
        texts[split] = chunk_passages(chosen, loaded.tokenizer, loaded.max_length)
    check_corpus(texts["train"], texts["validation"], corpus)
    fingerprint = model_fingerprint(loaded)
    return PrepareRun(loaded=loaded, model=model, corpus=corpus,
                      folder=bundle_folder(fingerprint, root), fingerprint=fingerprint,
                      train_texts=texts["train"], validation_texts=texts["validation"],
                      batch=batch, world=world)
