"""The app's cached resources that never run the model, shared by every session
(``st.cache_resource``; keys are plain values and name everything a result depends on):
texts, projections, calibration, predictions and sweeps of a prepared text, and the bounded
stores of work computed with a progress bar. What runs the model is in :mod:`app.model_runs`.
A slider move never reruns the model.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st
import torch

from app.progress import progress_bar
from sparsefinder.bundle import bundle
from sparsefinder.evaluation.curves import CURVES, curve_display_name
from sparsefinder.explore import corpus as excorpus
from sparsefinder.explore import live, text_parts, texts
from sparsefinder.explore import prepared as prep
from sparsefinder.metrics.measures import GraphScores

#: Calibrated target-sparsity settings; used only for the projections they were fitted for.
#: ``SPARSEFINDER_DEFAULT_CALIBRATION`` names another table (None: the library's rule, the
#: bundle's or the prepared bundle's of the model).
CALIBRATION_PATH = os.environ.get("SPARSEFINDER_DEFAULT_CALIBRATION") or None
DEFAULT_CALIBRATION = Path(CALIBRATION_PATH or bundle().path("calibration"))

# ------------------------------------------------------------------------------------------
# Cached resources (shared by all sessions; keys are plain values)
# ------------------------------------------------------------------------------------------


@st.cache_resource(show_spinner=False)
def text_store() -> texts.TextStore:
    """Custom texts this server has seen, by content hash: links and reloads find them."""
    return texts.TextStore()


@st.cache_resource(max_entries=8, show_spinner=False)
def cached_text_parts(model_id: str, max_length: int, text: str, _tokenizer: Any) -> list:
    """The model-sized parts of a text longer than the model reads (one part when it fits)."""
    return text_parts.text_parts(_tokenizer, text, max_length)


@st.cache_resource(max_entries=4, show_spinner=False)
def cached_projections(path: str, digest: str, model_id: str) -> Any:
    """Loaded projections; ``digest`` (file content hash) keys the cache, not the path."""
    from sparsefinder.projections.heads import HeadProjections

    return HeadProjections.load(path, expected_model_id=model_id)


@st.cache_resource(max_entries=4, show_spinner=False)
def cached_hash_codes(model_id: str, projections_key: str = "none") -> Any:
    """The HashAttention codes learned for this model (bundled, or its prepared bundle's),
    else None; ``projections_key`` changes when a prepared bundle appears, so a bundle
    prepared while the server runs is found."""
    from sparsefinder.projections.hash_code_table import bundled_hash_codes

    return bundled_hash_codes(model_id)


@st.cache_resource(max_entries=4, show_spinner=False)
def cached_calibration(projections_key: str, model_id: str) -> tuple[Any, Any]:
    """The calibrated target-sparsity settings and the projections they read, by the library's
    one rule (:func:`sparsefinder.learned_parts.calibration_for`): the table with the
    projections file it names (the best one, whatever the app's own projections are), or — a
    table naming none — the table when it was fitted for the projections with this digest;
    (None, None) otherwise (the calibrated methods are off)."""
    from sparsefinder.learned_parts import calibration_for

    return calibration_for(model_id, CALIBRATION_PATH, projections_key)


@st.cache_resource(max_entries=16, show_spinner=False)
def cached_predictions(cache_key: tuple, spec_key: tuple, _spec: Any,
                       _prepared: prep.PreparedText) -> tuple[list[torch.Tensor], GraphScores]:
    """Masks and scores of one setting on one prepared text, shared by every session: ten
    users on the same link and sliders cost one prediction (``spec_key`` = ``_spec.key``)."""
    preds = live.predict(_prepared, _spec)
    return preds, live.score(_prepared, preds)


def text_curve_names(methods: Sequence[str], prepared: prep.PreparedText) -> list[str]:
    """Every curve the current text can be swept on: the sweepable ``methods``, then the
    calibration table's curves and the hash codes' curve where the text has them."""
    parts = calibrated(prepared)
    return excorpus.text_curves(methods, parts.get("calibration"), parts.get("hash_codes"))


def text_sweep(cache_key: tuple, curves: Sequence[str], prepared: prep.PreparedText,
               first: Sequence[str] = ()) -> pd.DataFrame:
    """Sparsity–recall of every grid point of ``curves`` on the current text, rows in the
    order of ``curves``.

    Each curve is swept once per text and kept in a store shared by sessions, so a page that
    draws a few curves sweeps only those (those named in ``first`` before the others), adding
    a group sweeps only its curves, and the bar says which curve runs and how long is left.
    """
    store = shared_store("text_sweep", 256)
    frames = {curve: store.get((cache_key, curve)) for curve in curves}
    rank = {curve: index for index, curve in enumerate(first)}
    missing = sorted((curve for curve, frame in frames.items() if frame is None),
                     key=lambda curve: rank.get(curve, len(rank)))
    if missing:
        weights = [max(len(CURVES[c].specs), 1) if c in CURVES else 1 for c in missing]
        with progress_bar("Sweeping this text") as bar:
            report, done = bar.stage(), 0
            for index, (curve, weight) in enumerate(zip(missing, weights, strict=True)):
                report(done / sum(weights), f"{curve_display_name(curve)} "
                                            f"({index + 1} of {len(missing)} curves)")
                frame = excorpus.sweep_curve([prepared.record], prepared.projections, curve,
                                             **calibrated(prepared))
                store.put((cache_key, curve), frame)
                frames[curve] = frame
                done += weight
    parts = [frames[c] for c in curves if len(frames[c])]
    if not parts:
        raise ValueError("no curve can run on this text with these parts")
    frame = pd.concat(parts, ignore_index=True)
    frame.attrs = dict(parts[0].attrs)
    return frame


def calibrated(prepared: prep.PreparedText) -> dict[str, Any]:
    """The calibration table of a prepared text and the projections its methods read, and the
    bundled hash codes: the sweeps add their curves (the app has no train graphs to fit
    them)."""
    table = prepared.calibration
    learned = {"hash_codes": prepared.hash_codes} if prepared.hash_codes is not None else {}
    if table is None or not table.params:
        return learned
    return {"calibration": table,
            "calibration_projections": prepared.projections_for(table.methods()[0]),
            **learned}


class SharedStore:
    """A bounded store shared by every session (oldest out): for results computed with a
    progress bar, which a cached function must not draw. Sessions run on threads, so every
    read and write holds the store's own lock."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items

    def get(self, key: Hashable) -> Any:
        with self._lock:
            return self._items.get(key)

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)


@st.cache_resource(show_spinner=False)
def shared_store(name: str, max_entries: int) -> SharedStore:
    """The process-wide store ``name`` (one per name: a key of one never meets another's)."""
    return SharedStore(max_entries)


def clear_caches() -> None:
    """Forget every cached model and text (tests; a fresh start)."""
    st.cache_resource.clear()

