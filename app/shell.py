"""The app's shell: the sidebar (model, α, text, method) and what pages read from it.

``main.py`` calls :func:`build_context` on every full rerun; pages read the result with
:func:`context` and use the names in :data:`__all__`. The jobs live in small modules:
:mod:`app.context` (what a run produces), :mod:`app.binding` (the view state, mirrored to the
link, and widgets bound to it), :mod:`app.caches` (``st.cache_resource``: a slider move never
reruns the model) and :mod:`app.controls` (the method menu and its sliders).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import streamlit as st
import torch

from app import model_choices, own_model
from app.binding import (
    CLUSTER_ANCHOR_KEY,
    CLUSTER_KEY,
    CLUSTER_PARAM,
    FIXES_CLEARED_KEY,
    FIXES_KEY,
    PAIR_KEY,
    PRED_CACHE_KEY,
    VIEW_KEY,
    bind,
    seed,
    selected_cluster,
    set_cluster,
    set_view_state,
    update_view,
    user_change,
    view_state,
)
from app.caches import (
    DEFAULT_CALIBRATION,
    cached_predictions,
    cached_projections,
    cached_text_parts,
    clear_caches,
    shared_store,
    text_curve_names,
    text_store,
    text_sweep,
)
from app.context import CONTEXT_KEY, AppContext, CacheKey, context
from app.controls import _method_control, method_sliders
from app.model_runs import (
    TASK_PASSAGES,
    all_probes,
    atlas,
    cached_accuracy,
    cached_model,
    cached_prepared,
    cached_task_accuracy,
    corpus_sweep,
    model_run,
    text_accuracy_sweep,
    validation_records,
)
from app.text_source import link_text, serving_policy, text_controls
from sparsefinder.bundle import bundle
from sparsefinder.data.records import TextInputError
from sparsefinder.explore import inputs, live, text_parts
from sparsefinder.explore import state as urlstate
from sparsefinder.methods.registry import METHODS
from sparsefinder.metrics.measures import GraphScores
from sparsefinder.models.loading import (
    DEFAULT_MODEL,
    ModelLoadError,
)
from sparsefinder.serving import InputRefused

#: Projections of the bundled model for the raw methods: the bundle's best WITH k-means
#: centroids (k-means and quantization need one space for queries and keys); the calibrated
#: methods read the calibration table's own file, the bundle's best projections. The
#: environment variable points elsewhere (e.g. fresh ones from `sparsefinder train`) without
#: touching the package's assets.
DEFAULT_PROJECTIONS = Path(os.environ.get("SPARSEFINDER_DEFAULT_PROJECTIONS")
                           or bundle().best("centroids"))
UPLOAD_DIR = Path(tempfile.gettempdir()) / "sparsefinder-uploads"  # <digest>/<upload name>


#: What pages use from the shell (defined in the modules above, named here in one place).
__all__ = [
    "CLUSTER_ANCHOR_KEY", "CLUSTER_KEY", "CLUSTER_PARAM", "CONTEXT_KEY", "DEFAULT_CALIBRATION",
    "DEFAULT_PROJECTIONS", "FIXES_CLEARED_KEY", "FIXES_KEY", "PAIR_KEY", "PRED_CACHE_KEY",
    "TASK_PASSAGES", "VIEW_KEY", "AppContext", "CacheKey", "add_fixes", "all_probes", "atlas",
    "bind", "build_context", "cached_accuracy", "cached_model", "cached_predictions",
    "cached_prepared", "cached_projections", "cached_task_accuracy",
    "clear_caches", "context", "corpus_sweep", "method_sliders", "model_run", "predictions",
    "seed", "selected_cluster", "serving_policy", "set_cluster", "set_view_state",
    "shared_store", "show_messages", "text_accuracy_sweep", "text_curve_names", "text_store",
    "text_sweep", "update_view", "user_change", "validation_records", "view_state",
]



# ------------------------------------------------------------------------------------------
# Sidebar
# ------------------------------------------------------------------------------------------


def _device_label(device: torch.device | None) -> str:
    if device is not None and device.type == "cuda":
        return f"CUDA ({torch.cuda.get_device_name(device)})"
    if device is None and torch.cuda.is_available():
        return "CUDA"
    return "CPU"


def _model_controls() -> tuple[str, Path | None, str | None]:
    """Model name and projections file (path, or an upload saved to a temp file); the first
    run takes the model from the URL (a shared link)."""
    linked = view_state().model
    seed("w_model_kind", "default" if linked == DEFAULT_MODEL else "custom")
    kind = st.sidebar.radio(
        "Model", ["default", "custom"], key="w_model_kind", horizontal=True,
        format_func=lambda k: "Bundled (MiniLM-L6, entmax-adapted)" if k == "default" else "Other",
        help="The bundled all-MiniLM-L6-v2 with its entmax adapter runs offline ('Other' → "
             "`default-softmax`: without the adapter); 'Other' takes a Hugging Face id or a "
             "local folder.",
    )
    if kind == "default":
        path = DEFAULT_PROJECTIONS if DEFAULT_PROJECTIONS.exists() else None
        note = None if path else (
            f"Bundled projections ({DEFAULT_PROJECTIONS.name} of the default bundle) are "
            "missing; run `make assets` to train them."
        )
        return DEFAULT_MODEL, path, note
    seed("w_model_name", "" if linked == DEFAULT_MODEL else linked)
    policy = serving_policy()
    cached = [] if policy.exposed else model_choices.cached_hub_models()
    name = st.sidebar.text_input("Model id or folder", key="w_model_name",
                                 placeholder=model_choices.placeholder(cached))
    if policy.exposed:  # served to others: only listed models, no server-side paths
        st.sidebar.caption("Models on this server: "
                           + ", ".join(("default", *policy.allowlist)))
    else:
        st.sidebar.caption(model_choices.caption(cached, model_choices.prepared_names()))
    seed("w_proj_path", "")
    proj_path = "" if policy.exposed else st.sidebar.text_input(
        "Projections file (.pt)", key="w_proj_path",
        placeholder="path to projections.pt (optional)")
    upload = st.sidebar.file_uploader("…or upload projections", type=["pt"], key="w_proj_upload")
    if upload is not None:
        data = upload.getvalue()
        safe = "".join(c for c in Path(upload.name).name if c.isalnum() or c in "._- ")
        target = UPLOAD_DIR / hashlib.sha256(data).hexdigest()[:16] / (safe or "upload.pt")
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return name.strip(), target, None
    if proj_path.strip():
        return name.strip(), Path(proj_path.strip()).expanduser(), None
    return name.strip(), None, (
        "No projections file for this model: the learned methods (distance, quantization, "
        "k-means) are off; window and global patterns and the gold graphs still work."
    )


def build_context() -> AppContext:
    """Draw the sidebar and compute (or fetch from cache) everything pages need."""
    ctx = AppContext()
    st.session_state.pop(FIXES_CLEARED_KEY, None)  # this full run draws the page anew
    first = VIEW_KEY not in st.session_state  # the view comes from the link (URL)
    linked_head = bool({"layer", "head"} & set(st.query_params))  # before the view writes it
    state = view_state()
    fixes = list(st.session_state.pop("_url_problems", []))
    st.sidebar.title("Sparsefinder")
    name, proj_path, ctx.projections_note = _model_controls()
    low, high = urlstate.ALPHA_RANGE
    seed("w_alpha", float(state.alpha))
    alpha = st.sidebar.number_input("α (entmax)", min_value=low, max_value=high, step=0.05,
                                    key="w_alpha", format="%.2f",
                                    help="1 = softmax (dense), 1.5 = entmax15, 2 = sparsemax")
    text, text_error = text_controls(state)
    if text_error is None or not text_error.startswith("This link's text"):
        link_text(text, st.session_state.get("w_source") != "example")
    try:
        if not name:
            raise ModelLoadError("no model given: type a Hugging Face id or a local folder")
        name = serving_policy().check_model_name(name)  # exposed: allowlist only
        ctx.loaded = cached_model(name)
        update_view(model=name, alpha=float(alpha))  # the link names what is shown
    except (ModelLoadError, ValueError) as error:
        ctx.errors.append(f"Model not loaded: {error}")
    except Exception as error:  # e.g. a hub id that is a dataset: never a traceback
        ctx.errors.append(f"Model not loaded: {type(error).__name__}: {error}")
    projections, proj_key = None, "none"
    if ctx.loaded is not None and proj_path is None and name != DEFAULT_MODEL:
        proj_path, ctx.projections_note = own_model.own_projections(name, ctx.projections_note)
    if ctx.loaded is not None and proj_path is not None:
        projections, proj_key = _load_projections(ctx, proj_path)
    if text_error:
        ctx.errors.append(text_error)
    elif ctx.loaded is not None and text is not None:
        text = _text_part(ctx, text, fixes)
        text_hash = hashlib.sha256(text.encode()).hexdigest()
        try:
            try:
                ctx.prepared = cached_prepared(name, float(alpha), text, proj_key, projections)
            except TextInputError:
                raise
            except ValueError as error:  # projections whose shapes do not fit this model
                ctx.projections_note = f"Projections not used: {error}. Learned methods are off."
                ctx.projections_failed = True
                proj_key = "none"
                ctx.prepared = cached_prepared(name, float(alpha), text, proj_key, None)
            ctx.cache_key = CacheKey(name, float(alpha), text_hash, proj_key)
        except TextInputError as error:
            ctx.errors.append(str(error))
    _method_control(ctx.prepared)
    if ctx.prepared is not None:
        clamped, notes = live.clamp(view_state(), ctx.prepared)
        lasting = live.clamp(clamped, ctx.prepared)[1]  # said on every run: not a fix
        fixes.extend(note for note in notes if note not in lasting)
        ctx.notes.extend(lasting)
        set_view_state(clamped)
    if first and ctx.prepared is not None and not linked_head:
        _, scores = predictions(ctx, view_state())  # cached: the page draws the same setting
        layer, head = live.representative_head(scores)
        update_view(layer=layer, head=head)
    ctx.state = view_state()
    _track_fixes(ctx, fixes, link=first)
    device = ctx.loaded.device if ctx.loaded else None
    st.sidebar.caption(f"Device: **{_device_label(device)}**"
                       + (f" · {ctx.loaded.model_id} · adapter: {ctx.loaded.adapter_label()}"
                          if ctx.loaded else ""))
    if ctx.loaded is not None:  # longer texts are truncated, with a note saying so
        st.sidebar.caption(f"The model reads at most **{ctx.loaded.max_length} tokens**.")
    st.session_state[CONTEXT_KEY] = ctx
    return ctx


def _text_part(ctx: AppContext, text: str, fixes: list[str]) -> str:
    """The part of a text longer than the model reads that the view shows (the whole text when
    it fits, or on a long-context model, which reads it in blocks): a sidebar choice, kept in
    the link, and one sentence saying so."""
    loaded = ctx.loaded
    if loaded.max_length > inputs.LONG_EXTRACTION:
        return text
    parts = cached_text_parts(loaded.model_id, loaded.max_length, text, loaded.tokenizer)
    if len(parts) < 2:
        return text
    wanted = view_state().part
    if wanted >= len(parts):
        fixes.append(f"part={wanted} is beyond this text's {len(parts)} parts: showing the "
                     "last part instead.")
        update_view(part=len(parts) - 1)
    st.sidebar.selectbox("Part of the text", range(len(parts)),
                         format_func=lambda i: parts[i].label(len(parts)),
                         help="The model reads a limited number of tokens at a time; a longer "
                              "text is shown in overlapping parts (kept in the link).",
                         **bind("w_part", "part"))
    part = view_state().part
    total = parts[-1].last_token + 1
    ctx.notes.append(text_parts.parts_sentence(parts, part, total, loaded.max_length))
    return parts[part].text


def _track_fixes(ctx: AppContext, fixes: list[str], link: bool) -> None:
    """Show the settings fixed in this run or an earlier one as ONE warning (first among the
    notes), until the view (state, model, text) is no longer the one they were fixed for.
    ``link``: this is the session's first run (the settings came with the link)."""
    shown_for = (ctx.state, ctx.cache_key)
    pending = st.session_state.get(FIXES_KEY)
    if fixes:
        same = pending is not None and pending[1] == shown_for
        earlier, link = (pending[0], pending[2] or link) if same else ([], link)
        pending = ([*earlier, *(f for f in fixes if f not in earlier)], shown_for, link)
        st.session_state[FIXES_KEY] = pending
    elif pending is not None and pending[1] != shown_for:
        st.session_state.pop(FIXES_KEY)
        pending = None
    if pending is not None:
        ctx.notes.insert(0, urlstate.fixes_message(pending[0], link=pending[2]))


