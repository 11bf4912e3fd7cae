"""Backend choice (gloo on CPU, NCCL on GPUs) and the NCCL path itself (tests marked cuda).

Without a GPU only the choice is tested; the ``cuda`` tests skip (conftest) and run where
CUDA is visible: torchrun with one process per GPU (at most 2), ``--device cuda``, NCCL.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest
import torch
from tolerances import assert_layers_close, tol_for, training_tol, transformer_terms

from sparsefinder import distributed
from sparsefinder.cli import main
from sparsefinder.data.records_io import load_records
from sparsefinder.data.shards import ShardedRecords, read_manifest
from sparsefinder.projections.heads import HeadProjections

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

_spec = importlib.util.spec_from_file_location(
    "distributed_worker", Path(__file__).with_name("distributed_worker.py"))
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)
TEXTS, extract_args, torchrun = helpers.TEXTS, helpers.extract_args, helpers.torchrun


@pytest.mark.parametrize(("device", "cuda", "backend"), [
    ("cpu", False, "gloo"), ("cpu", True, "gloo"), ("auto", False, "gloo"),
    ("auto", True, "nccl"), ("cuda", True, "nccl"), ("cuda:1", True, "nccl"),
])
def test_backend_is_nccl_exactly_when_this_process_drives_a_gpu(monkeypatch, device, cuda,
                                                                  backend):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert distributed.backend_for(device) == backend


def test_cuda_without_a_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available here; use --device cpu"):
        distributed.backend_for("cuda")


def test_one_process_per_gpu():
    two = distributed.World(rank=1, size=2, local_rank=1)
    assert distributed.device_for("cuda", two) == "cuda:1"
    assert distributed.device_for("cpu", two) == "cpu"


@pytest.mark.cuda
def test_nccl_ranks_extract_train_and_sweep_like_gloo(tiny_model_dirs, tmp_path):
    """One process per GPU (≤ 2) on NCCL: the store holds the CPU run's gold graphs, and
    training/sweeping over it (collectives on NCCL) gives the CPU/gloo numbers."""
    gpus = min(2, torch.cuda.device_count())
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(TEXTS) + "\n", encoding="utf-8")
    model = tiny_model_dirs["bert"]
    assert main(extract_args(model, corpus, tmp_path / "cpu")) == 0
    reference, _ = load_records(tmp_path / "cpu" / "records-all.pt")
    args = [a if a != "cpu" else "cuda" for a in extract_args(model, corpus, tmp_path / "gpu")]
    run = torchrun(["-m", "sparsefinder", *args], nproc=gpus, gpus=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    store = tmp_path / "gpu" / "records-all"
    assert read_manifest(store)["world_size"] == gpus
    records = ShardedRecords(store).load_all()
    width = max(r.n_tokens for r in reference)  # no batch is padded wider
    for got, want in zip(records, reference, strict=True):
        assert got.tokens == want.tokens
        for index, (a, b) in enumerate(zip(got.layers, want.layers, strict=True)):
            # the GPU's float32 sums round differently (no TF32: torch's default for matmul):
            # edge for edge except keys that rounding, through the layers before, can move
            # across the threshold (tests/tolerances.py)
            terms = transformer_terms(layers=index, hidden=32, intermediate=64, n=width)
            assert_layers_close(a, b, terms=terms + 32)  # the tiny BERT: hidden 32, FFN 64
    outputs = {}
    for device, on_gpu in (("cuda", True), ("cpu", False)):  # same ranks, NCCL vs gloo
        out = tmp_path / f"model-{device}"
        common = ["--device", device]
        trained = torchrun(["-m", "sparsefinder", "train", "--records", str(store), "--out",
                            str(out), "--batch-size", "64", "--seed", "3", "--clusters", "2",
                            "--kmeans-n-init", "1", *common], nproc=gpus, gpus=on_gpu,
                           timeout=600)
        assert trained.returncode == 0, trained.stdout + trained.stderr
        swept = torchrun(["-m", "sparsefinder", "sweep", "--records", str(store),
                          "--projections", str(out / "projections.pt"), "--out",
                          str(out / "sweep"), "--methods", "distance,window", *common],
                         nproc=gpus, gpus=on_gpu, timeout=600)
        assert swept.returncode == 0, swept.stdout + swept.stderr
        outputs[device] = (HeadProjections.load(out / "projections.pt"),
                           pd.read_csv(out / "sweep" / "points.csv"))
    # Same shards, same sums (training and scoring run on CPU tensors; only the collectives
    # move): the same projections and points on either backend.
    (gpu_model, gpu_points), (cpu_model, cpu_points) = outputs["cuda"], outputs["cpu"]
    weight_err = training_tol(cpu_model.metadata, world=gpus)
    torch.testing.assert_close(gpu_model.weight, cpu_model.weight, rtol=0, atol=weight_err)
    torch.testing.assert_close(gpu_model.centroids[2], cpu_model.centroids[2],  # ≤ 40 points
                               **tol_for(cpu_model.centroids[2], terms=40))
    assert gpu_points["recall"].tolist() == pytest.approx(cpu_points["recall"].tolist(),
                                                          abs=1e-9)
