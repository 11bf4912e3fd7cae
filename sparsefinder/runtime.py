"""Process-wide settings that only entry points may choose (the CLI, the app, benchmarks).

Importing the library changes nothing outside it; these functions are the opt-ins.
"""

from __future__ import annotations

import ctypes
import os
import sys


def tune_cpu_allocator() -> bool:
    """Keep freed tensor memory in the process instead of handing it back to the kernel.

    Why: attention materialises several (heads, n, n) tensors per layer (12.6 MB each at
    n=512 for MiniLM). glibc serves blocks that size with ``mmap`` or trims them off the
    heap when freed, so every layer maps fresh pages again, and a first touch costs ~3.5 µs
    per 4 KiB page here: up to ~100 ms of page faults per forward pass — more than all of
    entmax, and 0 for fused ``sdpa``, which never materialises the scores. Raising the mmap
    threshold to its maximum (32 MiB) and the trim threshold to 1 GiB makes the heap keep
    and reuse those blocks: the same fix as running on jemalloc/tcmalloc, which PyTorch's
    CPU tuning guide recommends. Eager softmax attention gains from it as much as entmax.

    Process-wide, so the library never does it on import: the entry points (the CLI, the app,
    the benchmarks) call it. Linux/glibc only; skipped when the user configured malloc
    (``MALLOC_*`` or ``GLIBC_TUNABLES`` in the environment) or set
    ``SPARSEFINDER_MALLOC_TUNING=0``. Idempotent. Returns whether it is applied.
    """
    if os.environ.get("SPARSEFINDER_MALLOC_TUNING", "1").lower() in {"0", "false", "no", ""}:
        return False
    if not sys.platform.startswith("linux") or "GLIBC_TUNABLES" in os.environ:
        return False
    if any(key.startswith("MALLOC_") for key in os.environ):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # from <malloc.h>
        return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(
            libc.mallopt(m_trim_threshold, 1 << 30)
        )
    except (OSError, AttributeError):  # not glibc
        return False


def quiet_hub_progress_bars() -> None:
    """Hide transformers' own download/loading bars (the CLI and app draw their own)."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def set_torch_threads(threads: int | None = None) -> int:
    """Set torch's intra-op threads once for the whole process; returns the number set.

    The app calls this at start-up instead of switching threads per request: a Streamlit
    server runs sessions on threads of one process, so a per-request change would race with
    other sessions. One intra-op thread per request is the app's default
    (``SPARSEFINDER_TORCH_THREADS`` overrides it): a slider move is many small tensor ops, where
    a second thread mostly waits on the first on a busy CPU, and other sessions use the other
    core.
    """
    import torch

    if threads is None:
        threads = int(os.environ.get("SPARSEFINDER_TORCH_THREADS", "1") or 1)
    threads = max(1, int(threads))
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
