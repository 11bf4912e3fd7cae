"""How many candidates the block-keys selector's second stage re-ranks, chosen on TRAIN only.

Inputs: q/k of the default model, layers 1-4, over consecutive 512-token windows of the
default corpus' TRAIN split concatenated to n tokens (``restricted.real_qk(..., "train")``);
gold entmax-1.5 edges. The selector is the long-context default (block 32, the diagonal band,
448 single keys from pooled sub-blocks of 8 queries) with ``candidates`` C, C = 0 being the
pooled stage alone. For each n it reports, per layer, edge recall / exact rows and the
selection's seconds (one thread), and how many gold keys a query block needs outside its band
(mean and largest: the budget an oracle would need).

Rule, fixed before looking: for each n, the smallest C of the grid whose mean edge recall over
the four layers is at least 0.99 (the recall at which the long-context issue compares speed).

    PYTHONPATH=. .venv/bin/python tools/choose_candidates.py [--sizes 4096 8192]

About ten minutes on two cores. The validation split is never read.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

LAYERS = (1, 2, 3, 4)
GRID = (0, 640, 896, 1024, 1280, 1536, 2048)
BAR = 0.99


def gold_union(edges, block: int) -> tuple[float, int]:
    """(mean, largest) count of distinct gold keys per (head, query block) outside its
    diagonal block."""
    heads, n = edges.heads, edges.n
    counts = edges.row_counts().view(-1)
    rows = torch.repeat_interleave(torch.arange(heads * n), counts)
    head, query = rows // n, rows % n
    keys = edges.indices.long()
    off = (keys // block) != (query // block)
    nb = -(-n // block)
    used = torch.zeros(heads * nb, n, dtype=torch.bool)
    used[(head * nb + query // block)[off], keys[off]] = True
    per_block = used.sum(-1).float()
    return float(per_block.mean()), int(per_block.max())


def main() -> None:
    import restricted

    from sparsefinder.attention.gold_edges import entmax_edges
    from sparsefinder.predictors.block_keys import BlockKeySparsefinder

    made = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    made.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    made.add_argument("--grid", type=int, nargs="+", default=list(GRID))
    args = made.parse_args()
    torch.set_num_threads(1)
    print(f"load avg {os.getloadavg()[0]:.2f}; TRAIN split, one thread", flush=True)
    for n in args.sizes:
        quality: dict[int, list[tuple[float, float, float]]] = {}
        unions = []
        for layer in LAYERS:
            q, k, source = restricted.real_qk(layer, n, "train")
            with torch.inference_mode():
                edges, _ = entmax_edges(q, k, q.shape[-1] ** -0.5)
                unions.append(gold_union(edges, 32))
                for count in args.grid:
                    select = BlockKeySparsefinder(32, 448, sub_block=8, window_blocks=1,
                                                  candidates=count).select
                    start = time.perf_counter()
                    graph, extra = select(q, k)
                    seconds = time.perf_counter() - start
                    quality.setdefault(count, []).append(
                        (*restricted.score_selection(graph, extra, edges, 32), seconds))
            print(f"n={n} layer {layer} done ({source})", flush=True)
        print(f"\nn = {n}: gold keys a query block needs outside its band, mean / largest: "
              + ", ".join(f"layer {x} {m:.0f} / {b}" for x, (m, b) in zip(LAYERS, unions,
                                                                        strict=True)))
        print("| candidates | " + " | ".join(f"layer {x} recall / exact" for x in LAYERS)
              + " | mean recall | mean exact | select s (layer mean) |")
        print("|---" * (len(LAYERS) + 4) + "|")
        for count, rows in quality.items():
            cells = " | ".join(f"{r:.3f} / {e:.3f}" for r, e, _ in rows)
            recall = sum(r for r, _, _ in rows) / len(rows)
            exact = sum(e for _, e, _ in rows) / len(rows)
            seconds = sum(s for _, _, s in rows) / len(rows)
            print(f"| {count or 'off'} | {cells} | {recall:.4f} | {exact:.3f} | {seconds:.3f} |")
        met = [c for c, rows in quality.items() if sum(r for r, _, _ in rows) / len(rows) >= BAR]
        print(f"chosen at n={n} (smallest with mean recall >= {BAR}): "
              f"{min(met) if met else 'none of the grid'}", flush=True)
    print(f"load avg {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
