"""The Atlas page's view-model: a cached head atlas per model and corpus, filters, links.

An atlas is computed once per (model, α, corpus, split, passages, predictor) and kept as
``atlas.json`` in the user cache (:func:`cache_dir`: ``$SPARSEFINDER_CACHE_DIR``, else
``$XDG_CACHE_HOME/sparsefinder``, else ``~/.cache/sparsefinder``; below it ``atlas/``), so
the page opens from disk without running the model again.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sparsefinder.analysis.atlas import HeadAtlas, compute_atlas
from sparsefinder.analysis.atlas_io import (
    ATLAS_VERSION,
    AtlasFileError,
    load_atlas,
    save_atlas_json,
)
from sparsefinder.analysis.atlas_predictor import bundled_predictor
from sparsefinder.analysis.atlas_types import PATTERN_LABELS
from sparsefinder.explore.corpus import corpus_records
from sparsefinder.explore.texts import encode_text
from sparsefinder.methods.registry import display_name
from sparsefinder.user_cache import user_cache_dir

ProgressFn = Callable[[float, str], None]

#: Statistics the grid can be coloured by and filters can use: column -> label.
STATISTICS: dict[str, str] = {
    "gold_sparsity": "gold sparsity (mean over texts)",
    "gold_sparsity_q10": "gold sparsity, 10th percentile",
    "gold_sparsity_q90": "gold sparsity, 90th percentile",
    "sparsity_per_100_tokens": "gold sparsity change per 100 tokens",
    "support": "keys kept per row",
    "support_fraction": "share of keys kept per row",
    "entropy": "entropy per row (nats)",
    "distance": "mean attended distance (tokens)",
    "diagonal": "mass on the token itself",
    "previous": "mass on the previous token",
    "next": "mass on the next token",
    "first": "mass on the first token",
    "last": "mass on the last token",
    "punctuation": "mass on punctuation",
    "contiguous": "rows with contiguous support",
    "pred_recall": "predictor recall",
    "pred_mass_recall": "predictor mass recall",
    "pred_exact_fraction": "predictor exact rows",
    "pred_sparsity": "predictor sparsity",
}
_FILTER = re.compile(r"^\s*([a-z0-9_]+)\s*(<=|>=|<|>)\s*(-?[0-9.]+(?:e-?[0-9]+)?)\s*$")


def cache_dir() -> Path:
    """Where computed atlases are kept (see the module docstring)."""
    return user_cache_dir("atlas")


@dataclass(frozen=True)
class AtlasRequest:
    """What an atlas is computed from (its cache key)."""

    model_id: str
    alpha: float
    corpus: str = "default"
    split: str = "validation"
    max_passages: int | None = None

    def key(self, predictor: str | None) -> str:
        raw = json.dumps([ATLAS_VERSION, self.model_id, self.alpha, self.corpus, self.split,
                          self.max_passages, predictor])
        return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:16]


def _cache_path(request: AtlasRequest, predictor: str | None, root: Path | None) -> Path:
    return (root or cache_dir()) / f"{request.key(predictor)}.json"


def cached_atlas(request: AtlasRequest, root: Path | None = None) -> HeadAtlas | None:
    """The cached atlas of ``request`` (None when none was computed yet)."""
    predictor = bundled_predictor(request.model_id)
    path = _cache_path(request, predictor.label if predictor else None, root)
    if not path.is_file():
        return None
    try:
        return load_atlas(path)
    except AtlasFileError:
        return None  # a damaged or old file is recomputed


def atlas_for(loaded: Any, request: AtlasRequest, on_progress: ProgressFn | None = None,
              root: Path | None = None) -> tuple[HeadAtlas, bool]:
    """The atlas of ``request`` from the cache, else computed (gold graphs with progress,
    then the statistics) and cached. Returns (atlas, whether it came from the cache)."""
    predictor = bundled_predictor(request.model_id)
    label = predictor.label if predictor else None
    path = _cache_path(request, label, root)
    if path.is_file():
        try:
            return load_atlas(path), True
        except AtlasFileError:
            pass

    def part(low: float, high: float) -> ProgressFn | None:
        if on_progress is None:
            return None
        return lambda f, m: on_progress(low + (high - low) * f, m)

    records = corpus_records(loaded, request.corpus, request.split, request.max_passages,
                             on_progress=part(0.0, 0.5))
    atlas = compute_atlas(lambda: records, predictor, alpha=loaded.alpha,
                          meta={"model": request.model_id, "corpus": request.corpus,
                                "split": request.split, "max_passages": request.max_passages},
                          total=len(records), on_progress=part(0.5, 1.0))
    save_atlas_json(atlas, path)
    return atlas, False


def parse_filter(text: str | None, columns: list[str]) -> tuple[str, str, float] | None:
    """``"pred_recall<0.7"`` → (column, operator, value); None for empty text. A bad filter
    raises ValueError naming the columns and the form."""
    if not text or not text.strip():
        return None
    match = _FILTER.match(text)
    if not match or match.group(1) not in columns or not math.isfinite(float(match.group(3))):
        raise ValueError(f"filter {text!r} is not 'STATISTIC<VALUE' (or >, <=, >=) with a "
                         f"statistic among {', '.join(columns)}")
    return match.group(1), match.group(2), float(match.group(3))


def filter_mask(heads: pd.DataFrame, rule: tuple[str, str, float] | None) -> pd.Series:
    """Which heads pass a parsed filter (all of them without one)."""
    if rule is None:
        return pd.Series(True, index=heads.index)
    column, op, value = rule
    values = heads[column]
    return {"<": values < value, ">": values > value, "<=": values <= value,
            ">=": values >= value}[op].fillna(False)


def explorer_params(atlas: HeadAtlas, layer: int, head: int, model: str,
                    alpha: float) -> dict[str, str]:
    """Query parameters that open the Explorer on ``(layer, head)`` at its most typical row
    (the text travels as ``textid`` and, when short enough, ``text``)."""
    params = {"model": model, "alpha": repr(float(alpha)), "layer": str(layer),
              "head": str(head)}
    examples = atlas.examples.get(f"{layer}.{head}") or []
    if examples:
        first = examples[0]
        params["query"] = str(first["query"])
        params["textid"] = first["text_id"]
        payload = encode_text(atlas.texts[first["text_id"]])
        if payload is not None:
            params["text"] = payload
    return params


def type_table(atlas: HeadAtlas) -> pd.DataFrame:
    """Heads of each pattern type (rows, readable names) per layer (columns ``L0``…) and in
    all layers (``all``): narrow enough for a column of the page."""
    counts = atlas.type_counts()
    table = counts.T
    table.columns = [f"L{layer}" for layer in counts.index]
    table["all"] = table.sum(axis=1)
    table.index = [PATTERN_LABELS[kind] for kind in table.index]
    return table


def predictor_words(label: str | None) -> str:
    """An atlas's predictor (the spec label it was computed with, e.g.
    ``distance:budget floor=12 target_sparsity=0.9``) in words: the method's display name and
    its settings without underscores; the id stays in heads.csv and the cache key."""
    if not label:
        return "none for this model"
    parts = []
    for piece in label.split(" ∪ "):
        method, _, rest = piece.partition(" ")
        given = {k: v for k, _, v in (kv.partition("=") for kv in rest.split())
                 if v and v not in ("0", "None")}
        try:  # (its floor too: "Distance (t) ∪ nearest keys per row (floor m), …")
            name = display_name(method, given)
        except (KeyError, ValueError):
            name = method
        parts.append(" ".join([name, rest.replace("_", " ").replace("=", " ")]).strip())
    return " ∪ ".join(parts)
