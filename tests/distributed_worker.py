"""Torchrun helpers for the distributed tests, and a worker: train and sweep over shards.

Usage: torchrun --nproc_per_node=2 tests/distributed_worker.py STORE OUT_DIR [--commands]
       torchrun --nproc_per_node=2 tests/distributed_worker.py --cli RUNS.json
Each rank reads its chunks (chunk c belongs to rank c mod world), trains data-parallel and
sweeps; it writes OUT_DIR/rank<r>.pt with what it computed. With ``--commands`` the same ranks
then run ``sparsefinder train --records`` and ``sparsefinder sweep --records`` (the CLI joins
the group already open), writing OUT_DIR/model and OUT_DIR/sweep: one torchrun start instead
of three, each start being seconds of imports on every rank. ``--cli RUNS.json`` runs a list
of CLI argument lists one after the other on the same ranks.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from sparsefinder import distributed
from sparsefinder.cli import main as cli
from sparsefinder.data.shards import ShardedRecords
from sparsefinder.evaluation.sharded_sweep import sweep_streaming
from sparsefinder.projections.data_parallel import train_projections_sharded

METHODS = "distance,quantization,window,longformer"

REPO = Path(__file__).resolve().parents[1]
TEXTS = [
    "The cat sat.", "A dog ran across the wide green park today.", "Rain again.",
    "She called him back after the long meeting ended.", "Numbers: one, two, three, four.",
    "It works.", "Attention graphs are sparse under entmax.", "Short one here.",
    "The doctor said she would call the patient back tomorrow morning.", "Why not?",
    "Trains leave at noon.", "Every head attends to a few keys only.",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(script: list[str], nproc: int = 2, timeout: int = 180, gpus: bool = False
             ) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=N`` on 127.0.0.1 with a free port (CPU and gloo, unless
    ``gpus``: then the GPUs stay visible and ``--device cuda`` runs go through NCCL)."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if not gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}", *script]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)


def extract_args(model: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    return ["extract", "--model", str(model), "--corpus", str(corpus), "--split", "all",
            "--out", str(out), "--batch-size", "2", "--chunk-batches", "1", "--device", "cpu",
            *extra]


#: The CLI runs of ``--commands`` (the tests compare them with one process).
TRAIN_ARGS = ["--batch-size", "64", "--seed", "3", "--clusters", "2,3", "--kmeans-n-init", "1",
              "--kmeans-max-points", "40"]
COMMAND_METHODS = "distance,kmeans,window"


def commands(store: str, out: str) -> None:
    """``train --records`` then ``sweep --records`` on the ranks' shared group."""
    code = cli(["train", "--records", store, "--out", f"{out}/model", *TRAIN_ARGS])
    distributed.barrier()  # rank 0 writes the file the sweep reads (a new launch would wait)
    if code == 0:
        code = cli(["sweep", "--records", store, "--projections", f"{out}/model/projections.pt",
                    "--out", f"{out}/sweep", "--methods", COMMAND_METHODS])
    if code:
        raise SystemExit(code)


def main(store: str, out: str, with_commands: bool = False) -> None:
    with distributed.torchrun_group("cpu") as world:
        records = ShardedRecords(store)
        shard = list(records.iter_records(world.rank, world.size))
        projections = train_projections_sharded([shard], batch_size=64, seed=3)
        frame = sweep_streaming(records.iter_records(world.rank, world.size), projections,
                                shard[0].num_layers, METHODS)
        torch.save({"weight": projections.weight, "bias": projections.bias,
                    "loss_last": projections.metadata["loss_last"],
                    "recall": frame["recall"].tolist(), "sparsity": frame["sparsity"].tolist(),
                    "gold": frame.attrs["gold_sparsity"], "n_texts": frame["n_texts"].tolist(),
                    "world": world.size},
                   f"{out}/rank{world.rank}.pt")
        if with_commands:
            commands(store, out)


def cli_runs(path: str) -> None:
    """Each CLI run of the JSON list in turn, on one group; stop at the first failure."""
    with distributed.torchrun_group("cpu"):
        for args in json.loads(Path(path).read_text()):
            code = cli(args)
            distributed.barrier()  # what rank 0 wrote is there for the next run
            if code:
                raise SystemExit(code)


def torchrun_cli(runs: list[list[str]], folder: Path) -> subprocess.CompletedProcess:
    """One torchrun start (2 ranks) for several CLI runs (see ``--cli``)."""
    path = folder / "cli_runs.json"
    path.write_text(json.dumps(runs))
    return torchrun([__file__, "--cli", str(path)])


if __name__ == "__main__":
    if sys.argv[1] == "--cli":
        cli_runs(sys.argv[2])
    else:
        main(sys.argv[1], sys.argv[2], "--commands" in sys.argv[3:])
