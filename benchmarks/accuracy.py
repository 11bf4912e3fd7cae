"""Cost of one restricted forward pass of the default model at n=512 vs a full-entmax one.

The restricted pass predicts every layer's graph inside the forward pass from that layer's
own q/k (bundled projections; k-means B=8 top-2 ∪ window 3, and distance t=1.5 ∪ window 3),
then runs entmax only over the predicted keys. Both passes run the same (dense) kernels,
so the ratio measures what prediction and masking add, not a sparse speed-up. Prints
medians and, last, ``ratio=<restricted / full, the slower of the two methods>``.
Target: ratio ≤ 2. ``--smoke``: 64 tokens, one repeat.
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

from sparsefinder.bundle import bundle  # noqa: E402
from sparsefinder.evaluation.restricted import predictor_graph, restrict  # noqa: E402
from sparsefinder.models.loading import load_model  # noqa: E402
from sparsefinder.predictors import Distance, Union, Window  # noqa: E402
from sparsefinder.projections.heads import HeadProjections  # noqa: E402
from sparsefinder.runtime import tune_cpu_allocator  # noqa: E402

N, REPEATS, WARMUP = 512, 9, 2


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int = REPEATS,
                        warmup: int = WARMUP) -> dict[str, float]:
    """Median ms of each function, timed in turn within every repeat (after a warm-up), so a
    change in the load of a shared machine hits every function alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    made = parser(__doc__)
    made.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    made.add_argument("--tokens", type=int, default=N, help="tokens of the random input")
    made.add_argument("--repeats", type=int, default=REPEATS)
    made.add_argument("--warmup", type=int, default=WARMUP)
    args = parse(made, smoke={"tokens": 64, "repeats": 1, "warmup": 0})
    n = args.tokens
    torch.set_num_threads(args.threads)
    tune_cpu_allocator()  # as the CLI does: both passes reuse freed (heads, n, n) blocks
    loaded = load_model("default", device="cpu")
    projections = HeadProjections.load(bundle().path("projections.pt"),
                                       expected_model_id=loaded.model_id)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, loaded.tokenizer.vocab_size, (1, n), generator=gen)
    ids[0, 0], ids[0, -1] = loaded.tokenizer.cls_token_id, loaded.tokenizer.sep_token_id
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    graphs = {
        "kmeans8-top2+window": predictor_graph(
            lambda layer: Union(projections.kmeans(layer, 8, top_k=2), Window(3)),
            "projected", projections),
        "distance1.5+window": predictor_graph(
            lambda layer: Union(Distance(1.5), Window(3)), "projected", projections),
    }

    @torch.inference_mode()
    def full() -> None:
        loaded.model(**batch)

    def restricted(graph_fn) -> Callable[[], None]:
        @torch.inference_mode()
        def run() -> None:
            with restrict(loaded.model, graph_fn, warn_empty=False):
                loaded.model(**batch)

        return run

    medians = interleaved_medians(
        {"full": full, **{name: restricted(fn) for name, fn in graphs.items()}},
        args.repeats, args.warmup)
    full_ms = medians.pop("full")
    print(f"full entmax forward, n={n}: {full_ms:.1f} ms")
    for name, ms in medians.items():
        print(f"restricted ({name}): {ms:.1f} ms  ({ms / full_ms:.2f}x)")
    worst = max(medians.values()) / full_ms
    print(f"full_ms={full_ms:.1f} ratio={worst:.3f}")


if __name__ == "__main__":
    main()
