"""Every model run of the app, through ONE door: :func:`model_run`.

All sessions share one model object per name (:func:`cached_model` is ``st.cache_resource``)
and its α is a setting of that object (``set_alpha``), so a run must set α and keep every
other session's run out until it is done: ``with model_run(name, alpha) as loaded:`` takes
the process-wide lock, sets α and hands out the model. Every function here that runs the
model does so inside that block, and keys its cache by everything its result depends on
(name, α, text or passages, projections digest); ``tests/app/test_model_runs.py`` checks
that no code in ``app/`` runs a model any other way.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pandas as pd
import streamlit as st

from app.caches import cached_calibration, cached_hash_codes, calibrated, shared_store
from app.context import AppContext
from app.progress import progress_bar
from sparsefinder.data.records import AttentionRecord
from sparsefinder.explore import corpus as excorpus
from sparsefinder.explore import inputs
from sparsefinder.explore import prepared as prep
from sparsefinder.models.loading import LoadedModel, load_model, set_alpha

ProgressFn = Callable[[float, str], None]

_LOCK = threading.Lock()  # one model run at a time in this server process
_HELD = threading.local()  # whether this thread is inside model_run (it is not re-entrant)


@st.cache_resource(max_entries=2, show_spinner="Loading the model…")
def cached_model(name: str) -> LoadedModel:
    """One copy per model, whatever α: the attention function reads α at each call, and
    :func:`model_run` sets it before every run. Read its metadata (tokenizer, model_id,
    max_length) anywhere; run it only through :func:`model_run`."""
    return load_model(name, alpha=1.5, device="auto")


@contextlib.contextmanager
def model_run(name: str, alpha: float) -> Iterator[LoadedModel]:
    """The one way the app runs a model: the shared model ``name`` at ``alpha``, with every
    other run (of any session, any α) kept out until the block ends. Not re-entrant: a run
    inside a run would wait for itself, so it raises instead."""
    if getattr(_HELD, "run", None) is not None:
        raise RuntimeError(f"model_run({name!r}, {alpha}) inside model_run{_HELD.run}: take "
                           "the model once and do all the work in that one block")
    loaded = cached_model(name)  # loading is not a run (Streamlit loads each name once)
    with _LOCK:
        _HELD.run = (name, alpha)
        try:
            set_alpha(loaded, alpha)
            yield loaded
        finally:
            _HELD.run = None


@st.cache_resource(max_entries=8, show_spinner=False)
def cached_fingerprint(name: str) -> str:
    """The weight fingerprint of the model ``name``: the folder of its prepared bundle
    (reads sampled weights, no forward pass; inside the door all the same)."""
    from sparsefinder.model_bundles import model_fingerprint

    with model_run(name, 1.5) as loaded:
        return model_fingerprint(loaded)


@st.cache_resource(max_entries=4, show_spinner="Computing gold graphs and projections…")
def cached_prepared(
    name: str, alpha: float, text: str, projections_key: str, _projections: Any
) -> prep.PreparedText:
    """Gold graphs + projected vectors of one text (``projections_key``: the projections'
    digest, which fixes the calibration table too).

    At most 4 texts: a 512-token text holds ~20 MB of gold masks and, once the distance
    method is used, ~66 MB of cached query–key distances.
    """
    with model_run(name, alpha) as loaded:
        record, notes = inputs.extract_one(loaded, text)
        model_id = loaded.model_id
    calibration, own = cached_calibration(projections_key, model_id)
    return prep.prepare(record, _projections, notes, calibration=calibration,
                        calibration_projections=own,
                        hash_codes=cached_hash_codes(model_id, projections_key))


@st.cache_resource(max_entries=64, show_spinner="Running the model on the predicted graph…")
def cached_accuracy(cache_key: tuple, spec_key: tuple, _spec: Any,
                    _prepared: prep.PreparedText) -> Any:
    """Output/embedding cosine of one setting on the text (a restricted forward pass against
    the full-entmax run), shared by sessions; ``spec_key`` = ``_spec.key``; ``cache_key`` the
    :class:`~app.context.CacheKey` of ``_prepared``."""
    from sparsefinder.explore import accuracy

    text = _prepared.record.text
    with model_run(cache_key.model, cache_key.alpha) as loaded:
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
    projections digest), which fixes ``_projections`` and ``_fitted``."""
    from sparsefinder.data.corpus import corpus_texts
    from sparsefinder.explore import accuracy

    name, alpha = model_key[0], model_key[1]
    with model_run(name, alpha) as loaded:
        texts = corpus_texts("default", "validation", loaded.tokenizer, loaded.max_length,
                             TASK_PASSAGES)
        full = _reference(("task", name, alpha, TASK_PASSAGES), loaded, "\n\n".join(texts),
                          texts)
        return accuracy.task_accuracy(loaded, texts, _spec, _projections, full, fitted=_fitted)


