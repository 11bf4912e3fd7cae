"""The head atlas: every head of a model across a corpus, what it does, where prediction fails.

:func:`compute_atlas` reads the gold graphs of a corpus twice (records come from a factory,
e.g. a list or a shard store read per torchrun rank):

1. sums of every per-head statistic (:class:`~.atlas_stats.HeadSums`), the predictor's
   per-head scores and the head-to-head Jensen–Shannon sums, reduced over ranks with one
   ``all_reduce(SUM)`` (exact: the sums of two shards are the sums of both);
2. with the reduced means known, each head's most typical rows: the rows whose features
   (the mass shares, the kept fraction of keys, contiguity) are nearest (L1) to the head's
   mean; the three best, from three different texts, are gathered from every rank.

The result, a :class:`HeadAtlas`, names each head's pattern type (:mod:`.atlas_types`),
orders heads by similarity and maps them in 2-D (:mod:`.atlas_similarity`), and writes
``heads.csv`` and ``atlas.json`` (:mod:`.atlas_io`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from sparsefinder import distributed
from sparsefinder.analysis.atlas_predictor import AtlasPredictor
from sparsefinder.analysis.atlas_similarity import cluster_order, head_map, jsd_row_sums
from sparsefinder.analysis.atlas_stats import (
    LENGTH_EDGES,
    SHARES,
    HeadSums,
    punctuation_mask,
    row_features,
)
from sparsefinder.analysis.atlas_types import PATTERN_LABELS, pattern_types
from sparsefinder.data.records import AttentionRecord
from sparsefinder.metrics.scorer import Scorer

#: Fewest texts an atlas is computed from (quantiles over texts and a head map need some).
MIN_TEXTS = 4
#: Example rows kept per head (each from a different text).
EXAMPLES = 3
#: Row features compared with the head's mean to find its most typical rows.
TYPICAL_FEATURES = (*SHARES, "support_fraction", "contiguous")
#: Attended keys listed per example row.
TOP_KEYS = 6

ProgressFn = Callable[[float, str], None]
RecordsFactory = Callable[[], Iterable[AttentionRecord]]


def text_id(text: str) -> str:
    """A text's name: the first 16 hex digits of its SHA-256, as the app's links name texts
    (``explore.texts.text_id``, a layer above; a test keeps the two equal)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


class AtlasInputError(ValueError):
    """The corpus cannot give an atlas; the message says why and what to do."""


@dataclass
class HeadAtlas:
    """Every head's statistics, type, examples and similarity to the others."""

    heads: pd.DataFrame  # one row per (layer, head), layer-major
    similarity: np.ndarray  # (L·H, L·H) mean JSD in bits
    order: list[int]  # cluster order of the heads (indices into heads)
    coords: np.ndarray  # (L·H, 2) MDS map
    examples: dict[str, list[dict[str, Any]]]  # "L.H" -> typical rows, best first
    texts: dict[str, str]  # text id -> text, for the examples
    sparsity_hist: np.ndarray  # (L, H, bins) texts per gold-sparsity bin
    support_hist: np.ndarray  # (L, H, bins) rows per support size
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return int(self.heads["layer"].max()) + 1

    @property
    def num_heads(self) -> int:
        return int(self.heads["head"].max()) + 1

    def grid(self, column: str) -> np.ndarray:
        """(layers, heads) values of one statistic (for a layer × head heatmap)."""
        return self.heads[column].to_numpy().reshape(self.num_layers, self.num_heads)

    def head_row(self, layer: int, head: int) -> pd.Series:
        return self.heads.iloc[layer * self.num_heads + head]

    def type_counts(self) -> pd.DataFrame:
        """Heads of each pattern type per layer (layers as rows)."""
        counts = pd.crosstab(self.heads["layer"], self.heads["type"])
        return counts.reindex(columns=[t for t in PATTERN_LABELS if t in counts.columns])


def _reduced_shape(records: Iterable[AttentionRecord]) -> tuple[list[AttentionRecord], int, int]:
    items = list(records)
    shape = torch.tensor([items[0].num_layers, items[0].num_heads] if items else [0, 0])
    shape = distributed.all_reduce(shape, "max")
    return items, int(shape[0]), int(shape[1])


