"""Times the Learned space view: one head's space, the row of distances, its figures.

The default model reads a text of ``--tokens`` tokens (default 512, the model's longest:
consecutive passages of the default corpus' train split; ``--tokens 0`` reads the ~480-token
example assets/examples/long_report_512.txt instead) once, with the app's projections and
calibration table; each method's masks are predicted once, as the app
caches them. Each sample then is what the page computes when the selection changes: a new
(layer, head, query) drawn at random → ``explore.learned_space.head_space`` (exact
distances, plane, decision from the real predictor, the full row for the diff), its reasons
and the space, row (and, quantization, bins) figures. The model never reruns.

Prints p50/p95 per method and, last, ``p50_ms=<worst method's p50> p95_ms=<its p95>``.
Goal: p50 <= 200 ms at 512 tokens. Runs with the app's one torch thread.

    .venv/bin/python benchmarks/learned_space.py [--samples 40] [--tokens 512]

``--smoke``: 64 tokens, two selections per method.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import parse, parser  # noqa: E402

from sparsefinder import runtime  # noqa: E402

METHODS = ("distance:budget", "rowfrac:budget", "distance", "quantization", "kmeans")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def prepare_text(tokens: int):
    """The prepared text of the app (bundled projections and calibration) and its notes."""
    from sparsefinder.bundle import bundle
    from sparsefinder.calibration.table import CalibrationTable
    from sparsefinder.explore import inputs
    from sparsefinder.explore import prepared as prep
    from sparsefinder.models.loading import load_model
    from sparsefinder.projections.heads import HeadProjections

    loaded = load_model("default", alpha=1.5, device="cpu")
    if not tokens:
        text = inputs.read_example("long_report_512")
    else:
        from sparsefinder.data.long_context import long_texts

        text = long_texts(loaded.tokenizer, tokens, 1, "train")[0]
    record, _ = inputs.extract_one(loaded, text)
    table_path = bundle().path("calibration")
    table = CalibrationTable.load(table_path)
    return prep.prepare(record, HeadProjections.load(bundle().best("centroids")),
                        calibration=table,
                        calibration_projections=table.own_projections(table_path))


def main() -> None:
    made = parser(__doc__)
    made.add_argument("--samples", type=int, default=40, help="selections per method")
    made.add_argument("--tokens", type=int, default=512,
                      help="tokens of the text (0: the bundled ~480-token example)")
    args = parse(made, smoke={"samples": 2, "tokens": 64})
    runtime.tune_cpu_allocator()
    threads = runtime.set_torch_threads()
    from sparsefinder.explore import inputs, live
    from sparsefinder.explore import learned_space as ls
    from sparsefinder.explore.state import ViewState
    from sparsefinder.figures import learned_space as figs

    prepared = prepare_text(args.tokens)
    labels = inputs.token_labels(prepared.record)
    n = prepared.n_tokens
    print(f"{n} tokens, {prepared.num_layers} layers x {prepared.num_heads} heads, "
          f"threads={threads}, load average {os.getloadavg()[0]:.2f}")
    rng = random.Random(0)
    worst = (0.0, 0.0)
    for method in METHODS:
        state, _ = live.clamp(ViewState(method=method), prepared)
        spec = live.spec_for(state, prepared)
        preds = live.predict(prepared, spec)  # the app's cached masks

        def view(layer: int, head: int, query: int, spec=spec, preds=preds) -> None:
            space = ls.head_space(prepared, spec, layer, head, query, preds[layer][head, query])
            ls.reasons(space)
            figs.space_figure(space, labels)
            figs.row_figure(space, labels)
            if space.decision.kind == ls.QUANTIZATION:
                figs.bands_figure(space, labels)

        picks = [(rng.randrange(prepared.num_layers), rng.randrange(prepared.num_heads),
                  rng.randrange(n)) for _ in range(args.samples + 3)]
        for pick in picks[:3]:  # warm-up
            view(*pick)
        samples = []
        for pick in picks[3:]:
            start = time.perf_counter()
            view(*pick)
            samples.append((time.perf_counter() - start) * 1e3)
        p50, p95 = statistics.median(samples), percentile(samples, 0.95)
        print(f"{method:18s} p50 {p50:7.1f} ms  p95 {p95:7.1f} ms  ({len(samples)} selections)")
        worst = max(worst, (p50, p95))
    print(f"p50_ms={worst[0]:.1f} p95_ms={worst[1]:.1f}")


if __name__ == "__main__":
    main()
