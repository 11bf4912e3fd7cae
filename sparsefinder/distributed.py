"""torch.distributed plumbing for corpus-scale runs: detect torchrun, join its group, reduce.

Why torchrun and nothing home-made: ``torchrun --nproc_per_node=N`` (``--nnodes``,
``--rdzv_endpoint`` for several machines) already starts the workers, sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` and tears the group down
when one worker dies. We only read that environment. Backend: NCCL when this process drives
a GPU (one process per GPU, ``cuda:LOCAL_RANK``), gloo on CPU.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

#: Collectives wait this long for a slow rank (a rank with longer texts finishes later).
TIMEOUT = datetime.timedelta(minutes=float(os.environ.get("SPARSEFINDER_DIST_TIMEOUT_MIN",
                                                          "360")))


@dataclass(frozen=True)
class World:
    """Where this process stands: its rank, the number of ranks, its local GPU index."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    """True when torchrun (or any launcher using its env contract) started this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def current_world() -> World:
    """The initialised group's rank/size, else a world of one."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(),
                     int(os.environ.get("LOCAL_RANK", "0")))
    return World()


def device_for(requested: str, world: World) -> str:
    """One process per GPU: ``cuda:LOCAL_RANK`` when CUDA is asked for (or auto and present)."""
    wants_cuda = requested.startswith("cuda") or (requested == "auto" and torch.cuda.is_available())
    if wants_cuda and world.size > 1:
        return f"cuda:{world.local_rank}"
    return requested


def backend_for(device: str) -> str:
    """``nccl`` when this process drives a GPU (``cuda``/``auto`` with CUDA present), else
    ``gloo``. NCCL reduces in GPU memory over NVLink/InfiniBand; gloo works on any CPU."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device} was asked for but CUDA is not available here; "
                         "use --device cpu (gloo) or run on a machine with GPUs")
    gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return "nccl" if gpu else "gloo"


@contextlib.contextmanager
def torchrun_group(device: str = "auto") -> Iterator[World]:
    """Join torchrun's process group for the block (no-op world of one without torchrun)."""
    if not launched_by_torchrun() or (dist.is_initialized()):
        yield current_world()
        return
    backend = backend_for(device)
    if backend == "nccl":  # one process per GPU: rank-local collectives on cuda:LOCAL_RANK
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend, timeout=TIMEOUT)
    try:
        yield current_world()
    finally:
        dist.destroy_process_group()


def _collective_device() -> torch.device:
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce across ranks (sum/max/min) and return a CPU tensor; identity without a group."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tensor
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    work = tensor.detach().to(_collective_device()).clone()
    dist.all_reduce(work, op=ops[op])
    return work.to(tensor.device)


def broadcast_object(obj: object, src: int = 0) -> object:
    """Rank ``src``'s ``obj`` on every rank (e.g. a validation error, so all ranks stop)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, device=_collective_device())
    return box[0]


def gather_objects(obj: object) -> list[object]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
