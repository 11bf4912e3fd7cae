"""Sweep every method (long-context baselines included) on a tiny long-context decoder.

A random tiny decoder of one family (default Qwen2: GQA 4 query / 2 key heads, RoPE, layer 1
a sliding-window layer of 64 tokens; ``sparsefinder.models.decoders``) is saved locally with a
4096-token limit. Gold graphs come from bounded-memory extraction
(``sparsefinder.data.long_context.extract_long``) on texts of ``--tokens`` tokens made of the
default corpus' TRAIN passages (projections, k-means centroids, HashAttention codes, static
masks and calibrated thresholds are all fitted on them) and VALIDATION passages (scored).
Prints recall at sparsity 0.75 / 0.90 / 0.95 of every curve's frontier (step rule) and the
gold sparsity; writes the sweep CSV to ``--out`` when given. The model is random, so the
numbers say how the methods compare on *this* model's gold graphs, not on a trained LLM.

    .venv/bin/python benchmarks/long_context_sweep.py --tokens 2048 --train-texts 4

``--smoke``: one train and one validation text of 256 tokens.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import parse, parser  # noqa: E402

from sparsefinder.data.long_context import extract_long, long_texts  # noqa: E402
from sparsefinder.evaluation.curves import resolve_methods
from sparsefinder.evaluation.frontier import recall_at_sparsity
from sparsefinder.evaluation.sweep import sweep  # noqa: E402
from sparsefinder.models.decoders import DECODER_FAMILIES, save_tiny_decoder  # noqa: E402
from sparsefinder.models.loading import load_model  # noqa: E402
from sparsefinder.projections.centroids import fit_centroids
from sparsefinder.projections.hinge import train_projections  # noqa: E402


def main() -> None:
    made = parser(__doc__.splitlines()[0])
    made.add_argument("--family", choices=DECODER_FAMILIES, default="qwen2")
    made.add_argument("--tokens", type=int, default=2048)
    made.add_argument("--train-texts", type=int, default=4)
    made.add_argument("--val-texts", type=int, default=2)
    made.add_argument("--methods", default="all")
    made.add_argument("--out", type=Path, default=None)
    args = parse(made, smoke={"tokens": 256, "train_texts": 1, "val_texts": 1})
    print(f"load average: {os.getloadavg()}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        save_tiny_decoder(args.family, Path(folder) / args.family, max_positions=4096,
                          head_dim=32)
        loaded = load_model(str(Path(folder) / args.family), device="cpu")
    print(loaded.describe(), "sliding layers:", loaded.sliding_window_layers)
    train = [extract_long(loaded, t)
             for t in long_texts(loaded.tokenizer, args.tokens, args.train_texts, "train")]
    val = [extract_long(loaded, t)
           for t in long_texts(loaded.tokenizer, args.tokens, args.val_texts, "validation")]
    print(f"gold: {len(train)} train / {len(val)} validation texts of {args.tokens} tokens "
          f"({time.perf_counter() - start:.0f} s)")
    projections = train_projections(train, rank=4, model_id=loaded.model_id, alpha=1.5)
    fit_centroids(projections, train, clusters=(2, 4, 6, 8, 10, 12, 16, 20), max_points=10_000,
                  n_init=3)
    print(f"projections + centroids fitted on train ({time.perf_counter() - start:.0f} s)")
    frames = []
    for name in resolve_methods(args.methods):  # one curve at a time: bounded peak memory
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. routed k-means: codebooks of another model
            try:
                frames.append(sweep(val, projections, name, train_records=train))
            except ValueError as error:
                print(f"skipped {name}: {str(error)[:120]}")
                continue
        print(f"  {name}: {len(frames[-1])} points ({time.perf_counter() - start:.0f} s, "
              f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MiB)",
              flush=True)
    frame = pd.concat(frames, ignore_index=True)
    frame.attrs.update(frames[0].attrs)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        frame.to_csv(args.out / "sweep.csv", index=False)
    table = recall_at_sparsity(frame)
    print(f"gold sparsity {frame.attrs['gold_sparsity']:.4f} (per layer "
          f"{[round(x, 4) for x in frame.attrs['gold_sparsity_per_layer']]})")
    print("| method | R@0.75 | R@0.90 | R@0.95 |\n|---|---|---|---|")
    for row in table.itertuples(index=False):
        values = [f"{v:.3f}" if v == v else "—" for v in row[1:]]
        print(f"| `{row[0]}` | " + " | ".join(values) + " |")
    print(f"points={len(frame)} curves={frame['method'].nunique()} n={args.tokens} "
          f"seconds={time.perf_counter() - start:.0f} load={os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
