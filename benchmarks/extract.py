"""Times one 512-token forward pass of the default model: α=1.5 entmax vs stock softmax.

all-MiniLM-L6-v2 (6 layers × 12 heads) on real prose (Python's pydoc topics, truncated to 512
tokens), ``torch.inference_mode``, the median of interleaved rounds after warm-up for:

* ``entmax (fast)``  — sparsefinder's attention as it runs by default (engine ``auto``): on a
  CPU the compiled sort-free row solver (``sparsefinder.attention.entmax_rows``); on a GPU the
  package's sort for rows under 2048 keys (faster there), the block solver from 2048 on;
* ``entmax (blocks)`` — the same with the tensor-op block solver forced, for information;
* ``entmax15 (pkg)`` — the same attention with the ``entmax`` package's sort-based entmax15
  (``reference_mode``), for information;
* ``softmax eager`` / ``softmax sdpa`` — transformers' stock attention implementations.

Exactness: the fast path's probabilities of every layer, against ``entmax.entmax15`` on the very
same captured scores (float32, and float64 for scale), plus support mismatches and the share of
rows the solver handed to its sort-based fallback. The last line is
``ratio=<entmax fast / faster softmax> max_abs_diff=<fast vs entmax15, all layers>``.

The benchmark tunes glibc malloc (``sparsefinder.runtime.tune_cpu_allocator``, as the CLI and
the app do) for every configuration alike; ``SPARSEFINDER_MALLOC_TUNING=0`` measures without
it. The machine's load average is printed because timings on a shared machine are only as
good as its quiet.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/extract.py`` (``--tokens``, ``--rounds``;
``--smoke``: 64 tokens, one round, no warm-up).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from entmax import entmax15

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import parse, parser  # noqa: E402

from sparsefinder.attention.entmax_ops import (  # noqa: E402
    SolverStats,
    entmax15_fast,
    entmax_normalize,
    reference_mode,
    solver_engine,
)
from sparsefinder.attention.interface import ENTMAX_ATTENTION, AttentionCall, capture  # noqa: E402
from sparsefinder.models.loading import load_model  # noqa: E402
from sparsefinder.runtime import tune_cpu_allocator  # noqa: E402

CPU_ALLOCATOR_TUNED = tune_cpu_allocator()

N_TOKENS = 512
ROUNDS, REFERENCE_ROUNDS, WARMUP = 9, 7, 2


def prose_input(tokenizer, n_tokens: int = N_TOKENS) -> dict[str, torch.Tensor]:
    """Real English prose, exactly ``n_tokens`` tokens: the pydoc topics, concatenated."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[key] for key in sorted(topics))
    batch = tokenizer(text[: 40 * n_tokens], truncation=True, max_length=n_tokens,
                      return_tensors="pt")
    assert batch["input_ids"].shape[1] == n_tokens, batch["input_ids"].shape
    return dict(batch)


