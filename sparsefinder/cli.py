"""`sparsefinder …` — a thin shell over the library.

Each subcommand lives in its own module under :mod:`sparsefinder.commands` and exposes
``add_parser(subparsers)`` and ``run(args) -> int``; this file only discovers and dispatches,
so adding a command never touches the others.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

import sparsefinder.commands as commands_package
from sparsefinder import runtime


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparsefinder",
        description="Predict and explore the sparsity of alpha-entmax attention.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_info in sorted(
        pkgutil.iter_modules(commands_package.__path__), key=lambda m: m.name
    ):
        if module_info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands_package.__name__}.{module_info.name}")
        sub = module.add_parser(subparsers)
        sub.set_defaults(handler=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; library errors become one-line messages, not tracebacks."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    runtime.tune_cpu_allocator()  # an entry point may opt in to process-wide settings
    runtime.quiet_hub_progress_bars()
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (ValueError, FileNotFoundError, OSError) as error:
        print(f"sparsefinder {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
