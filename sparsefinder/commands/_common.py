"""Arguments several subcommands share, so they are spelled the same everywhere."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

if TYPE_CHECKING:
    from sparsefinder.data.records import AttentionRecord


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="default",
        help="'default' (bundled all-MiniLM-L6-v2), a local folder, or a hub id",
    )
    parser.add_argument(
        "--alpha", type=float, default=None,
        help="entmax alpha (>= 1) of the entmax layers; default: the model's own (config "
             "initial_alpha/alpha), else 1.5. The family recipe still holds (ModernBERT's "
             "local layers keep softmax)")
    parser.add_argument(
        "--alpha-layers", type=_alpha_list, default=None, metavar="A0,A1,...",
        help="one alpha per layer (1 = softmax), e.g. 1,1.5,1,1.5; overrides --alpha and "
             "the recipe")
    parser.add_argument(
        "--device", default="auto", help="'auto' (CUDA if available), 'cpu', 'cuda'"
    )


def _alpha_list(text: str) -> tuple[float, ...]:
    from sparsefinder.models.recipes import AlphaError, parse_alpha_layers

    try:
        return parse_alpha_layers(text)
    except AlphaError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def load_from_args(args: argparse.Namespace, device: Any = None) -> Any:
    """``load_model`` with the model options of :func:`add_model_arguments`."""
    from sparsefinder.models.loading import load_model

    return load_model(args.model, alpha=args.alpha, device=device or args.device,
                      alpha_layers=getattr(args, "alpha_layers", None))


def add_corpus_arguments(parser: argparse.ArgumentParser, default_split: str) -> None:
    parser.add_argument(
        "--corpus",
        default="default",
        help="'default' (stdlib pydoc prose), a .txt/.jsonl file, or a folder of them",
    )
    parser.add_argument("--split", default=default_split, choices=["train", "validation", "all"])
    parser.add_argument("--max-passages", type=int, default=None, help="use at most N passages")


def add_fitting_arguments(parser: argparse.ArgumentParser) -> None:
    """What every ``fit-*`` command takes: the model, the corpus (TRAIN by default), the
    output file, a seed and the texts per forward pass :func:`fitting_records` uses."""
    add_model_arguments(parser)
    add_corpus_arguments(parser, default_split="train")
    parser.add_argument("--out", required=True, type=Path, help="output file (.pt)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=8, help="texts per forward pass")


def passages_label(max_passages: int | None) -> str:
    """``"all"`` or ``"the first N"``: how many passages a command read, for its log line."""
    return "all" if max_passages is None else f"the first {max_passages}"


@contextlib.contextmanager
def progress_bar(desc: str) -> Iterator[Callable[[float, str], None]]:
    """A tqdm bar driven by a library ``on_progress(fraction, message)`` callback."""
    bar = tqdm(total=1000, desc=desc, unit="‰", bar_format="{l_bar}{bar}| {postfix}")

    def update(fraction: float, message: str) -> None:
        bar.n = round(1000 * min(max(fraction, 0.0), 1.0))
        bar.set_postfix_str(message, refresh=False)
        bar.refresh()

    try:
        yield update
    finally:
        bar.close()


def fitting_records(args: argparse.Namespace) -> tuple[Any, list[AttentionRecord]]:
    """The model and gold-graph records a fitting command learns from: the corpus split
    (TRAIN by default; a note when it is validation), long passages chunked to the model's
    length, ``--max-passages`` honoured. Returns (loaded model, records)."""
    from sparsefinder.data.chunking import chunk_passages
    from sparsefinder.data.corpus import load_corpus
    from sparsefinder.data.records import extract
    if args.split == "validation":
        print("note: fitting on the validation split; evaluate on another split")
    loaded = load_from_args(args)
    passages = load_corpus(args.corpus, args.split)
    if args.max_passages is not None:
        passages = passages[: max(args.max_passages, 0)]
    if not passages:
        raise ValueError(f"the {args.split} split of corpus {args.corpus} has no passages")
    texts = chunk_passages(passages, loaded.tokenizer, loaded.max_length)
    print(f"model {loaded.model_id}; {len(passages)} passages of the {args.split} split "
          f"-> {len(texts)} texts")
    return loaded, extract(loaded, texts, batch_size=args.batch, progress=True)