def add_fixes(ctx: AppContext, fixes: list[str]) -> None:
    """Settings of the link that a page fixed itself (its own fields) join the link's ONE
    warning; call it before :func:`show_messages` draws the notes."""
    if not fixes:
        return
    pending = st.session_state.get(FIXES_KEY)
    if pending is not None:
        old = urlstate.fixes_message(pending[0], link=pending[2])
        if old in ctx.notes:
            ctx.notes.remove(old)
        st.session_state[FIXES_KEY] = (pending[0], (view_state(), ctx.cache_key), pending[2])
    ctx.state = view_state()
    _track_fixes(ctx, fixes, link=True)


def _load_projections(ctx: AppContext, path: Path) -> tuple[Any, str]:
    """Projections for the loaded model, or (None, "none") with a note saying why not."""
    shown = path.name if UPLOAD_DIR in path.parents else str(path)  # never the temp path
    try:
        serving_policy().check_projections_size(path)  # from its size, before reading it
        data = path.read_bytes()
    except OSError as error:
        ctx.projections_note = (f"Cannot read projections file {shown!r} ({error.strerror}); "
                                "learned methods are off.")
        ctx.projections_failed = True
        return None, "none"
    except InputRefused as error:
        ctx.projections_note = f"Projections not used: {error} Learned methods are off."
        ctx.projections_failed = True
        return None, "none"
    digest = hashlib.sha256(data).hexdigest()
    try:
        projections = cached_projections(str(path), digest, ctx.loaded.model_id)
    except ValueError as error:  # ProjectionsError: wrong model, bad file
        ctx.projections_note = (f"Projections not used: {str(error).replace(str(path), shown)}."
                                " Learned methods are off.")
        ctx.projections_failed = True
        return None, "none"
    return projections, digest


