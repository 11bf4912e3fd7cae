"""Sharded extraction: 1 vs 2 torchrun processes, the manifest/resume overhead, streaming RSS.

Run under the shared lock (the machine has 2 cores):
``flock /tmp/sparsefinder-bench.lock .venv/bin/python benchmarks/distributed.py``.

1. Throughput. ``torchrun --nproc_per_node=P -m sparsefinder extract`` on the first
   ``--passages`` passages of the default corpus' train split, P = 1 and P = 2, one intra-op
   thread per process (OMP_NUM_THREADS=1: P processes use P cores). Timed: the extraction
   phase every rank reports in the manifest (``rank_seconds``, the slowest rank; from a
   barrier after the model load to its last chunk written); the wall time of the whole
   command (process start, model load) is printed too.
2. Overhead, one process: ``extract()`` + ``save_records`` (today's single file) against
   ``extract_sharded`` (chunks streamed through SHA-256 into temp file + fsync + rename by a
   writer thread overlapping the next chunk's forward, sidecars, manifest) and against a
   rerun on the finished store (every chunk re-hashed, nothing redone). Best of
   ``--repeats``, alternated. ``overhead`` is wall time (what a user waits for: the writer
   thread hides its work on an idle core), ``overhead_cpu`` the process CPU time of all
   threads (the extra work: on a machine whose cores are all busy, this is what it costs),
   ``overhead_normalised`` the median over repeats of (sharded non-model time / its model
   time − saving time / its model time) / (1 + the latter): each run measured against its
   own forward passes, so load that changes between runs cancels.
3. Memory: peak RSS (VmHWM of a fresh process) streaming every record of the store
   (``ShardedRecords.iter_records``: gold edges counted) at 1× and at 10× its size (the same
   chunk files hard-linked ten times under a 10× manifest), against loading the 1× store
   whole (what ``load_records`` of one file does today).

Last line: ``speedup=<2 procs vs 1> overhead=<wall fraction> overhead_cpu=<CPU fraction>
overhead_normalised=<fraction>``. ``--smoke``: 2 passages, one repeat, no throughput part
(every torchrun rank loads the model; ``--smoke --no-skip-throughput`` runs it too).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _common import parse, parser  # noqa: E402

from sparsefinder import runtime  # noqa: E402
from sparsefinder.data.corpus import corpus_texts  # noqa: E402
from sparsefinder.data.records import extract  # noqa: E402
from sparsefinder.data.records_io import save_records  # noqa: E402
from sparsefinder.data.shards import extract_sharded  # noqa: E402
from sparsefinder.models.loading import load_model  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""}
RSS_PROBE = """
import sys
from sparsefinder.data.shards import ShardedRecords
store = ShardedRecords(sys.argv[1])
if sys.argv[2] == "none":
    edges = 0
elif sys.argv[2] == "stream":
    edges = sum(int(l.gold.sum()) for r in store.iter_records() for l in r.layers)
