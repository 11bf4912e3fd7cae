"""Generated numba kernels, imported from a file so that numba's on-disk cache keeps them.

Why: numba caches a compiled function next to the file that defines it, keyed by that file
and by the CPU. A function made by ``exec`` or defined inside another function has no such
file, so every process compiled it again: five seconds of the app's first graph went to the
distance pass's compiler. Here generated source is written once to the user cache
(:func:`~sparsefinder.user_cache.user_cache_dir`, folder ``jit``), named by its hash, and
imported from there; its ``cache=True`` functions then compile once per machine. Where the
cache cannot be written, a temporary folder is used and the kernels compile once per process.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from functools import cache
from pathlib import Path
from types import ModuleType

from sparsefinder.files import atomic_write
from sparsefinder.user_cache import user_cache_dir


def _folder() -> Path:
    """The user cache's ``jit`` folder, or a temporary one where it cannot be written."""
    folder = user_cache_dir("jit")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="sparsefinder-jit-"))


@cache
def generated_module(name: str, source: str) -> ModuleType:
    """Import ``source`` as module ``name`` from ``<cache>/jit/<name>_<hash>.py`` (written once;
    the same source in any process imports the same file, so numba finds its cache)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = _folder() / f"{name}_{digest}.py"
    if not path.exists() or path.read_text() != source:
        atomic_write(path, lambda handle: handle.write(source.encode()))
    spec = importlib.util.spec_from_file_location(f"_sparsefinder_jit_{name}_{digest}", path)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py path always has one
        raise ImportError(f"cannot import the generated kernels at {path}")
    module = importlib.util.module_from_spec(spec)
    # numba's cache rebuilds a kernel's environment by importing its module by name
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[spec.name]
        raise
    return module
