"""`sparsefinder adapt`: fine-tune a model to α-entmax attention (LoRA, distilled from its
own softmax self) and write the adapter file (see :mod:`sparsefinder.adaptation.distill`).

Trains on the TRAIN split of the default corpus plus every ``--corpus`` given; measures pooled
cosine and gold sparsity on the VALIDATION split of the default corpus before and after.
Resumable: ``--resume`` continues from ``OUT/adapt-checkpoint.pt``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from tqdm.auto import tqdm

from sparsefinder.adaptation.distill import adapt_model
from sparsefinder.adaptation.objective import AdaptConfig
from sparsefinder.commands._adapt_eval import eval_sets, evaluate, report
from sparsefinder.data.corpus import default_corpus, load_corpus
from sparsefinder.models.loading import DEFAULT_MODEL, SOFTMAX_MODEL, load_model

_DEFAULTS = AdaptConfig()


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "adapt", help="fine-tune a model to entmax attention (LoRA distillation from softmax)")
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="'default' (the bundled MiniLM's own weights), a local folder or "
                             "a hub id of a BERT-style encoder")
    parser.add_argument("--alpha", type=float, default=_DEFAULTS.alpha, help="entmax alpha")
    parser.add_argument("--device", default="auto", help="'auto' (CUDA if available), 'cpu'")
    parser.add_argument("--corpus", action="append", default=[], metavar="PATH",
                        help="extra training corpus (.txt/.jsonl/folder; its train split), "
                             "repeatable; the default corpus's train split is always used")
    parser.add_argument("--max-passages", type=int, default=None,
                        help="use at most N training passages (quick runs)")
    parser.add_argument("--holdout-every", type=int, default=10,
                        help="hold every Nth training passage out of training and measure on "
                             "it, to compare settings without touching validation (0: none)")
    parser.add_argument("--measure-every", type=int, default=0,
                        help="also measure the held-out passages every N steps (the curve)")
    parser.add_argument("--eval-passages", type=int, default=None,
                        help="measure on at most N validation passages")
    parser.add_argument("--eval-corpus", action="append", default=[], metavar="PATH",
                        help="also measure on this text after training (all its passages; "
                             "'narrative': the bundled story/news hold-out), repeatable")
    parser.add_argument("--evaluate", action="store_true",
                        help="only measure: the adapter (--adapter, else the bundled one) on "
                             "the validation split and every --eval-corpus; no training")
    parser.add_argument("--no-validation", action="store_true",
                        help="with --evaluate: skip the validation split (compare settings on "
                             "held-out train passages only)")
    parser.add_argument("--adapter", type=Path, default=None,
                        help="with --evaluate: the adapter file to measure")
    parser.add_argument("--out", type=Path, help="folder for the adapter file")
    parser.add_argument("--filename", default="entmax_adapter.safetensors")
    parser.add_argument("--resume", action="store_true",
                        help="continue from OUT/adapt-checkpoint.pt (same options)")
    parser.add_argument("--steps", type=int, default=_DEFAULTS.steps)
    parser.add_argument("--batch-size", type=int, default=_DEFAULTS.batch_size)
    parser.add_argument("--lr", type=float, default=_DEFAULTS.lr)
    parser.add_argument("--rank", type=int, default=_DEFAULTS.rank, help="LoRA rank")
    parser.add_argument("--targets", default=",".join(_DEFAULTS.targets),
                        help="LoRA target groups: attention, ffn (comma-separated)")
    parser.add_argument("--max-tokens", type=int, default=_DEFAULTS.max_tokens,
                        help="training chunk length in tokens")
    parser.add_argument("--w-layers", type=float, default=_DEFAULTS.w_layers,
                        help="weight of per-layer hidden-state matching")
    parser.add_argument("--w-sparse", type=float, default=_DEFAULTS.w_sparse,
                        help="weight of the penalty on attention entropy above its start")
    parser.add_argument("--seed", type=int, default=_DEFAULTS.seed)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (torch)")
    return parser


def run(args: argparse.Namespace) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.evaluate:
        return _evaluate_only(args)
    if args.out is None:
        print("sparsefinder adapt: give --out FOLDER for the adapter (or --evaluate to only "
              "measure one)", file=sys.stderr)
        return 2
    config = AdaptConfig(
        alpha=args.alpha, rank=args.rank, targets=tuple(t.strip() for t in args.targets.split(",")
                                                        if t.strip()),
        steps=args.steps, batch_size=args.batch_size, lr=args.lr, max_tokens=args.max_tokens,
        w_layers=args.w_layers, w_sparse=args.w_sparse, seed=args.seed)
    name = SOFTMAX_MODEL if args.model == DEFAULT_MODEL else args.model
    base = load_model(name, alpha=args.alpha, device=args.device)
    train = default_corpus("train")
    labels = ["default corpus (pydoc topics), train split"]
    for corpus in args.corpus:
        train += load_corpus(corpus, "train")
        labels.append(f"{corpus}, train split")
    if args.max_passages is not None:
        train = train[: args.max_passages]
    held_out: list[str] = []
    if args.holdout_every > 0:
        held_out = train[:: args.holdout_every]
        train = [p for i, p in enumerate(train) if i % args.holdout_every]
        labels.append(f"every {args.holdout_every}th passage held out (not trained on) to "
                      "compare settings")
    evaluation = default_corpus("validation")[: args.eval_passages]
    print(f"adapting {base.model_id} to {args.alpha}-entmax on {len(train)} passages "
          f"({'; '.join(labels)}), {config.steps} steps on {base.device}", file=sys.stderr)
    bar = tqdm(total=config.steps, desc="adapt", unit="step")

    def on_step(step: int, parts: dict[str, float]) -> None:
        if "held_out_cos" in parts:
            bar.write(f"step {step}: held-out pooled cosine {parts['held_out_cos']:.4f}, "
                      f"gold sparsity {parts['held_out_sparsity']:.4f}")
            return
        bar.n = step
        bar.set_postfix({k: f"{v:.4f}" for k, v in parts.items()}, refresh=False)
        bar.refresh()

    command = "sparsefinder " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["adapt"] else ""
    try:
        result = adapt_model(base, train, evaluation, config, args.out, base_name=base.model_id,
                             data_label="; ".join(labels), command=command, resume=args.resume,
                             filename=args.filename, choose_texts=held_out,
                             measure_every=args.measure_every, on_step=on_step)
    finally:
        bar.close()
    for label, fid in (("before", result.before), ("after", result.after)):
        print(f"{label}: pooled cosine mean {fid.mean_cosine:.4f} min {fid.min_cosine:.4f}, "
              f"gold sparsity {fid.sparsity:.4f} per layer "
              + " ".join(f"{float(s):.3f}" for s in fid.layer_sparsity))
    if result.metadata.get("held_out_train"):
        print(f"held-out train passages: {result.metadata['held_out_train']}")
    if args.eval_corpus:
        results = evaluate(args.model, result.path, eval_sets(args.eval_corpus, validation=False),
                           alpha=args.alpha, device=args.device)
        report(results)
    size = result.path.stat().st_size
    print(f"wrote {result.path} ({size / 1e6:.2f} MB) after {result.state.seconds:.0f} s "
          "of training")
    return 0


def _evaluate_only(args: argparse.Namespace) -> int:
    sets = eval_sets(args.eval_corpus, args.eval_passages, validation=not args.no_validation)
    if not sets:
        print("sparsefinder adapt --evaluate: nothing to measure (give --eval-corpus)",
              file=sys.stderr)
        return 2
    which = args.adapter or ("the bundled adapter" if args.model == DEFAULT_MODEL else "none")
    print(f"measuring {args.model} (adapter: {which}) against its softmax self", file=sys.stderr)
    report(evaluate(args.model, args.adapter, sets, alpha=args.alpha, device=args.device))
    return 0
