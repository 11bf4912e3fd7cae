"""Warm the shared caches that a first visit to the default link reads, before it comes.

Why: the first screen of a fresh server waited ~7 s for imports (PyTorch, transformers), the
model and the example's gold graphs, all of which start only when a browser connects.
:mod:`app.serve` runs :func:`warm_first_screen` on a thread as the server starts, so that work
overlaps the browser's own start. It calls the very cached functions a session calls, with the
keys :func:`app.shell.build_context` computes for the default link (a test checks that the
first session then computes nothing again), so a session that comes early simply waits on
the same computation (Streamlit holds one lock per cached value).
"""

from __future__ import annotations

import hashlib

from app import shell
from app.caches import cached_predictions, cached_projections, cached_text_parts
from app.context import CacheKey
from app.model_runs import cached_model, cached_prepared
from sparsefinder import runtime
from sparsefinder.explore import inputs, live
from sparsefinder.explore import state as urlstate


def warm_first_screen() -> CacheKey | None:
    """Load the default link's model, projections, gold graphs and first predictions into the
    shared caches; the first screen's :class:`CacheKey`, or None where the bundle has no
    projections (nothing learned to warm)."""
    runtime.tune_cpu_allocator()  # what app.main sets on a session's first run (idempotent)
    runtime.set_torch_threads()
    state, _ = urlstate.parse_view_state({})
    loaded = cached_model(state.model)
    text = inputs.read_example(state.example)
    if loaded.max_length <= inputs.LONG_EXTRACTION:  # the part shown first (shell._text_part)
        parts = cached_text_parts(loaded.model_id, loaded.max_length, text, loaded.tokenizer)
        text = parts[state.part].text if len(parts) > 1 else text
    projections_file = shell.DEFAULT_PROJECTIONS
    if not projections_file.exists():
        return None
    digest = hashlib.sha256(projections_file.read_bytes()).hexdigest()
    projections = cached_projections(str(projections_file), digest, loaded.model_id)
    alpha = float(state.alpha)
    prepared = cached_prepared(state.model, alpha, text, digest, projections)
    key = CacheKey(state.model, alpha, hashlib.sha256(text.encode()).hexdigest(), digest)
    shown, _ = live.clamp(state, prepared)
    spec = live.spec_for(shown, prepared)
    cached_predictions(key, spec.key, spec, prepared)
    return key