def _first_pass(records: Iterable[AttentionRecord], predictor: AtlasPredictor | None,
                total: int | None, on_progress: ProgressFn | None
                ) -> tuple[HeadSums, torch.Tensor]:
    """Rank-local sums of every statistic and of the JSD between heads."""
    sums: HeadSums | None = None
    jsd: torch.Tensor | None = None
    for index, record in enumerate(records):
        if sums is None:
            sums = HeadSums.zeros(record.num_layers, record.num_heads)
            jsd = torch.zeros(record.num_layers * record.num_heads,
                              record.num_layers * record.num_heads, dtype=torch.float64)
        scorer = Scorer(record, extra=predictor is not None)
        scores = predictor.scores(record, scorer) if predictor is not None else None
        sums.add_record(record, scorer.gold_sparsity, scores)
        jsd += jsd_row_sums(record)
        if on_progress is not None:
            done = (index + 1) / total if total else 0.0
            on_progress(0.9 * done, f"head statistics: text {index + 1}"
                        + (f" of {total}" if total else ""))
    return sums, jsd


def _reduce(sums: HeadSums | None, jsd: torch.Tensor | None, num_layers: int,
            num_heads: int) -> tuple[HeadSums, torch.Tensor]:
    if sums is None:
        sums = HeadSums.zeros(num_layers, num_heads)
        jsd = torch.zeros(num_layers * num_heads, num_layers * num_heads, dtype=torch.float64)
    packed = distributed.all_reduce(torch.cat([sums.pack(), jsd.reshape(-1)]))
    split = sums.pack().numel()
    return sums.unpack(packed[:split]), packed[split:].reshape(jsd.shape)


def _example(record: AttentionRecord, layer: int, head: int, row: int) -> dict[str, Any]:
    """One example row: its query token and the keys it attends to most."""
    probs = record.layers[layer].probs()[head, row]
    kept = int((probs > 0).sum())
    top = torch.topk(probs, min(TOP_KEYS, kept)) if kept else None
    keys = ([] if top is None else
            [[int(j), record.tokens[int(j)], round(float(p), 4)]
             for p, j in zip(top.values, top.indices, strict=True)])
    return {"text_id": text_id(record.text), "query": int(row), "token": record.tokens[row],
            "n_tokens": record.n_tokens, "support": kept, "keys": keys}


def _typical_rows(records: Iterable[AttentionRecord], means: Mapping[str, torch.Tensor]
                  ) -> tuple[dict[str, list], dict[str, str]]:
    """Per head, the EXAMPLES rows (different texts) nearest to its mean features."""
    target = torch.stack([means[name] for name in TYPICAL_FEATURES], -1)  # (L, H, F)
    best: dict[str, list] = {}
    texts: dict[str, str] = {}
    for record in records:
        punctuation = punctuation_mask(record.tokens, record.special)
        ordinary = ~torch.tensor(record.special, dtype=torch.bool)
        if not bool(ordinary.any()):
            continue
        gaps = []
        for layer, graph in enumerate(record.layers):
            features = row_features(graph, record.causal, punctuation)
            rows = torch.stack([features[name] for name in TYPICAL_FEATURES], -1)  # (H, n, F)
            gap = (rows - target[layer][:, None]).abs().sum(-1)
            gaps.append(gap.masked_fill(~ordinary, float("inf")))
        gap, where = torch.stack(gaps).min(-1)  # (L, H)
        tid = text_id(record.text)
        for layer in range(gap.shape[0]):
            for head in range(gap.shape[1]):
                kept = best.setdefault(f"{layer}.{head}", [])
                # rounded: float noise of the means (summation order) never reorders ties;
                # ties go to the smaller text id, on every rank and in the merge alike
                item = (round(float(gap[layer, head]), 9), tid)
                if len(kept) == EXAMPLES and item >= kept[-1][:2]:
                    continue
                kept.append((*item, _example(record, layer, head, int(where[layer, head]))))
                kept.sort(key=lambda entry: entry[:2])
                del kept[EXAMPLES:]
                texts[tid] = record.text
    return best, texts


