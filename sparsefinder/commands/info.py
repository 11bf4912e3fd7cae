"""`sparsefinder info`: what model would be used, with which shapes, α and device."""

from __future__ import annotations

import argparse

from sparsefinder.commands._common import add_model_arguments
from sparsefinder.models.loading import load_model


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "info", help="print model, layers, heads, head dim, alpha, device"
    )
    add_model_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    loaded = load_model(args.model, alpha=args.alpha, device=args.device)
    for key, value in loaded.describe().items():
        print(f"{key:>10}: {value}")
    return 0
