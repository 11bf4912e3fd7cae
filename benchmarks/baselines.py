"""Times every baseline predictor on the hot path: all 6 layers × 12 heads of one text, n=512.

Projection-based methods get seeded random projections with r=4; the Top-k oracle gets
original-size vectors d=32 (it needs the full score matrix and is exempt from the budget).
Each method uses its most expensive grid point (largest n_global / n_random / buckets /
clusters, window 11 as in the paper's appendix C figures). Prints one line per method (median
over repeats, all layers together) and, last, ``max_ms=<worst non-oracle method>``.

``--threads N`` sets torch's intra-op threads (default: torch's own choice). On a CPU shared
with other busy processes, 2 OpenMP threads can stall each other at every barrier; run with
``--threads 1`` too and compare. ``--smoke``: n=64, two repeats.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import parse, parser  # noqa: E402

from sparsefinder.predictors.bigbird import BigBird  # noqa: E402
from sparsefinder.predictors.longformer import Longformer  # noqa: E402
from sparsefinder.predictors.reformer import Reformer  # noqa: E402
from sparsefinder.predictors.routing import Routing  # noqa: E402
from sparsefinder.predictors.sparsebert import NoDiagonal, StaticMask  # noqa: E402
from sparsefinder.predictors.topk import TopK  # noqa: E402

LAYERS, HEADS, N, R, D = 6, 12, 512, 4, 32
WINDOW = 11
REPEATS, WARMUP = 20, 3
BUDGET_MS = 50.0


def timings_ms(fn: Callable[[], object], repeats: int = REPEATS, warmup: int = WARMUP
               ) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def main() -> None:
    made = parser(__doc__.splitlines()[0])
    made.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    made.add_argument("--repeats", type=int, default=REPEATS)
    made.add_argument("--tokens", type=int, default=N)
    args = parse(made, smoke={"repeats": 2, "tokens": 64})
    n = args.tokens
    warmup = min(WARMUP, args.repeats)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    qs = [torch.randn(HEADS, n, R, generator=gen) for _ in range(LAYERS)]
    ks = [torch.randn(HEADS, n, R, generator=gen) for _ in range(LAYERS)]
    qd = [torch.randn(HEADS, n, D, generator=gen) for _ in range(LAYERS)]
    kd = [torch.randn(HEADS, n, D, generator=gen) for _ in range(LAYERS)]
    # StaticMask is fitted per layer on a few gold-like graphs (fitting is not timed).
    golds = [
        [torch.rand(HEADS, n, n, generator=gen) < 0.05 for _ in range(2)] for _ in range(LAYERS)
    ]
    dams = [StaticMask("structured", 0.9).fit(g) for g in golds]
    damu = [StaticMask("unstructured", 0.9).fit(g) for g in golds]
    routing_fitted = [Routing(10).fit(q, k) for q, k in zip(qs, ks, strict=True)]

    def each_layer(predict: Callable[[int], object]) -> Callable[[], None]:
        def run() -> None:
            for layer in range(LAYERS):
                predict(layer)

        return run

    def simple(pred, causal: bool = False) -> Callable[[], None]:
        return each_layer(lambda i: pred.predict(qs[i], ks[i], causal=causal))

    methods: dict[str, Callable[[], None]] = {
        "longformer(w=11, n_global=20)": simple(Longformer(WINDOW, 20)),
        "bigbird(w=11, n_random=10)": simple(BigBird(WINDOW, 10)),
        "bigbird(w=11, n_random=10, causal)": simple(BigBird(WINDOW, 10), causal=True),
        "reformer(B=12)": simple(Reformer(12)),
        "reformer(B=12, n_hashes=2)": simple(Reformer(12, n_hashes=2)),
        "routing(c=10, per-text k-means)": simple(Routing(10)),
        "routing(c=10, fitted centroids)": each_layer(
            lambda i: routing_fitted[i].predict(qs[i], ks[i])
        ),
        "staticmask(structured, 0.9)": each_layer(lambda i: dams[i].predict(qs[i], ks[i])),
        "staticmask(unstructured, 0.9)": each_layer(lambda i: damu[i].predict(qs[i], ks[i])),
        "nodiagonal(bigbird)": simple(NoDiagonal(BigBird(WINDOW, 10))),
    }
    oracles = {
        f"topk(k=32, d={D}) [oracle, exempt]": each_layer(lambda i: TopK(32).predict(qd[i], kd[i])),
        f"topk(k=32, d={D}, causal) [oracle, exempt]": each_layer(
            lambda i: TopK(32).predict(qd[i], kd[i], causal=True)
        ),
    }
    print(f"{LAYERS} layers x {HEADS} heads, n={n}, r={R}, threads={torch.get_num_threads()}")
    worst = 0.0
    for name, fn in methods.items():
        times = timings_ms(fn, args.repeats, warmup)
        ms = statistics.median(times)
        worst = max(worst, ms)
        flag = "" if ms <= BUDGET_MS else f"  OVER {BUDGET_MS:.0f} ms"
        print(f"{name:44s} {ms:8.2f} ms (all layers; min {min(times):.2f}){flag}")
    for name, fn in oracles.items():
        times = timings_ms(fn, min(5, args.repeats), warmup)
        print(f"{name:44s} {statistics.median(times):8.2f} ms (all layers; min {min(times):.2f})")
    print(f"max_ms={worst:.2f}")


if __name__ == "__main__":
    main()