def _merge_examples(parts: list[tuple[dict[str, list], dict[str, str]]]
                    ) -> tuple[dict[str, list[dict]], dict[str, str]]:
    merged: dict[str, list] = {}
    all_texts: dict[str, str] = {}
    for best, texts in parts:
        all_texts.update(texts)
        for key, kept in best.items():
            merged.setdefault(key, []).extend(kept)
    examples: dict[str, list[dict]] = {}
    for key, items in merged.items():
        items.sort(key=lambda item: item[:2])  # nearest first, then by text id
        examples[key] = [{**entry, "gap": round(gap, 6)} for gap, _, entry in items[:EXAMPLES]]
    used = {e["text_id"] for rows in examples.values() for e in rows}
    return examples, {tid: text for tid, text in all_texts.items() if tid in used}


def compute_atlas(records: RecordsFactory, predictor: AtlasPredictor | None = None, *,
                  alpha: float = 1.5, meta: Mapping[str, Any] | None = None,
                  total: int | None = None, on_progress: ProgressFn | None = None) -> HeadAtlas:
    """The atlas of the records ``records()`` yields (called twice; under torchrun each rank
    yields its own share and every rank returns the same atlas). ``alpha`` ≤ 1: every layer
    is softmax, so every head is ``dense``."""
    local, num_layers, num_heads = _reduced_shape(records())
    if num_layers == 0:
        raise AtlasInputError(f"the atlas needs at least {MIN_TEXTS} texts and the corpus gave "
                              "none; use a corpus with more passages (or --split all)")
    sums, jsd = _first_pass(local, predictor, total, on_progress)
    sums, jsd = _reduce(sums, jsd, num_layers, num_heads)
    n_texts = int(sums.texts)
    if n_texts < MIN_TEXTS:
        raise AtlasInputError(f"the atlas needs at least {MIN_TEXTS} texts and the corpus gave "
                              f"{n_texts}; use a corpus with more passages (or --split all)")
    means = sums.means()
    if on_progress is not None:
        on_progress(0.9, "typical rows of every head")
    parts = distributed.gather_objects(_typical_rows(local, means))
    examples, texts = _merge_examples(parts)  # type: ignore[arg-type]
    similarity = (jsd / max(float(sums.rows), 1.0)).numpy()
    dense_layers = [alpha <= 1.0] * num_layers
    kinds = pattern_types(means, dense_layers)
    frame = _heads_frame(means, kinds, examples, num_layers, num_heads)
    if on_progress is not None:
        on_progress(0.95, "clustering heads")
    atlas = HeadAtlas(
        heads=frame, similarity=similarity, order=cluster_order(similarity),
        coords=head_map(similarity), examples=examples, texts=texts,
        sparsity_hist=sums.sparsity_hist.numpy(), support_hist=sums.support_hist.numpy(),
        meta={**dict(meta or {}), "alpha": alpha, "n_texts": n_texts, "n_rows": int(sums.rows),
              "predictor": predictor.label if predictor is not None else None,
              "predictor_source": predictor.source if predictor is not None else None,
              "length_edges": list(LENGTH_EDGES)})
    if on_progress is not None:
        on_progress(1.0, f"{num_layers * num_heads} heads over {n_texts} texts")
    return atlas


def _heads_frame(means: Mapping[str, torch.Tensor], kinds: list[list[str]],
                 examples: Mapping[str, list[dict]], num_layers: int,
                 num_heads: int) -> pd.DataFrame:
    rows = []
    for layer in range(num_layers):
        for head in range(num_heads):
            first = (examples.get(f"{layer}.{head}") or [{}])[0]
            rows.append({
                "layer": layer, "head": head, "type": kinds[layer][head],
                "type_label": PATTERN_LABELS[kinds[layer][head]],
                **{name: float(value[layer, head]) for name, value in means.items()},
                "typical_text_id": first.get("text_id"), "typical_query": first.get("query"),
            })
    return pd.DataFrame(rows)
