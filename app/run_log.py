"""Optional timing of every script run of the app, for the load benchmark.

Off unless the environment variable ``SPARSEFINDER_RUN_LOG`` names a file. Then each full
script run and each fragment-only rerun appends one line
``<unix time> <kind> <wall s> <cpu s>`` to it, where cpu is the running thread's CPU time
(``time.thread_time``): wall ≫ cpu means the run waited (for the GIL held by other sessions'
runs, for the model lock), wall ≈ cpu that it worked. A fragment drawn inside a full run is
counted in that run only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "SPARSEFINDER_RUN_LOG"
_local = threading.local()  # one script thread per session: "inside a timed run" flag
_write = threading.Lock()


@contextmanager
def timed(kind: str) -> Iterator[None]:
    """Time the enclosed run when the log is on and no enclosing run is being timed."""
    path = os.environ.get(ENV)
    if not path or getattr(_local, "active", False):
        yield
        return
    _local.active = True
    start, cpu = time.perf_counter(), time.thread_time()
    try:
        yield
    finally:  # also on Streamlit's rerun/stop exceptions
        _local.active = False
        line = (f"{time.time():.3f} {kind} {time.perf_counter() - start:.4f} "
                f"{time.thread_time() - cpu:.4f}\n")
        with _write, open(path, "a", encoding="utf-8") as log:
            log.write(line)
