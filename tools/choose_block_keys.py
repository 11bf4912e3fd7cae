"""How the long-context selector of ``benchmarks/restricted.py`` was chosen, on TRAIN only.

Inputs: q/k of the default model, layers 1-4, over consecutive 512-token windows of the
default corpus' TRAIN split concatenated to n = 4096 (``restricted.real_qk(..., "train")``).
Each candidate selection is scored against the gold entmax-1.5 edges (edge recall, exact
rows), and timed — prediction + block-sparse attention, one thread — against SDPA softmax
in the same process on layer 2 (``vs_sdpa`` = SDPA seconds / ours; rough on a busy machine).

Candidates: today's selector (learned key blocks + single keys by the rank-4 token
projections, :class:`~sparsefinder.predictors.block.LearnedBlockSparsefinder` +
:class:`~sparsefinder.predictors.block.BlockSparsefinder`); single keys scored by the model's
own q·k on pooled query sub-blocks
(:class:`~sparsefinder.predictors.block_keys.BlockKeySparsefinder`) for several sub-block
sizes, budgets and block sizes; and that selector with G global keys (the keys with the
highest log-sum-exp of pooled scores over all query blocks, added to every query block) in
place of G of its single keys.

Rule, fixed before looking: among candidates with rough ``vs_sdpa`` ≥ 6 (a margin over the
5× bar for timing noise), the highest mean exact rows over the four layers.

    PYTHONPATH=. .venv/bin/python tools/choose_block_keys.py

A few minutes on two cores. The validation split is never read.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

N = 4096
LAYERS = (1, 2, 3, 4)
TIMED_LAYER = 2


def _global(base, n_global: int):
    """``base`` with ``n_global`` of its single keys swapped for global keys."""
    from sparsefinder.predictors.block import pool_blocks

    def select(q, k):
        graph, extra = base(q, k)
        pooled = torch.bmm(pool_blocks(q, 32), k.transpose(1, 2)).logsumexp(1)  # (heads, m)
        glob = pooled.topk(n_global, -1).indices
        shared = glob[:, None].expand(-1, graph.shape[1], -1)
        return graph, torch.cat([extra[..., : extra.shape[-1] - n_global], shared], -1)

    return select


def candidates(layer: int) -> dict[str, tuple[int, object]]:
    """name → (block, (q, k) → (graph, extra keys))."""
    import restricted

    from sparsefinder.predictors.block_keys import BlockKeySparsefinder

    today = argparse.Namespace(block=32, n_blocks=4, n_keys=256, selector="learned",
                               device="cpu")
    out = {"today: 4 learned blocks + 256 projected keys, band 3": (
        32, restricted._selector(today, layer))}
    for block, sub, keys in ((32, 32, 448), (32, 16, 448), (32, 8, 256), (32, 8, 320),
                             (32, 8, 384), (32, 8, 448), (32, 4, 448), (16, 8, 448)):
        predictor = BlockKeySparsefinder(block, keys, sub_block=sub, window_blocks=1)
        out[f"block {block}, sub-block {sub}, {keys} keys, band 1"] = (block, predictor.select)
    base = BlockKeySparsefinder(32, 448, sub_block=8, window_blocks=1).select
    out["block 32, sub-block 8, 384 keys + 64 global, band 1"] = (32, _global(base, 64))
    return out


def _seconds(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    import os

    import restricted
    import torch.nn.functional as F

    from sparsefinder.attention.block_sparse import block_sparse_entmax
    from sparsefinder.attention.gold_edges import entmax_edges
    from sparsefinder.runtime import tune_cpu_allocator

    tune_cpu_allocator()
    torch.set_num_threads(1)
    print(f"load avg {os.getloadavg()[0]:.2f}; n = {N}, TRAIN split, one thread", flush=True)
    quality: dict[str, list[tuple[float, float]]] = {}
    ratio: dict[str, float] = {}
    for layer in LAYERS:
        q, k, source = restricted.real_qk(layer, N, "train")
        with torch.inference_mode():
            edges, _ = entmax_edges(q, k, q.shape[-1] ** -0.5)
            chosen = candidates(layer)
            for name, (block, select) in chosen.items():
                graph, extra = select(q, k)
                quality.setdefault(name, []).append(
                    restricted.score_selection(graph, extra, edges, block))
            if layer == TIMED_LAYER:
                v = torch.randn(q.shape, generator=torch.Generator().manual_seed(0))
                for name, (block, select) in chosen.items():
                    def ours(select=select, block=block, q=q, k=k, v=v):
                        graph, extra = select(q, k)
                        return block_sparse_entmax(q, k, v, graph, block, extra_keys=extra)

                    ours()  # warm-up
                    sdpa = _seconds(partial(F.scaled_dot_product_attention, q, k, v))
                    ratio[name] = sdpa / _seconds(ours)
        print(f"layer {layer} done ({source})", flush=True)
    print(f"load avg {os.getloadavg()[0]:.2f}")
    print("| selector | " + " | ".join(f"layer {x} recall / exact" for x in LAYERS)
          + " | mean exact | vs_sdpa (layer 2, rough) |")
    print("|---" * (len(LAYERS) + 3) + "|")
    for name, rows in quality.items():
        cells = " | ".join(f"{r:.3f} / {e:.3f}" for r, e in rows)
        mean = sum(e for _, e in rows) / len(rows)
        print(f"| {name} | {cells} | {mean:.3f} | {ratio[name]:.1f} |")
    eligible = [n for n in quality if ratio[n] >= 6]
    if eligible:
        best = max(eligible, key=lambda n: sum(e for _, e in quality[n]))
        print(f"chosen (vs_sdpa >= 6, best mean exact rows): {best}")


if __name__ == "__main__":
    main()
