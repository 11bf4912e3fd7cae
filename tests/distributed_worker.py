"""A torchrun worker for tests/test_distributed.py: train and sweep over a shard store.

Usage: torchrun --nproc_per_node=2 tests/distributed_worker.py STORE OUT_DIR
Each rank reads its chunks (chunk c belongs to rank c mod world), trains data-parallel and
sweeps; it writes OUT_DIR/rank<r>.pt with what it computed.
"""

import sys

import torch

from sparsefinder import distributed
from sparsefinder.distributed_sweep import sweep_streaming
from sparsefinder.distributed_train import train_projections_sharded
from sparsefinder.shards import ShardedRecords

METHODS = "distance,quantization,window,longformer"


def main(store: str, out: str) -> None:
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


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
