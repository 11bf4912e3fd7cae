"""Times the hot path of a slider move: predict every head of every layer, then score it.

6 layers × 12 heads at n=512, r=4 (seeded random data): Union(KMeans(B=8, top_k=2), Window(3))
plus recall and sparsity. Prints per-component medians and, last, ``ms=<median total>``.

``--predictor kmeans-routed`` (RoutedKMeans, B=128, budget 0.08 on d=32 original vectors),
``--predictor topp`` (TopP(0.9), an oracle, d=32), ``--predictor distance-budget``
(per-head squared thresholds on 11-coordinate projected vectors, the width of the bundled
calibrated projections (r = 9 plus the two augmentation coordinates), each head's set at its
10 % quantile, sparsity ~0.90) or ``--predictor distance-budget-floor`` (the app's first
screen, ``distance:budget`` with ``floor=12``: the same thresholds with each row's 12 nearest
keys, capped at the keys the target leaves the row; ``distance-floor-budget``, its old name,
is still accepted) time that predictor instead, and the
total then includes EVERY metric, scored as the sweep and the app score them (one ``Scorer``
per text): recall, sparsity, precision, exact fraction, attention-mass recall and block recall at
16 and 64. The process tunes glibc malloc as the app and the CLI do. ``--smoke``: n=64, two repeats.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import parse, parser  # noqa: E402

from sparsefinder.calibration.curves import DEFAULT_FLOOR, DEFAULT_FLOOR_SHARE  # noqa: E402
from sparsefinder.data.records import AttentionRecord, LayerGraph  # noqa: E402
from sparsefinder.metrics.measures import recall, sparsity  # noqa: E402
from sparsefinder.metrics.scorer import Scorer
from sparsefinder.predictors import Distance, KMeans, Quantization, Union, Window  # noqa: E402
from sparsefinder.predictors.routed_kmeans import RoutedKMeans  # noqa: E402
from sparsefinder.predictors.row_floor import RowFloor  # noqa: E402
from sparsefinder.predictors.threshold_distance import ThresholdDistance  # noqa: E402
from sparsefinder.predictors.topp import TopP  # noqa: E402
from sparsefinder.runtime import tune_cpu_allocator  # noqa: E402

# As the app and the CLI do at start-up: freed (heads, n, m) blocks are reused instead of
# mapped afresh (a first touch costs ~3.5 µs per 4 KiB page on this machine).
ALLOCATOR_TUNED = tune_cpu_allocator()

LAYERS, HEADS, N, R, B, TOP_K = 6, 12, 512, 4, 8, 2
D, ROUTED_B, ROUTED_BUDGET, TOPP_P = 32, 128, 0.08, 0.9
REPEATS, WARMUP = 30, 3
# Coordinates of the calibrated distance predictors' vectors: the bundled projections'
# rank 9 plus the two augmentation coordinates.
PROJECTED_DIM = 11
#: the first screen's floor cap at its target 0.90 (None: uncapped)
FLOOR_ROW_SHARE = None if DEFAULT_FLOOR_SHARE is None else DEFAULT_FLOOR_SHARE * (1 - 0.9)


def timings_ms(fn: Callable[[], object], repeats: int = REPEATS, warmup: int = WARMUP
               ) -> tuple[float, float, float]:
    """(median wall, min wall, median CPU) in ms, after a warm-up.

    On a shared machine the wall time includes waiting for other processes; the process CPU
    time (summed over threads) does not, so it shows what the code itself costs.
    """
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return statistics.median(wall), min(wall), statistics.median(cpu)


def main() -> None:
    made = parser(__doc__)
    made.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: these ops are memory-bound and, on a 2-core "
        "machine shared with other work, OpenMP barriers stall for whole scheduler ticks)",
    )
    made.add_argument(
        "--predictor", default="kmeans+window",
        choices=["kmeans+window", "kmeans-routed", "topp", "distance-budget",
                 "distance-budget-floor", "distance-floor-budget"],
        help="what to time (default: the app's kmeans+window); the issue-10 predictors are "
        "timed with all metrics",
    )
    made.add_argument("--tokens", type=int, default=N)
    made.add_argument("--repeats", type=int, default=REPEATS)
    args = parse(made, smoke={"tokens": 64, "repeats": 2})
    torch.set_num_threads(args.threads)
    n, timed = args.tokens, functools.partial(timings_ms, repeats=args.repeats,
                                              warmup=min(WARMUP, args.repeats))
    if args.predictor != "kmeans+window":
        all_metrics(args.predictor, n, timed)
        return
    gen = torch.Generator().manual_seed(0)
    qs = [torch.randn(HEADS, n, R, generator=gen) for _ in range(LAYERS)]
    ks = [torch.randn(HEADS, n, R, generator=gen) for _ in range(LAYERS)]
    golds = [torch.rand(HEADS, n, n, generator=gen) < 0.1 for _ in range(LAYERS)]
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
    print(f"{LAYERS} layers x {HEADS} heads, n={n}, r={R}, threads={torch.get_num_threads()}")
    print(f"{'component (all 72 heads)':32s} {'median':>8s} {'min':>8s} {'cpu':>8s}  [ms]")
    for name, fn in parts.items():
        med, low, cpu = timed(fn)
        print(f"{name:32s} {med:8.2f} {low:8.2f} {cpu:8.2f}")
    total, low, cpu = timed(each_layer(full))
    print(f"{'total: union + recall + sparsity':32s} {total:8.2f} {low:8.2f} {cpu:8.2f}")
    print(f"ms={total:.2f}")


def all_metrics(name: str, n: int, timed: Callable) -> None:
    """Times ``name``'s predict and every metric over 72 heads at ``n`` tokens (d=32 vectors).

    The metrics are scored as the sweep and the app score them: one :class:`Scorer` per
    text (built once, outside the timing), ``scorer.score(preds)`` per setting.
    """
    gen = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        q = torch.randn(HEADS, n, D, generator=gen)
        k = torch.randn(HEADS, n, D, generator=gen)
        gold = torch.rand(HEADS, n, n, generator=gen) < 0.1
        probs = gold * torch.rand(HEADS, n, n, generator=gen)
        probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-12)
        layers.append(LayerGraph(q, k, gold, probs[gold], 1.0))
    record = AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                             special=[False] * n, causal=False, layers=layers)
    qs = [layer.queries for layer in layers]
    ks = [layer.keys for layer in layers]
    if name == "kmeans-routed":
        predictors = [
            RoutedKMeans.from_centroids(
                torch.randn(HEADS, ROUTED_B, D, generator=gen), budget=ROUTED_BUDGET
            )
            for _ in range(LAYERS)
        ]
    elif name in ("distance-budget", "distance-budget-floor",
                  "distance-floor-budget"):  # projected vectors
        qs = [torch.randn(HEADS, n, PROJECTED_DIM, generator=gen) for _ in range(LAYERS)]
        ks = [torch.randn(HEADS, n, PROJECTED_DIM, generator=gen) for _ in range(LAYERS)]
        predictors = []
        for q, k in zip(qs, ks, strict=True):
            squared = torch.cdist(q, k).square().flatten(1)
            threshold = ThresholdDistance(squared.quantile(0.1, dim=-1))
            predictors.append(threshold if name == "distance-budget"
                              else RowFloor(threshold, DEFAULT_FLOOR, FLOOR_ROW_SHARE))
    else:
        predictors = [TopP(TOPP_P) for _ in range(LAYERS)]
    scorer, basic = Scorer(record), Scorer(record, extra=False)
    preds = [p.predict(q, k) for p, q, k in zip(predictors, qs, ks, strict=True)]
    scorer.score(preds)  # lists the gold edges once per text (as the sweep's first setting)

    def predict_all() -> list[torch.Tensor]:
        return [p.predict(q, k) for p, q, k in zip(predictors, qs, ks, strict=True)]

    parts: dict[str, Callable[[], object]] = {
        f"{name}.predict": predict_all,
        "Scorer: all 7 metrics": lambda: scorer.score(preds),
        "Scorer: recall+sparsity [info]": lambda: basic.score(preds),
    }
    print(f"{LAYERS} layers x {HEADS} heads, n={n}, d={D}, threads={torch.get_num_threads()}, "
          f"malloc tuned={ALLOCATOR_TUNED}, load average {os.getloadavg()[0]:.2f}")
    print(f"{'component (all 72 heads)':32s} {'median':>8s} {'min':>8s} {'cpu':>8s}  [ms]")
    for label, fn in parts.items():
        med, low, cpu = timed(fn)
        print(f"{label:32s} {med:8.2f} {low:8.2f} {cpu:8.2f}")
    total, low, cpu = timed(lambda: scorer.score(predict_all()))
    print(f"{'total: predict + all metrics':32s} {total:8.2f} {low:8.2f} {cpu:8.2f}")
    print(f"predictor={name} ms={total:.2f} min_ms={low:.2f} cpu_ms={cpu:.2f}")


if __name__ == "__main__":
    main()