else:
    records = store.load_all(); edges = sum(int(l.gold.sum()) for r in records for l in r.layers)
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(int(hwm) / 1024, edges)  # VmHWM: this exec's peak (ru_maxrss counts the parent's)
"""


def elapsed(clocks: tuple[float, float]) -> tuple[float, float]:
    """(wall, CPU) seconds since ``clocks``; process CPU time counts every thread."""
    return time.perf_counter() - clocks[0], time.process_time() - clocks[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_extract(nproc: int, out: Path, passages: int, chunk_batches: int) -> tuple:
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}",
               "-m", "sparsefinder", "extract", "--max-passages", str(passages), "--out",
               str(out), "--device", "cpu", "--chunk-batches", str(chunk_batches)]
    start = time.perf_counter()
    subprocess.run(command, env=ENV, check=True, capture_output=True, cwd=REPO)
    wall = time.perf_counter() - start
    manifest = json.loads((out / "records-train" / "manifest.json").read_text())
    return max(manifest["rank_seconds"]), wall, manifest


def rss(store: Path, mode: str) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-c", RSS_PROBE, str(store), mode], env=ENV,
                         check=True, capture_output=True, text=True, cwd=REPO).stdout.split()
    return float(out[0]), int(out[1])


def tenfold(store: Path, dest: Path) -> Path:
    """A 10× store: every chunk file hard-linked 10 times, listed 10 times in the manifest."""
    dest.mkdir()
    manifest = json.loads((store / "manifest.json").read_text())
    chunks = []
    for copy in range(10):
        for entry in manifest["chunks"]:
            name = f"x{copy}-{entry['file']}"
            os.link(store / entry["file"], dest / name)
            chunks.append({**entry, "index": len(chunks), "file": name})
    manifest.update(chunks=chunks, n_texts=manifest["n_texts"] * 10)
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


def main() -> None:
    made = parser(__doc__.splitlines()[0])
    made.add_argument("--passages", type=int, default=160)
    made.add_argument("--chunk-batches", type=int, default=2)
    made.add_argument("--repeats", type=int, default=3)
    made.add_argument("--skip-throughput", action=argparse.BooleanOptionalAction,
                      default=False, help="only the overhead and memory parts (speedup=nan)")
    args = parse(made, smoke={"passages": 2, "repeats": 1, "chunk_batches": 1,
                              "skip_throughput": True})
    print(f"load average: {os.getloadavg()}")
    tmp = Path(tempfile.mkdtemp(prefix="sf-dist-bench-"))
    try:
        timings = {}
        for nproc in () if args.skip_throughput else (1, 2):
            best = None
            for _ in range(args.repeats):
                out = tmp / f"p{nproc}"
                shutil.rmtree(out, ignore_errors=True)
                result = torchrun_extract(nproc, out, args.passages, args.chunk_batches)
                best = result if best is None or result[0] < best[0] else best
            timings[nproc] = best
            manifest = best[2]
            print(f"{nproc} process(es): extraction {best[0]:.2f} s (rank seconds "
                  f"{[round(s, 2) for s in manifest['rank_seconds']]}), command wall "
                  f"{best[1]:.2f} s; {manifest['n_texts']} texts, {len(manifest['chunks'])} "
                  f"chunks")
        speedup = timings[1][0] / timings[2][0] if timings else float("nan")
        print(f"load average after the throughput runs: {os.getloadavg()}")

        runtime.tune_cpu_allocator()
        import torch

        torch.set_num_threads(1)
        loaded = load_model("default", device="cpu")
        texts = corpus_texts("default", "train", loaded.tokenizer, loaded.max_length,
                             args.passages)
        plain, sharded, resume, normalised = [], [], [], []  # (wall s, process CPU s)
        for repeat in range(args.repeats):  # alternated, so drifting load hits both alike
            clocks = (time.perf_counter(), time.process_time())
            records = extract(loaded, texts, long_text="error")
            forward = time.perf_counter() - clocks[0]
            save_records(records, tmp / f"plain{repeat}.pt",
                         metadata={"model_id": loaded.model_id})
            plain.append(elapsed(clocks))
            del records
            store = tmp / f"store{repeat}"
            clocks = (time.perf_counter(), time.process_time())
            manifest = extract_sharded(loaded, texts, store, metadata={"split": "train"},
                                       chunk_batches=args.chunk_batches)
            sharded.append(elapsed(clocks))
            # Each run's non-model time over its own model time: load that slows a whole
            # run slows both terms alike and cancels (the raw wall ratio does not).
            save_share = (plain[-1][0] - forward) / forward
            shard_share = (sharded[-1][0] - manifest["rank_forward_seconds"][0]) / \
                manifest["rank_forward_seconds"][0]
            normalised.append((shard_share - save_share) / (1 + save_share))
            clocks = (time.perf_counter(), time.process_time())
            again = extract_sharded(loaded, texts, store, metadata={"split": "train"},
                                    chunk_batches=args.chunk_batches)
            resume.append(elapsed(clocks))
            assert again["chunks_written_this_run"] == 0
            print(f"  repeat {repeat}: plain {plain[-1][0]:.2f} s wall / {plain[-1][1]:.2f} s "
                  f"CPU (saving {save_share:.3f} of the model time), sharded "
                  f"{sharded[-1][0]:.2f} / {sharded[-1][1]:.2f} (rest {shard_share:.3f} of "
                  f"the model time), load {os.getloadavg()[0]:.2f}", flush=True)
        best = {name: [min(t[i] for t in runs) for i in (0, 1)]
                for name, runs in (("plain", plain), ("sharded", sharded), ("resume", resume))}
        overhead = best["sharded"][0] / best["plain"][0] - 1
        overhead_cpu = best["sharded"][1] / best["plain"][1] - 1
        overhead_normalised = sorted(normalised)[len(normalised) // 2]
        print(f"one process, best of {args.repeats}: extract+save_records "
              f"{best['plain'][0]:.2f} s wall ({best['plain'][1]:.2f} s CPU), sharded store "
              f"{best['sharded'][0]:.2f} s wall ({best['sharded'][1]:.2f} s CPU): overhead "
              f"{overhead:+.3f} wall, {overhead_cpu:+.3f} CPU, {overhead_normalised:+.3f} "
              f"load-normalised (median); rerun on the complete store "
              f"(hash every chunk, redo none) {best['resume'][0]:.2f} s "
              f"= {best['resume'][0] / best['plain'][0]:.3f} of an extraction")
        for path in tmp.glob("plain*.pt"):
            path.unlink()

        store = tmp / "store0"
        size = sum(f.stat().st_size for f in store.glob("chunk-*.pt")) / 2**20
        big = tenfold(store, tmp / "store10x")
        stream1, edges1 = rss(store, "stream")
        stream10, edges10 = rss(big, "stream")
        whole1, _ = rss(store, "load")
        baseline, _ = rss(store, "none")
        assert edges10 == 10 * edges1
        print(f"peak RSS: streaming 1x ({size:.0f} MiB of chunks) {stream1:.0f} MiB, "
              f"streaming 10x ({10 * size:.0f} MiB) {stream10:.0f} MiB, loading 1x whole "
              f"{whole1:.0f} MiB; after imports alone {baseline:.0f} MiB")
        print(f"load average: {os.getloadavg()}")
        print(f"speedup={speedup:.3f} overhead={overhead:.4f} overhead_cpu={overhead_cpu:.4f} "
              f"overhead_normalised={overhead_normalised:.4f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
