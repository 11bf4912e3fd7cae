"""Sharded, resumable, checksummed record stores: gold graphs of corpora that outgrow a process.

Layout of a store (one folder, shared by every rank and node)::

    DIR/manifest.json         the plan and, once done, every chunk's SHA-256 (rank 0 writes it)
    DIR/chunk-00007.pt        records of chunk 7 (``records_io`` payload, torch.save bytes)
    DIR/chunk-00007.pt.sha256 its checksum, written only after the atomic rename

**Deterministic split, identical result.** ``extract()`` sorts texts by token length and cuts
batches from that order. The plan does the same sort over the WHOLE corpus and cuts it into
chunks of ``chunk_batches`` whole batches; chunk ``c`` goes to rank ``c mod world``. So every
forward pass a rank runs is one of the single-process run's batches (same texts, same padding):
the gold edges and q/k vectors are those of ``sparsefinder extract`` in one process, edge for
edge. Round-robin over the length-sorted order also balances long texts across ranks.

**Resumable, never silently truncated.** A chunk is written atomically with a checksum sidecar
(:mod:`sparsefinder.data.shard_files`). The write runs in a background thread while the next
chunk goes through the model, so on an idle core it costs no wall time. A rerun keeps a chunk
only if file and sidecar exist and the file's hash matches; anything else (a leftover
``.partial``, a file without sidecar after a kill, a mismatch) is redone. A full disk fails the
write of ``.partial``: the final name never exists, the error says so, and the rerun redoes
exactly that chunk. Readers check every chunk against the manifest's hash before unpickling
(``weights_only=True``).

**Streaming.** :class:`ShardedRecords` loads one chunk at a time, so a sweep over a corpus far
larger than RAM holds one chunk (``batch_size × chunk_batches`` records) at once."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from sparsefinder import distributed
from sparsefinder.data.records import AttentionRecord, _tokenize, extract
from sparsefinder.data.shard_files import (
    _PARTIAL,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    Chunk,
    ShardsError,
    _entry,
    _write_bytes,
    complete_chunk,
    plan_chunks,
    read_chunk,
    texts_digest,
    write_chunk,
)
from sparsefinder.models.loading import LoadedModel


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; create the store with "
                                "`sparsefinder extract --sharded --out DIR` (or under torchrun)")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
        raise ShardsError(f"{path} is not a version-{FORMAT_VERSION} {FORMAT} manifest")
    return manifest


def _write_manifest(folder: Path, manifest: dict) -> None:
    _write_bytes(folder / MANIFEST, json.dumps(manifest, indent=1).encode())


def check_compatible(manifest: dict, settings: dict, folder: Path) -> None:
    """Refuse to resume a store written by another model, α, corpus, rank count or batching."""
    if manifest["world_size"] != settings["world_size"]:
        raise ShardsError(
            f"{folder} was written by a run with {manifest['world_size']} ranks, this run has "
            f"{settings['world_size']}; rerun with {manifest['world_size']} processes "
            "(torchrun --nproc_per_node × --nnodes) or write to a new --out folder")
    if manifest["model_id"] != settings["model_id"] or not math.isclose(
            manifest["alpha"], settings["alpha"]):
        raise ShardsError(
            f"{folder} holds shards of model {manifest['model_id']} at alpha="
            f"{manifest['alpha']}, this run is {settings['model_id']} at alpha="
            f"{settings['alpha']}; use a new --out folder for another model or alpha")
    for key in ("texts_sha256", "n_texts", "batch_size", "chunk_batches", "split"):
        if manifest[key] != settings[key]:
            raise ShardsError(
                f"{folder} was written with another {key} ({manifest[key]!r}, this run "
                f"{settings[key]!r}); resume with the same corpus and options or use a new "
                "--out folder")


def extract_sharded(loaded: LoadedModel, texts: Sequence[str], folder: str | Path, *,
                    metadata: dict, batch_size: int = 8, chunk_batches: int = 8,
                    progress: bool = False) -> dict:
    """Extract ``texts`` into a shard store at ``folder`` with this process's share of chunks.

    Under torchrun every rank calls this with the same arguments; rank 0 plans and writes the
    manifest. Complete chunks of an earlier run are kept, partial ones redone. Returns the
    final manifest (on every rank). ``metadata`` (model_id, alpha, corpus, split, …) is
    stored in the manifest and in every chunk.
    """
    import time

    world = distributed.current_world()
    folder = Path(folder)
    items, _ = _tokenize(loaded, list(texts), "error")
    chunks = plan_chunks([len(item["input_ids"]) for item in items], batch_size,
                         chunk_batches, world.size)
    settings = {**metadata, "model_id": loaded.model_id, "alpha": float(loaded.alpha),
                "world_size": world.size, "n_texts": len(texts), "batch_size": batch_size,
                "chunk_batches": chunk_batches, "texts_sha256": texts_digest(texts)}
    error = None
    if world.is_main:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if (folder / MANIFEST).is_file():
                check_compatible(read_manifest(folder), settings, folder)
            else:
                _write_manifest(folder, {"format": FORMAT, "version": FORMAT_VERSION,
                                         "status": "running", **settings, "chunks": []})
        except (ValueError, OSError) as exc:  # every rank must stop, not wait for rank 0
            error = f"{type(exc).__name__}: {exc}"
    error = distributed.broadcast_object(error)
    if error is not None:
        raise ShardsError(error.split(": ", 1)[1])
    mine = [c for c in chunks if c.rank == world.rank]
    entries, redone, forward = [], 0, 0.0
    distributed.barrier()
    start = time.perf_counter()
    # Chunk c is serialised, hashed and written by one writer thread while chunk c + 1 runs
    # through the model (file writes, SHA-256 and torch ops release the GIL). At most one
    # write is in flight, so memory holds two chunks; a failed write stops the loop at the
    # next chunk, before anything else is written.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-writer") as writer:
        pending: Future | None = None
        for chunk in mine:
            digest = complete_chunk(folder, chunk)
            if digest is not None:
                entries.append(_entry(chunk, digest, (folder / chunk.file).stat().st_size,
                                      _chunk_edges(folder, chunk)))
                continue
            for leftover in (folder / chunk.file, folder / (chunk.file + _PARTIAL)):
                leftover.unlink(missing_ok=True)
            forward_start = time.perf_counter()
            records = extract(loaded, [texts[i] for i in chunk.texts], batch_size=batch_size,
                              long_text="error")
            forward += time.perf_counter() - forward_start
            if pending is not None:
                entries.append(_finished(pending, world.rank, progress))
            pending = writer.submit(write_chunk, folder, chunk, records, settings)
            del records
            redone += 1
        if pending is not None:
            entries.append(_finished(pending, world.rank, progress))
    seconds = time.perf_counter() - start
    gathered = distributed.gather_objects({"entries": entries, "redone": redone,
                                           "seconds": seconds, "forward": forward})
    manifest = {"format": FORMAT, "version": FORMAT_VERSION, "status": "complete", **settings,
                "chunks": sorted((e for g in gathered for e in g["entries"]),
                                 key=lambda e: e["index"]),
                "rank_seconds": [g["seconds"] for g in gathered],
                # of rank_seconds, the time inside extract() (the model): the rest is checks,
                # waiting for the writer thread and the manifest
                "rank_forward_seconds": [g["forward"] for g in gathered],
                "chunks_written_this_run": sum(g["redone"] for g in gathered)}
    if world.is_main:
        _write_manifest(folder, manifest)
    distributed.barrier()
    return manifest


def _finished(pending: Future, rank: int, progress: bool) -> dict:
    """The manifest entry of a chunk write (its error, if it failed)."""
    entry = pending.result()
    if progress:
        print(f"rank {rank}: chunk {entry['index']} ({len(entry['texts'])} records) written",
              flush=True)
    return entry


def _chunk_edges(folder: Path, chunk: Chunk) -> int | None:
    """Gold edges of a kept chunk, from the previous manifest when it has them."""
    try:
        old = read_manifest(folder)
    except (FileNotFoundError, ShardsError, json.JSONDecodeError):
        return None
    for entry in old.get("chunks", []):
        if entry["index"] == chunk.index:
            return entry.get("gold_edges")
    return None


class ShardedRecords:
    """A complete shard store, read lazily: one chunk in memory at a time.

    ``ranks``/``world`` select the chunks of one rank (``chunk.rank``-independent: chunk ``c``
    belongs to reader rank ``c mod world``), so a sweep or training run may use another
    number of processes than the extraction did.
    """

    def __init__(self, folder: str | Path, *, expected_model_id: str | None = None,
                 expected_alpha: float | None = None) -> None:
        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder)
        if self.manifest.get("status") != "complete":
            raise ShardsError(f"{self.folder} is incomplete (a run was interrupted); rerun the "
                              "same extract command to finish it")
        model_id, alpha = self.manifest["model_id"], float(self.manifest["alpha"])
        if expected_model_id is not None and model_id != expected_model_id:
            raise ShardsError(f"shards in {self.folder} come from model {model_id}, not "
                              f"{expected_model_id}; extract this model's gold graphs first")
        if expected_alpha is not None and not math.isclose(alpha, expected_alpha):
            raise ShardsError(f"shards in {self.folder} were extracted at alpha={alpha}, not "
                              f"{expected_alpha}; extract again at this alpha")

    @property
    def chunks(self) -> list[dict]:
        return self.manifest["chunks"]

    def __len__(self) -> int:
        return int(self.manifest["n_texts"])

    def chunks_of(self, rank: int = 0, world: int = 1) -> list[dict]:
        return [c for c in self.chunks if c["index"] % world == rank]

    def iter_indexed(self, rank: int = 0, world: int = 1
                     ) -> Iterator[tuple[int, AttentionRecord]]:
        """``(corpus index, record)`` of the chunks of reader ``rank`` of ``world``."""
        for entry in self.chunks_of(rank, world):
            records, meta = read_chunk(self.folder / entry["file"], entry["sha256"])
            if meta.get("model_id") != self.manifest["model_id"] or not math.isclose(
                    float(meta.get("alpha", math.nan)), float(self.manifest["alpha"])):
                raise ShardsError(f"{entry['file']} in {self.folder} comes from model "
                                  f"{meta.get('model_id')} at alpha={meta.get('alpha')}, "
                                  "not the manifest's; re-extract into a new folder")
            yield from zip(entry["texts"], records, strict=True)

    def iter_records(self, rank: int = 0, world: int = 1) -> Iterator[AttentionRecord]:
        for _, record in self.iter_indexed(rank, world):
            yield record

    def __iter__(self) -> Iterator[AttentionRecord]:
        return self.iter_records()

    def load_all(self) -> list[AttentionRecord]:
        """Every record in corpus order (memory: the whole store; for small stores/tests)."""
        return [r for _, r in sorted(self.iter_indexed(), key=lambda pair: pair[0])]
