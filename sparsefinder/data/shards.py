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

**Resumable, never silently truncated.** A chunk is streamed by ``torch.save`` into
``chunk-N.pt.partial`` through a writer that hashes every byte on the way (one pass, no copy),
fsync'ed (``SPARSEFINDER_SHARDS_FSYNC=0`` skips it) and renamed (atomic on POSIX), and only
then gets its ``.sha256`` sidecar. The write runs in a background thread while the next chunk
goes through the model, so on an idle core it costs no wall time. A rerun
keeps a chunk only if file and sidecar exist and the file's hash matches; anything else (a
leftover ``.partial``, a file without sidecar after a kill, a mismatch) is redone. A full
disk fails the write of ``.partial``: the final name never exists, the error says so, and
the rerun redoes exactly that chunk. Readers check every chunk against the manifest's hash
before unpickling (``weights_only=True``).

**Streaming.** :class:`ShardedRecords` loads one chunk at a time, so a sweep over a corpus far
larger than RAM holds one chunk (``batch_size × chunk_batches`` records) at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

from sparsefinder import distributed
from sparsefinder.data.records import AttentionRecord, _tokenize, extract
from sparsefinder.data.records_io import records_from_payload, records_payload
from sparsefinder.models.loading import LoadedModel

FORMAT = "sparsefinder-shards"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_PARTIAL = ".partial"


class ShardsError(ValueError):
    """A shard store cannot be used or resumed as asked; the message says why and what to do."""


@dataclass(frozen=True)
class Chunk:
    """``texts``: indices into the corpus list, in the order extract() batches them."""

    index: int
    rank: int
    texts: tuple[int, ...]

    @property
    def file(self) -> str:
        return f"chunk-{self.index:05d}.pt"


def plan_chunks(lengths: Sequence[int], batch_size: int, chunk_batches: int,
                world_size: int) -> list[Chunk]:
    """Cut the length-sorted corpus into chunks of whole batches, round-robin over ranks."""
    if batch_size < 1 or chunk_batches < 1 or world_size < 1:
        raise ValueError("batch_size, chunk_batches and world_size must be >= 1")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])  # extract()'s (stable) sort
    size = batch_size * chunk_batches
    return [Chunk(c, c % world_size, tuple(order[start:start + size]))
            for c, start in enumerate(range(0, len(order), size))]


