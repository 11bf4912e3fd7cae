"""Where the Triton kernels' tests run: on a GPU, or on a CPU in Triton's interpreter
(``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` where there is no GPU)."""

from __future__ import annotations

import os

import pytest
import torch


def require_triton() -> None:
    """Skip the calling test module (call it at import) where its kernels cannot run."""
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and not in Triton's interpreter (tests/conftest.py sets it)",
                    allow_module_level=True)
    pytest.importorskip("triton", reason="triton is not installed (requirements-dev.txt)")


def device() -> str:
    """The kernels' device: the GPU where there is one, else the interpreter's CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"
