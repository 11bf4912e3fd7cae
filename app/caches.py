"""The app's cached resources, shared by every session (``st.cache_resource``; keys are plain
values): the model, gold graphs and projections of a text, predictions, accuracy runs and
sweeps. A slider move never reruns the model.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import streamlit as st
import torch

from app.context import AppContext
from sparsefinder.bundle import bundle
from sparsefinder.explore import corpus as excorpus
from sparsefinder.explore import inputs, live, text_parts, texts
from sparsefinder.explore import prepared as prep
from sparsefinder.metrics.measures import GraphScores
from sparsefinder.models.loading import LoadedModel, load_model, set_alpha

#: Calibrated target-sparsity settings; used only for the projections they were fitted for.
DEFAULT_CALIBRATION = Path(os.environ.get("SPARSEFINDER_DEFAULT_CALIBRATION")
                           or bundle().path("calibration"))

# ------------------------------------------------------------------------------------------
# Cached resources (shared by all sessions; keys are plain values)
# ------------------------------------------------------------------------------------------


@st.cache_resource(max_entries=2, show_spinner="Loading the model…")
def cached_model(name: str) -> LoadedModel:
    """One copy per model, whatever α: the attention function reads α at each call, and
    :func:`cached_prepared` sets it under :func:`model_lock` before running the model."""
    return load_model(name, alpha=1.5, device="auto")


@st.cache_resource(show_spinner=False)
def model_lock() -> threading.Lock:
    """Serialises model runs of all sessions: two forward passes at once would only thrash
    the CPU's cores (and they share one model object, whose α is set per run)."""
    return threading.Lock()


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


@st.cache_resource(max_entries=4, show_spinner="Computing gold graphs and projections…")
def cached_prepared(
    name: str, alpha: float, text: str, projections_key: str, _projections: Any
) -> prep.PreparedText:
    """Gold graphs + projected vectors of one text (the only place the model runs).

    At most 4 texts: a 512-token text holds ~20 MB of gold masks and, once the distance
    method is used, ~66 MB of cached query–key distances.
    """
    loaded = cached_model(name)
    with model_lock():
        set_alpha(loaded, alpha)
        record, notes = inputs.extract_one(loaded, text)
    calibration, own = cached_calibration(projections_key, loaded.model_id)
    return prep.prepare(record, _projections, notes, calibration=calibration,
                        calibration_projections=own,
                        hash_codes=cached_hash_codes(loaded.model_id))


@st.cache_resource(max_entries=4, show_spinner=False)
def cached_hash_codes(model_id: str) -> Any:
    """The bundled HashAttention codes when they were learned for this model, else None."""
    from sparsefinder.projections.hash_code_table import bundled_hash_codes

    return bundled_hash_codes(model_id)


@st.cache_resource(max_entries=4, show_spinner=False)
def cached_calibration(projections_key: str, model_id: str) -> tuple[Any, Any]:
    """The calibrated target-sparsity settings and the projections they read: the bundled
    table with the projections file it names (the best one, whatever the app's own
    projections are), or — a table naming none — the table when it was fitted for the
    projections with this digest; (None, None) otherwise (the calibrated methods are off)."""
    from sparsefinder.calibration.table import CalibrationError, CalibrationTable
    from sparsefinder.projections.heads import ProjectionsError

    if not DEFAULT_CALIBRATION.is_file():
        return None, None
    try:
        table = CalibrationTable.load(DEFAULT_CALIBRATION)
        if table.model_id != model_id:
            return None, None
        if table.projections_file:
            return table, table.own_projections(DEFAULT_CALIBRATION)
        if table.projections_sha256 == projections_key:
            return table, None
    except (CalibrationError, ProjectionsError, OSError):
        pass
    return None, None


@st.cache_resource(max_entries=16, show_spinner=False)
def cached_predictions(cache_key: tuple, spec_key: tuple, _spec: Any,
                       _prepared: prep.PreparedText) -> tuple[list[torch.Tensor], GraphScores]:
    """Masks and scores of one setting on one prepared text, shared by every session: ten
    users on the same link and sliders cost one prediction (``spec_key`` = ``_spec.key``)."""
    preds = live.predict(_prepared, _spec)
    return preds, live.score(_prepared, preds)


@st.cache_resource(max_entries=64, show_spinner="Running the model on the predicted graph…")
def cached_accuracy(cache_key: tuple, spec_key: tuple, _spec: Any,
                    _prepared: prep.PreparedText) -> Any:
    """Output/embedding cosine of one setting on the text (a restricted forward pass against
    the full-entmax run), shared by sessions; ``spec_key`` = ``_spec.key``."""
    from sparsefinder.explore import accuracy

    name, alpha = cache_key.model, cache_key.alpha
    loaded = cached_model(name)
    text = _prepared.record.text
    with model_lock():
        set_alpha(loaded, alpha)
        full = _reference(cache_key, loaded, text)
        return accuracy.setting_accuracy(loaded, text, _spec,
                                         _prepared.projections_for(_spec.method_id), full,
                                         fitted=_prepared.fitted(_spec.method_id))


