"""What every benchmark shares: the ``--smoke`` flag and a clean skip of GPU-only parts.

``--smoke`` runs a script end to end on tiny sizes in seconds, so the test suite
(``tests/benchmarks/``) can run every benchmark and a script that no longer runs fails a test
instead of rotting unseen. Its numbers mean nothing; its last line is still ``key=value``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

SMOKE_HELP = ("tiny sizes, a few seconds: checks the script runs end to end (its numbers "
              "mean nothing; the last line is still key=value)")


def parser(description: str | None) -> argparse.ArgumentParser:
    """An argument parser with ``--smoke``."""
    made = argparse.ArgumentParser(description=description)
    made.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    return made


def parse(made: argparse.ArgumentParser, smoke: dict[str, Any] | None = None,
          argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The arguments; under ``--smoke`` the values in ``smoke`` replace the defaults (an
    option given on the command line still wins), and a line says the run is a smoke run."""
    known, _ = made.parse_known_args(argv)
    if known.smoke and smoke:
        made.set_defaults(**smoke)
    args = made.parse_args(argv)
    if args.smoke:
        print("smoke run: tiny sizes, the numbers below mean nothing", flush=True)
    return args


def cuda_missing(device: str) -> str | None:
    """Why ``device`` cannot run here (a CUDA device on a machine without one), else None."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        return f"--device {device} needs a CUDA GPU and none is visible here"
    return None


def skip(reason: str, **fields: object) -> None:
    """Say why a GPU-only run did not happen, and end with a ``key=value`` line that says so."""
    print(f"skipped: {reason}")
    print(" ".join(f"{key}={value}" for key, value in {"skipped": 1, **fields}.items()))