@st.cache_resource(max_entries=8, show_spinner=False)
def _reference(cache_key: tuple, _loaded: LoadedModel, text: str,
               _texts: list[str] | None = None) -> Any:
    """The full α-entmax run of the text (or of ``_texts``): the accuracy reference, once.
    Called only inside a :func:`model_run` block of the model and α ``cache_key`` names."""
    from sparsefinder.evaluation.accuracy import encode
    from sparsefinder.explore import accuracy

    if _texts is not None:
        return encode(_loaded.model, _loaded.tokenizer, _texts, max_length=_loaded.max_length)
    return accuracy.reference(_loaded, text)


def text_accuracy_sweep(ctx: AppContext, methods: list[str], compute: bool,
                        extra: Sequence[Any] = ()) -> Any:
    """Sparsity–accuracy points of ``methods`` on the current text (one restricted forward
    per grid point), then of the ``extra`` points (``accuracy_sweep``'s ``ExtraPoint``: the
    current method's calibrated curve), from the store, or computed now with a progress bar;
    None if not yet."""
    from sparsefinder.evaluation.accuracy_sweep import accuracy_sweep

    store = shared_store("text_accuracy", 8)
    key = (*ctx.cache_key, tuple(methods), tuple(e.spec.key for e in extra))
    if key in store or not compute:
        return store.get(key)
    with progress_bar("Accuracy axis") as bar, \
            model_run(ctx.cache_key.model, ctx.cache_key.alpha) as loaded:
        frame = accuracy_sweep(
            loaded, [ctx.prepared.record.text], ctx.prepared.projections, methods,
            model_name=ctx.cache_key.model, extra=extra, on_progress=bar.stage())
    store.put(key, frame)
    return frame


def validation_records(name: str, alpha: float, passages: int,
                       on_progress: ProgressFn | None = None) -> list[AttentionRecord]:
    """Gold graphs of the first ``passages`` validation passages under ``name`` at ``alpha``
    (shared by sessions and pages: Pareto and Clusters read the same records)."""
    store = shared_store("validation_records", 2)
    key = (name, float(alpha), int(passages))
    records = store.get(key)
    if records is not None:
        return records
    with model_run(name, alpha) as loaded:
        records = store.get(key)  # another session may have run it while this one waited
        if records is None:
            records = excorpus.corpus_records(loaded, split="validation",
                                              max_passages=passages, on_progress=on_progress)
            store.put(key, records)
    return records


def corpus_sweep(ctx: AppContext, methods: list[str], passages: int, compute: bool
                 ) -> tuple[list, Any] | None:
    """Validation records and their sweep of ``methods`` for the view's model, α and
    projections: from the store, or computed now with an ``st.progress`` bar when
    ``compute``; None if not computed yet."""
    from sparsefinder.explore.corpus import sweep_records

    store = shared_store("corpus_sweep", 4)
    key = (*ctx.cache_key.model_key, int(passages), tuple(methods))
    if key in store or not compute:
        return store.get(key)
    with progress_bar("Validation corpus") as bar:
        records = validation_records(ctx.cache_key.model, ctx.cache_key.alpha, passages,
                                     bar.stage(0.0, 0.7))
        frame = sweep_records(records, ctx.prepared.projections, methods,
                              on_progress=bar.stage(0.7, 1.0), **calibrated(ctx.prepared))
    store.put(key, (records, frame))
    return records, frame


@st.cache_resource(max_entries=2, show_spinner="Extracting every probe and ranking heads…")
def all_probes(model_key: tuple, _projections: Any) -> tuple[pd.DataFrame, list]:
    """The head ranking over every bundled probe and the prepared probe texts, under the
    model and α of ``model_key`` = (name, α, projections digest; the digest fixes
    ``_projections``)."""
    from sparsefinder.analysis import coref

    name, alpha = model_key[0], model_key[1]
    probes = coref.load_probes()
    records = []
    for probe in probes:  # one run per probe: other sessions' runs get in between
        with model_run(name, alpha) as loaded:
            records.append(inputs.extract_one(loaded, probe.text)[0])
    prepared = [prep.prepare(record, _projections, t_range=False) for record in records]
    return coref.rank_heads(records, probes), prepared


def atlas(name: str, request: Any, on_progress: ProgressFn | None = None) -> tuple[Any, bool]:
    """The head atlas of ``request`` (an ``AtlasRequest``: model id, α, passages) for the
    model ``name``, from this process's store, the disk cache, or computed; and whether it
    was read rather than computed."""
    from sparsefinder.explore import atlas as exatlas

    store = shared_store("atlas", 8)
    found = store.get(request)
    if found is not None:
        return found, True
    with model_run(name, request.alpha) as loaded:
        result = exatlas.atlas_for(loaded, request, on_progress=on_progress)
    store.put(request, result[0])
    return result
