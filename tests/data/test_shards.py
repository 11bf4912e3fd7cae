"""Sharded extraction: 2 gloo ranks under torchrun = one process, resumable after a kill."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from tolerances import assert_layers_close, transformer_terms

from sparsefinder.cli import main
from sparsefinder.data.records_io import load_records
from sparsefinder.data.shard_files import ShardsError, plan_chunks
from sparsefinder.data.shards import ShardedRecords, read_manifest

_spec = importlib.util.spec_from_file_location(
    "distributed_worker", Path(__file__).parents[1] / "distributed_worker.py")
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)
TEXTS, extract_args, torchrun = helpers.TEXTS, helpers.extract_args, helpers.torchrun

KILLER = """
import os, signal, sys
import sparsefinder.data.shard_files as shards
from sparsefinder.cli import main
real, seen = shards._HashingFile.write, set()
def dying(self, data):
    # rank 1's second chunk (chunk 3): die half-way through streaming it into its .partial
    if os.environ["RANK"] == "1" and self.name.endswith("chunk-00003.pt.partial"):
        if self.size > 0:
            self.handle.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    return real(self, data)
shards._HashingFile.write = dying
raise SystemExit(main(sys.argv[1:]))
"""

# The tiny BERT of tests/conftest.py (tiny_model_dirs["bert"]): its sizes bound the rounding.
TINY_HIDDEN, TINY_INTERMEDIATE = 32, 64


@pytest.fixture(scope="module")
def setup(tiny_model_dirs, tmp_path_factory):
    """The tiny BERT, a 12-text corpus and the single-process reference records."""
    root = tmp_path_factory.mktemp("shards")
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(TEXTS) + "\n", encoding="utf-8")
    model = tiny_model_dirs["bert"]
    assert main(extract_args(model, corpus, root / "single")) == 0
    reference, _ = load_records(root / "single" / "records-all.pt")
    return model, corpus, reference, root


def assert_same(records, reference) -> None:
    assert len(records) == len(reference)
    width = max(r.n_tokens for r in reference)  # no batch is padded wider
    for got, want in zip(records, reference, strict=True):
        assert got.text == want.text and got.tokens == want.tokens
        for index, (a, b) in enumerate(zip(got.layers, want.layers, strict=True)):
            # The workers run with OMP_NUM_THREADS=1 and this process may not: a different
            # thread count reorders float sums. Edge for edge except keys that reordering can
            # move across the threshold; values within its bound (tests/tolerances.py).
            terms = transformer_terms(layers=index, hidden=TINY_HIDDEN,
                                      intermediate=TINY_INTERMEDIATE, n=width)
            assert_layers_close(a, b, terms=terms + TINY_HIDDEN)


def test_plan_is_whole_batches_of_the_length_sorted_corpus_round_robin():
    chunks = plan_chunks([5, 1, 4, 2, 3], batch_size=2, chunk_batches=1, world_size=2)
    assert [c.texts for c in chunks] == [(1, 3), (4, 2), (0,)]
    assert [c.rank for c in chunks] == [0, 1, 0]


def test_two_ranks_match_one_process_and_resume_after_a_killed_worker(setup, capsys):
    model, corpus, reference, root = setup
    out = root / "dist"
    killer = root / "killer.py"
    killer.write_text(KILLER, encoding="utf-8")
    # 1. rank 1 is SIGKILLed half-way through writing its second chunk.
    killed = torchrun([str(killer), *extract_args(model, corpus, out)])
    assert killed.returncode != 0, killed.stdout + killed.stderr
    store = out / "records-all"
    assert read_manifest(store)["status"] == "running"
    partial = store / "chunk-00003.pt.partial"  # 6 chunks; rank 1 has 1, 3, 5
    assert partial.is_file() and partial.stat().st_size > 0
    assert not (store / "chunk-00003.pt").exists()
    with pytest.raises(ShardsError, match="incomplete"):
        ShardedRecords(store)
    kept = {p.name: p.stat().st_mtime_ns for p in store.glob("chunk-*.pt")}
    assert "chunk-00001.pt" in kept
    # 2. the same command again: complete chunks are kept, the rest is redone.
    rerun = torchrun(["-m", "sparsefinder", *extract_args(model, corpus, out)])
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    manifest = read_manifest(store)
    assert manifest["status"] == "complete" and manifest["world_size"] == 2
    assert manifest["chunks_written_this_run"] == 6 - len(kept)
    for name, mtime in kept.items():
        assert (store / name).stat().st_mtime_ns == mtime  # not rewritten
    assert not list(store.glob("*.partial"))
    indices = [i for c in manifest["chunks"] for i in c["texts"]]
    assert sorted(indices) == list(range(len(TEXTS)))  # nothing lost, nothing twice
    assert_same(ShardedRecords(store).load_all(), reference)
    # 3. a rank count or alpha that does not match the store is refused, clearly.
    # (one process is one rank: in-process, as `sparsefinder extract --sharded`, saves a
    # torchrun start)
    capsys.readouterr()
    assert main(extract_args(model, corpus, out, "--sharded")) != 0
    assert "written by a run with 2 ranks, this run has 1" in capsys.readouterr().err
    with pytest.raises(ShardsError, match="alpha=1.5, not 2.0"):
        ShardedRecords(store, expected_alpha=2.0)


def test_single_process_store_errors_and_checksums(setup, capsys, monkeypatch):
    model, corpus, reference, root = setup
    out = root / "one"
    assert main(extract_args(model, corpus, out, "--sharded")) == 0
    store = out / "records-all"
    assert_same(ShardedRecords(store).load_all(), reference)
    edges = sum(int(layer.gold.sum()) for r in reference for layer in r.layers)
    assert sum(c["gold_edges"] for c in read_manifest(store)["chunks"]) == edges
    # another alpha on the same folder
    assert main(extract_args(model, corpus, out, "--sharded", "--alpha", "2")) == 2
    assert "use a new --out folder for another model or alpha" in capsys.readouterr().err
    # a chunk altered on disk is refused on read and redone on rerun
    victim = store / "chunk-00002.pt"
    victim.write_bytes(victim.read_bytes()[:-10])
    with pytest.raises(ShardsError, match="does not match the checksum"):
        ShardedRecords(store).load_all()
    assert main(extract_args(model, corpus, out, "--sharded")) == 0
    assert read_manifest(store)["chunks_written_this_run"] == 1
    assert_same(ShardedRecords(store).load_all(), reference)


def test_full_disk_leaves_no_final_chunk_and_a_clear_error(setup, capsys, monkeypatch):
    model, corpus, reference, root = setup
    out = root / "full"
    calls = []
    real_open = open

    def full_disk_open(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        if str(path).endswith("chunk-00004.pt.partial"):
            calls.append(path)
            handle.write = lambda data: (_ for _ in ()).throw(OSError(28, "No space left"))
        return handle

    monkeypatch.setattr("builtins.open", full_disk_open)
    assert main(extract_args(model, corpus, out, "--sharded")) == 2
    err = capsys.readouterr().err
    assert calls and "free disk space and rerun" in err and "chunk-00004.pt" in err
    store = out / "records-all"
    assert not (store / "chunk-00004.pt").exists()
    assert json.loads((store / "manifest.json").read_text())["status"] == "running"
    monkeypatch.undo()
    assert main(extract_args(model, corpus, out, "--sharded")) == 0
    assert read_manifest(store)["chunks_written_this_run"] == 2  # chunks 4 and 5
    assert_same(ShardedRecords(store).load_all(), reference)