def main() -> None:
    made = parser(__doc__.splitlines()[0])
    made.add_argument("--tokens", type=int, default=N_TOKENS)
    made.add_argument("--rounds", type=int, default=ROUNDS,
                      help=f"timed rounds (the package's sort: at most {REFERENCE_ROUNDS})")
    made.add_argument("--warmup", type=int, default=WARMUP)
    args = parse(made, smoke={"tokens": 64, "rounds": 1, "warmup": 0})
    loaded = load_model("default", alpha=1.5)
    model, device = loaded.model, loaded.device
    batch = {key: value.to(device)
             for key, value in prose_input(loaded.tokenizer, args.tokens).items()}

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def forward() -> None:
        with torch.inference_mode():
            model(**batch)
        sync()

    def reference_forward() -> None:
        with reference_mode():
            forward()

    def blocks_forward() -> None:
        with solver_engine("blocks"):
            forward()

    configs: dict[str, tuple[str, Callable[[], None]]] = {
        "entmax (fast)": (ENTMAX_ATTENTION, forward),
        "entmax (blocks)": (ENTMAX_ATTENTION, blocks_forward),
        "entmax15 (pkg)": (ENTMAX_ATTENTION, reference_forward),
        "softmax eager": ("eager", forward),
        "softmax sdpa": ("sdpa", forward),
    }
    times: dict[str, list[float]] = {name: [] for name in configs}
    for impl, run in configs.values():
        model.set_attn_implementation(impl)
        for _ in range(args.warmup):
            run()
    # Interleaved rounds, so drifting load on a shared machine hits every config alike.
    for round_ in range(args.rounds):
        for name, (impl, run) in configs.items():
            if name == "entmax15 (pkg)" and round_ >= REFERENCE_ROUNDS:
                continue
            model.set_attn_implementation(impl)
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) * 1e3)
    model.set_attn_implementation(ENTMAX_ATTENTION)
    medians = {name: statistics.median(values) for name, values in times.items()}

    # Exactness on the scores the fast forward actually saw, layer by layer.
    calls: list[AttentionCall] = []
    with torch.inference_mode(), capture(calls.append):
        model(**batch)
    max_diff = max_diff64 = capture_diff = 0.0
    mismatches = 0
    stats = SolverStats()
    per_layer = []
    with torch.inference_mode():
        for call in calls:
            scores = torch.matmul(call.query, call.key.transpose(-1, -2)) * call.scaling
            layer_stats = SolverStats()
            entmax15_fast(scores, stats=layer_stats)  # the solver's counters on these scores
            # The model's own normalisation (on a GPU, short rows take the package's sort) on
            # the same scores: bit for bit on a CPU, within 1e-6 where kernels round otherwise.
            recomputed = entmax_normalize(scores, 1.5)
            capture_diff = max(capture_diff, float((recomputed - call.probs).abs().max()))
            reference = entmax15(scores, dim=-1)
            reference64 = entmax15(scores.double(), dim=-1)
            diff = float((call.probs - reference).abs().max())
            max_diff = max(max_diff, diff)
            max_diff64 = max(max_diff64, float((call.probs.double() - reference64).abs().max()))
            mismatches += int(((call.probs > 0) != (reference > 0)).sum())
            for field in ("rows", "fallback_rows", "evaluations", "calls"):
                setattr(stats, field, getattr(stats, field) + getattr(layer_stats, field))
            density = float((call.probs > 0).float().mean())
            per_layer.append((call.layer, density, layer_stats.block_fraction,
                              layer_stats.evaluations_per_row, layer_stats.fallback_rows, diff))

    softmax_name = min(("softmax eager", "softmax sdpa"), key=medians.__getitem__)
    ratio = medians["entmax (fast)"] / medians[softmax_name]
    print(f"default model ({loaded.model_id}), n={args.tokens} tokens of pydoc prose, "
          f"device={device}, torch threads={torch.get_num_threads()}, "
          f"load avg={os.getloadavg()[0]:.1f} (over {os.cpu_count()} cores), "
          f"malloc tuning={'on' if CPU_ALLOCATOR_TUNED else 'off'}")
    print(f"{'forward pass':<16}{'median ms':>10}{'min ms':>9}{'runs':>6}{'vs softmax':>12}")
    for name, values in times.items():
        print(f"{name:<16}{medians[name]:>10.1f}{min(values):>9.1f}{len(values):>6}"
              f"{medians[name] / medians[softmax_name]:>11.2f}x")
    print(f"{'layer':<7}{'density':>9}{'blocks kept':>13}{'evals/row':>11}{'fallback':>10}"
          f"{'max|Δ| vs pkg':>15}")
    for layer, density, kept, evals, fallback, diff in per_layer:
        print(f"{layer:<7}{density:>9.4f}{kept:>13.3f}{evals:>11.2f}{fallback:>10}"
              f"{diff:>15.2e}")
    print(f"fallback rows: {stats.fallback_rows}/{stats.rows} ({stats.fallback_rate:.4%}); "
          f"support mismatches vs entmax15: {mismatches}; "
          f"max|Δ| vs entmax15 in float64: {max_diff64:.2e}")
    print(f"capture vs a direct call on the same scores: max|Δ| {capture_diff:.2e}")
    if capture_diff > 1e-6:
        raise SystemExit(f"the captured probabilities differ from a direct call by "
                         f"{capture_diff:.2e} (> 1e-6)")
    print(f"ratio uses {softmax_name} (the faster stock implementation)")
    print(f"ratio={ratio:.3f} max_abs_diff={max_diff:.3e}")


if __name__ == "__main__":
    main()
