"""Corpus runs of the app: gold graphs of a validation split and its sweep, with progress.

Both report ``on_progress(fraction, message)`` so the app draws one progress bar; the sweep
itself is ``pareto.sweep`` (one call for every method, not one call per method).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from sparsefinder import pareto
from sparsefinder.corpus import corpus_texts
from sparsefinder.graphs import AttentionRecord, extract
from sparsefinder.projections import HeadProjections

ProgressFn = Callable[[float, str], None]


def corpus_records(
    loaded: Any,
    corpus: str = "default",
    split: str = "validation",
    max_passages: int | None = None,
    batch_size: int = 8,
    on_progress: ProgressFn | None = None,
) -> list[AttentionRecord]:
    """Gold graphs of a corpus split (chunked to the model's length, never truncated)."""
    texts = corpus_texts(corpus, split, loaded.tokenizer, loaded.max_length, max_passages)
    records: list[AttentionRecord] = []
    for start in range(0, len(texts), batch_size):
        if on_progress:
            on_progress(start / max(len(texts), 1),
                        f"gold graphs: text {start + 1}–{min(start + batch_size, len(texts))} "
                        f"of {len(texts)}")
        records.extend(extract(loaded, texts[start:start + batch_size], batch_size=batch_size,
                               long_text="error"))
    if on_progress:
        on_progress(1.0, f"{len(records)} texts")
    return records


def sweep_records(
    records: Sequence[AttentionRecord],
    projections: HeadProjections | None,
    methods: Sequence[str],
    on_progress: ProgressFn | None = None,
) -> pd.DataFrame:
    """``pareto.sweep`` of ``methods`` on ``records``, reporting progress."""
    if not methods:
        raise ValueError("no sweep method can run here (learned methods need projections)")
    return pareto.sweep(records, projections, list(methods), on_progress=on_progress)
