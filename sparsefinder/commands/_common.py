"""Arguments several subcommands share, so they are spelled the same everywhere."""

from __future__ import annotations

import argparse


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="default",
        help="'default' (bundled all-MiniLM-L6-v2), a local folder, or a hub id",
    )
    parser.add_argument("--alpha", type=float, default=1.5, help="entmax alpha (>= 1; 1.5 default)")
    parser.add_argument(
        "--device", default="auto", help="'auto' (CUDA if available), 'cpu', 'cuda'"
    )


def add_corpus_arguments(parser: argparse.ArgumentParser, default_split: str) -> None:
    parser.add_argument(
        "--corpus",
        default="default",
        help="'default' (stdlib pydoc prose), a .txt/.jsonl file, or a folder of them",
    )
    parser.add_argument("--split", default=default_split, choices=["train", "validation", "all"])
    parser.add_argument("--max-passages", type=int, default=None, help="use at most N passages")