def texts_digest(texts: Sequence[str]) -> str:
    """SHA-256 of the corpus as read (so a rerun on other texts is refused, not mixed)."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(hashlib.sha256(text.encode("utf-8")).digest())
    return digest.hexdigest()


# ==================================================================== files


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _HashingFile:
    """Write-through file object that SHA-256-hashes what it writes: one pass over the bytes.

    ``torch.save`` streams its zip records into it (no in-memory copy of the chunk). The
    first OSError (e.g. ENOSPC) is kept: torch's C++ writer turns it into a RuntimeError,
    and :func:`_write_atomic` re-raises the original with its errno.
    """

    def __init__(self, handle: BinaryIO) -> None:
        self.handle, self.name = handle, str(getattr(handle, "name", ""))
        self.hash, self.size, self.error = hashlib.sha256(), 0, None

    def write(self, data: bytes | memoryview) -> int:
        try:
            written = self.handle.write(data)
        except OSError as error:
            self.error = error
            raise
        self.hash.update(data)
        self.size += memoryview(data).nbytes
        return written

    def flush(self) -> None:
        self.handle.flush()


def _write_atomic(path: Path, fill: Callable[[_HashingFile], object]) -> _HashingFile:
    """temp file + fsync + rename: ``path`` either holds all that ``fill`` wrote or does not
    exist. Returns the writer (``.hash``: SHA-256 of the bytes, ``.size``).

    ``SPARSEFINDER_SHARDS_FSYNC=0`` skips the fsync (a killed process loses no written pages;
    after an OS crash a lost chunk fails its checksum and is redone).
    """
    tmp = path.with_name(path.name + _PARTIAL)
    writer = None
    try:
        with open(tmp, "wb") as handle:
            writer = _HashingFile(handle)
            fill(writer)
            handle.flush()
            if os.environ.get("SPARSEFINDER_SHARDS_FSYNC", "1") != "0":
                os.fsync(handle.fileno())  # durable across power loss, not only process kills
    except (OSError, RuntimeError) as exc:
        error = writer.error if writer is not None and writer.error is not None else exc
        if not isinstance(error, OSError):
            raise
        with_hint = (f"writing {path.name} failed ({error.strerror or error}); the chunk was "
                     f"not completed (only {tmp.name} may remain) — free disk space and rerun "
                     "the same command: complete chunks are kept, this one is redone")
        raise OSError(error.errno, with_hint) from error
    os.replace(tmp, path)
    return writer


def _write_bytes(path: Path, data: bytes) -> None:
    _write_atomic(path, lambda handle: handle.write(data))


@contextlib.contextmanager
def _torch_crc32_off() -> Iterator[None]:
    """Skip ``torch.save``'s CRC32 of every zip record for the block.

    Our SHA-256 already covers every byte of the file, and torch's CRC32 costs more than it
    (measured here: 0.24 s vs 0.09 s of CPU per 150 MB). ``torch.load`` does not need the
    CRCs. The option is process-wide: it is restored on exit; a ``torch.save`` running in
    another thread meanwhile would also skip its CRCs (its file still loads).
    """
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(before)


def write_chunk(folder: Path, chunk: Chunk, records: list[AttentionRecord],
                metadata: dict) -> dict:
    """Write one chunk atomically with its checksum sidecar; returns its manifest entry.

    The payload is streamed by ``torch.save`` through the hashing writer straight into the
    ``.partial`` file: no second copy of the chunk in memory, no second pass to hash it.
    """
    payload = records_payload(records, {**metadata, "chunk": chunk.index})
    path = folder / chunk.file
    with _torch_crc32_off():
        writer = _write_atomic(path, lambda handle: torch.save(payload, handle))
    digest = writer.hash.hexdigest()
    _write_bytes(path.with_name(path.name + ".sha256"), digest.encode())
    edges = sum(len(layer["edges"]) for r in payload["records"] for layer in r["layers"])
    return _entry(chunk, digest, writer.size, edges)  # edge lists: counted without a pass


def _entry(chunk: Chunk, digest: str, size: int, gold_edges: int | None) -> dict:
    return {"index": chunk.index, "rank": chunk.rank, "texts": list(chunk.texts),
            "file": chunk.file, "sha256": digest, "bytes": size, "gold_edges": gold_edges}


def complete_chunk(folder: Path, chunk: Chunk) -> str | None:
    """The chunk's SHA-256 if its file is whole (sidecar present and matching), else None."""
    path = folder / chunk.file
    sidecar = path.with_name(path.name + ".sha256")
    if not (path.is_file() and sidecar.is_file()):
        return None
    expected = sidecar.read_text().strip()
    with open(path, "rb") as handle:  # streamed in blocks: a chunk is never held twice
        actual = hashlib.file_digest(handle, "sha256").hexdigest()
    return expected if actual == expected else None


def read_chunk(path: Path, sha256: str | None) -> tuple[list[AttentionRecord], dict]:
    """Records of one chunk file; refused when its bytes do not hash to ``sha256``."""
    data = path.read_bytes()
    if sha256 is not None and _sha256(data) != sha256:
        raise ShardsError(f"{path} does not match the checksum in its manifest (partial or "
                          "altered); rerun the extraction with the same command to redo it")
    payload = torch.load(io.BytesIO(data), weights_only=True)
    return records_from_payload(payload, path)


# ==================================================================== manifest


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


# ==================================================================== extraction


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


# ==================================================================== reading


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