#: Validation passages of the Explorer's task measure (retrieval agreement).
TASK_PASSAGES = 24


@st.cache_resource(max_entries=32, show_spinner="Retrieval agreement on validation passages…")
def cached_task_accuracy(model_key: tuple, spec_key: tuple, _spec: Any, _projections: Any,
                         _fitted: Any = None) -> Any:
    """Retrieval agreement of a setting on ``TASK_PASSAGES`` validation passages (restricted
    forward passes vs the cached full run), shared by sessions; ``model_key`` = (name, α,
    projections digest)."""
    from sparsefinder.data.corpus import corpus_texts
    from sparsefinder.explore import accuracy

    name, alpha = model_key[0], model_key[1]
    loaded = cached_model(name)
    texts = corpus_texts("default", "validation", loaded.tokenizer, loaded.max_length,
                         TASK_PASSAGES)
    with model_lock():
        set_alpha(loaded, alpha)
        full = _reference(("task", name, alpha), loaded, "\n\n".join(texts), texts)
        return accuracy.task_accuracy(loaded, texts, _spec, _projections, full, fitted=_fitted)


@st.cache_resource(max_entries=8, show_spinner=False)
def _reference(cache_key: tuple, _loaded: LoadedModel, text: str,
               _texts: list[str] | None = None) -> Any:
    """The full α-entmax run of the text (or of ``_texts``): the accuracy reference, once."""
    from sparsefinder.evaluation.accuracy import encode
    from sparsefinder.explore import accuracy

    if _texts is not None:
        return encode(_loaded.model, _loaded.tokenizer, _texts, max_length=_loaded.max_length)
    return accuracy.reference(_loaded, text)


@st.cache_resource(max_entries=8, show_spinner="Sweeping every method on this text…")
def cached_text_sweep(cache_key: tuple, methods: tuple[str, ...],
                      _prepared: prep.PreparedText) -> Any:
    """Sparsity–recall of every grid point of ``methods`` on the current text."""
    return excorpus.sweep_records([_prepared.record], _prepared.projections, list(methods),
                                  **_calibrated(_prepared))


def _calibrated(prepared: prep.PreparedText) -> dict[str, Any]:
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


@st.cache_resource(show_spinner=False)
def _corpus_store() -> dict:
    """Process-wide store of validation-corpus sweeps (computed with a progress bar, which a
    cached function must not draw, so they are stored here by hand)."""
    return {}


def corpus_sweep(key: tuple, loaded: LoadedModel, prepared: prep.PreparedText,
                 methods: list[str], max_passages: int, compute: bool
                 ) -> tuple[list, Any] | None:
    """Validation-split records and sweep for ``key``: from the store, or computed now with
    an ``st.progress`` bar when ``compute``; None if not computed yet."""
    store = _corpus_store()
    full_key = (*key, max_passages, tuple(methods))
    if full_key in store or not compute:
        return store.get(full_key)
    bar = st.progress(0.0, text="Validation corpus: starting…")

    def report(fraction: float, message: str) -> None:
        bar.progress(min(max(fraction, 0.0), 1.0), text=f"Validation corpus: {message}")

    records = excorpus.corpus_records(loaded, split="validation", max_passages=max_passages,
                                   on_progress=lambda f, m: report(0.7 * f, m))
    frame = excorpus.sweep_records(records, prepared.projections, methods,
                                on_progress=lambda f, m: report(0.7 + 0.3 * f, m),
                                **_calibrated(prepared))
    bar.empty()
    if len(store) >= 4:
        store.pop(next(iter(store)))
    store[full_key] = (records, frame)
    return store[full_key]


def text_accuracy_sweep(ctx: AppContext, methods: list[str], compute: bool) -> Any:
    """Sparsity–accuracy points of ``methods`` on the current text (one restricted forward
    per grid point), from the store, or computed now with a progress bar; None if not yet."""
    from sparsefinder.evaluation.accuracy_sweep import accuracy_sweep

    store = _corpus_store()
    key = ("accuracy", *ctx.cache_key, tuple(methods))
    if key in store or not compute:
        return store.get(key)
    bar = st.progress(0.0, text="Accuracy axis: starting…")
    loaded = cached_model(ctx.cache_key.model)
    with model_lock():
        set_alpha(loaded, ctx.cache_key.alpha)
        frame = accuracy_sweep(
            loaded, [ctx.prepared.record.text], ctx.prepared.projections, methods,
            model_name=ctx.cache_key.model,
            on_progress=lambda f, m: bar.progress(min(max(f, 0.0), 1.0),
                                                  text=f"Accuracy axis: {m}"))
    bar.empty()
    if len(store) >= 8:
        store.pop(next(iter(store)))
    store[key] = frame
    return frame


def clear_caches() -> None:
    """Forget every cached model and text (tests; a fresh start)."""
    st.cache_resource.clear()


# ------------------------------------------------------------------------------------------
# View state <-> widgets <-> URL
# ------------------------------------------------------------------------------------------


