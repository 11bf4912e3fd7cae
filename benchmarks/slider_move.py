"""Library time of one Explorer slider move on a long text, without the browser.

What the Explorer computes when the window-size slider moves on a long text
(``app/app_pages/explorer.py``): the spec of the new setting, every layer's prediction
(``live.predict``), every metric of every head (``live.score``), the three-scope summary,
the viewed head's block overview of the whole text and the gold | predicted | diff figure
of the shown window (the first 256 tokens). The model is ``benchmarks/app_latency.py``'s
long-text one: a tiny random long-context Qwen2 (GQA, layer 0 global, layer 1 a 64-token
sliding window), run on ``--tokens`` tokens of the default corpus' train split.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/slider_move.py [--tokens 4096] [--moves 20]

Prints per-part medians and bests (on a loaded machine the best is the compute, the median
adds waits for a core) and, last, ``p50_ms=<x> p95_ms=<y>`` of the whole move.
``--record FILE`` reuses (or first saves) the extracted record, to compare code versions on
one text without extracting it again. ``--smoke``: 256 tokens, two moves.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import parse, parser  # noqa: E402

from sparsefinder.runtime import tune_cpu_allocator  # noqa: E402

ALLOCATOR_TUNED = tune_cpu_allocator()  # as the app does at start-up


def long_record(tokens: int, path: Path | None):
    """The extracted record of a ``tokens``-token text on the tiny long-context Qwen2."""
    from sparsefinder.data.long_context import long_texts
    from sparsefinder.explore import inputs
    from sparsefinder.models.decoders import save_tiny_decoder
    from sparsefinder.models.loading import load_model

    if path is not None and path.exists():
        return torch.load(path, weights_only=False)
    with tempfile.TemporaryDirectory() as folder:
        model = save_tiny_decoder("qwen2", Path(folder) / "qwen2", max_positions=4096)
        loaded = load_model(str(model), device="cpu")
        record, _ = inputs.extract_one(loaded, long_texts(loaded.tokenizer, tokens, 1,
                                                          "train")[0])
    if path is not None:
        torch.save(record, path)
    return record


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> int:
    from sparsefinder.explore import inputs, live, long_view, tables
    from sparsefinder.explore import prepared as prep
    from sparsefinder.explore.state import ViewState
    from sparsefinder.figures import graphs

    made = parser(__doc__.splitlines()[0])
    made.add_argument("--tokens", type=int, default=4096)
    made.add_argument("--moves", type=int, default=20)
    made.add_argument("--record", type=Path, default=None)
    args = parse(made, smoke={"tokens": 256, "moves": 2})
    record = long_record(args.tokens, args.record)
    prepared = prep.prepare(record)
    labels = inputs.token_labels(record)
    state, _ = live.clamp(ViewState(method="window", window=3), prepared)
    shown = slice(0, min(record.n_tokens, long_view.DEFAULT_WINDOW))
    layer, head = state.layer, state.head
    parts: dict[str, list[float]] = {}
    totals: list[float] = []
    live.score(prepared, live.predict(prepared, live.spec_for(state, prepared)))  # gold index
    for move in range(args.moves + 2):  # two warm-up moves, as app_latency.py
        state = replace(state, window=3 + 2 * (move % 10))
        clock = time.perf_counter()
        marks = {}
        spec = live.spec_for(state, prepared)
        preds = live.predict(prepared, spec)
        marks["predict"] = time.perf_counter()
        scores = live.score(prepared, preds)
        live.summarize(scores, layer, head)
        marks["score"] = time.perf_counter()
        long_view.block_overview(record.layers[layer].gold_of(head), preds[layer][head])
        marks["blocks"] = time.perf_counter()
        gold = record.layers[layer].gold_of(head)[shown, shown]
        pred = preds[layer][head][shown, shown]
        probs = long_view.head_probs(record.layers[layer], head, shown, shown).numpy()
        codes = tables.diff_codes(pred, gold)
        graphs.head_figure(gold.numpy(), pred.numpy(), codes, labels[shown], "move",
                           tables.diff_counts(codes), probs, 1200)
        marks["figure"] = time.perf_counter()
        if move >= 2:
            last = clock
            for name, at in marks.items():
                parts.setdefault(name, []).append((at - last) * 1e3)
                last = at
            totals.append((last - clock) * 1e3)
    print(f"n={record.n_tokens} layers={record.num_layers} heads={record.num_heads} "
          f"windows={[g.sliding_window for g in record.layers]} load={os.getloadavg()[0]:.2f} "
          f"threads={torch.get_num_threads()}")
    for name, values in parts.items():
        print(f"{name:8s} median {statistics.median(values):8.1f} ms  best {min(values):8.1f} ms")
    print(f"move     median {statistics.median(totals):8.1f} ms  best {min(totals):8.1f} ms")
    print(f"p50_ms={statistics.median(totals):.1f} p95_ms={percentile(totals, 0.95):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