# ------------------------------------------------------------------------------------------
# Helpers for pages
# ------------------------------------------------------------------------------------------


def show_messages(ctx: AppContext) -> bool:
    """Errors and notes at the top of a page; True when the page can draw graphs."""
    for error in ctx.errors:
        st.error(error, icon=":material/error:")
    for note in ctx.notes:
        st.warning(note, icon=":material/warning:")
    if ctx.prepared is not None:
        for note in ctx.prepared.notes:
            st.warning(note, icon=":material/warning:")
    if ctx.projections_note and ctx.projections_failed:
        st.warning(ctx.projections_note, icon=":material/warning:")
    elif ctx.projections_note and METHODS[ctx.state.method].needs_projections:
        st.info(ctx.projections_note, icon=":material/info:")
    if not ctx.ready:
        st.info("Fix the input in the sidebar to see attention graphs; the rest of your "
                "settings are kept.", icon=":material/arrow_back:")
    return ctx.ready


def predictions(ctx: AppContext, state: urlstate.ViewState) -> tuple[list[torch.Tensor],
                                                                     GraphScores]:
    """Predicted masks and scores for ``state`` (``live.predict`` + the prepared scorer: the
    calls a sweep makes). The last result is memoised per session, keyed by the spec, so
    changing layer/head/query (which don't change predictions) costs nothing. The memo holds
    the prepared text itself, not its ``id``: a text evicted from the shared cache may leave
    its id to the next one."""
    spec = live.spec_for(state, ctx.prepared)
    cached = st.session_state.get(PRED_CACHE_KEY)
    if cached is not None and cached[0] is ctx.prepared and cached[1] == spec:
        return cached[2], cached[3]
    preds, scores = cached_predictions(ctx.cache_key, spec.key, spec, ctx.prepared)
    st.session_state[PRED_CACHE_KEY] = (ctx.prepared, spec, preds, scores)
    return preds, scores


