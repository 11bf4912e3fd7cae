"""Where Sparsefinder keeps what it computes for a user: one root, shared by every cache.

``$SPARSEFINDER_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/sparsefinder``, else
``~/.cache/sparsefinder``. Each user of the cache takes a folder below the root (``atlas``,
``jit`` ...), so one variable moves (or isolates, in tests) all of them.
"""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir(*parts: str) -> Path:
    """The folder ``parts`` below the cache root (not created here)."""
    root = os.environ.get("SPARSEFINDER_CACHE_DIR")
    if root:
        base = Path(root)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg or Path.home() / ".cache") / "sparsefinder"
    return base.joinpath(*parts)
