"""Times the hot path of a slider move: predict every head of every layer, then score it.

6 layers × 12 heads at n=512, r=4 (seeded random data): Union(KMeans(B=8, top_k=2), Window(3))
plus recall and sparsity. Prints per-component medians and, last, ``ms=<median total>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparsefinder.metrics import recall, sparsity  # noqa: E402
from sparsefinder.predictors import Distance, KMeans, Quantization, Union, Window  # noqa: E402

LAYERS, HEADS, N, R, B, TOP_K = 6, 12, 512, 4, 8, 2
REPEATS, WARMUP = 30, 3


def timings_ms(fn: Callable[[], object], repeats: int = REPEATS) -> tuple[float, float, float]:
    """(median wall, min wall, median CPU) in ms, after a warm-up.

    On a shared machine the wall time includes waiting for other processes; the process CPU
    time (summed over threads) does not, so it shows what the code itself costs.
    """
    for _ in range(WARMUP):
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return statistics.median(wall), min(wall), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: these ops are memory-bound and, on a 2-core "
        "machine shared with other work, OpenMP barriers stall for whole scheduler ticks)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    qs = [torch.randn(HEADS, N, R, generator=gen) for _ in range(LAYERS)]
    ks = [torch.randn(HEADS, N, R, generator=gen) for _ in range(LAYERS)]
    golds = [torch.rand(HEADS, N, N, generator=gen) < 0.1 for _ in range(LAYERS)]
    kmeans = [
        KMeans.from_centroids(torch.randn(HEADS, B, R, generator=gen), top_k=TOP_K)
        for _ in range(LAYERS)
    ]
    unions = [Union(km, Window(3)) for km in kmeans]
    preds = [u.predict(q, k) for u, q, k in zip(unions, qs, ks, strict=True)]

    def each_layer(fn: Callable[[int], object]) -> Callable[[], None]:
        def run() -> None:
            for layer in range(LAYERS):
                fn(layer)

        return run

    def full(layer: int) -> None:
        pred = unions[layer].predict(qs[layer], ks[layer])
        recall(pred, golds[layer])
        sparsity(pred)

    parts = {
        "kmeans.predict": each_layer(lambda i: kmeans[i].predict(qs[i], ks[i])),
        "window.predict": each_layer(lambda i: Window(3).predict(qs[i], ks[i])),
        "union.predict": each_layer(lambda i: unions[i].predict(qs[i], ks[i])),
        "recall": each_layer(lambda i: recall(preds[i], golds[i])),
        "sparsity": each_layer(lambda i: sparsity(preds[i])),
        "sparsity(causal)": each_layer(lambda i: sparsity(preds[i], causal=True)),
        "distance(t=1).predict [info]": each_layer(lambda i: Distance(1.0).predict(qs[i], ks[i])),
        "quantization(4).predict [info]": each_layer(
            lambda i: Quantization(4).predict(qs[i], ks[i])
        ),
    }
    print(f"{LAYERS} layers x {HEADS} heads, n={N}, r={R}, threads={torch.get_num_threads()}")
    print(f"{'component (all 72 heads)':32s} {'median':>8s} {'min':>8s} {'cpu':>8s}  [ms]")
    for name, fn in parts.items():
        med, low, cpu = timings_ms(fn)
        print(f"{name:32s} {med:8.2f} {low:8.2f} {cpu:8.2f}")
    total, low, cpu = timings_ms(each_layer(full))
    print(f"{'total: union + recall + sparsity':32s} {total:8.2f} {low:8.2f} {cpu:8.2f}")
    print(f"ms={total:.2f}")


if __name__ == "__main__":
    main()
