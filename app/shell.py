"""Shared controls and state of the app: sidebar inputs, cached resources, the view state.

``main.py`` calls :func:`build_context` on every full rerun; pages read the result with
:func:`context`. Expensive things are cached with ``st.cache_resource`` (shared, not copied)
per (model, α, text, projections): a slider move never reruns the model.

The view state (method, hyperparameters, layer, head, …) lives in ``st.session_state`` under
``VIEW_KEY`` and is mirrored to ``st.query_params`` so a URL reproduces a view. Widgets get
their initial value from it (``_seed``) instead of ``value=``, so their values survive page
switches (Streamlit forgets the state of widgets a page did not draw).
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import streamlit as st
import torch

from sparsefinder.bundle import bundle
from sparsefinder.data.records import TextInputError
from sparsefinder.explore import app_methods, inputs, live, texts
from sparsefinder.explore import corpus as excorpus
from sparsefinder.explore import prepared as prep
from sparsefinder.explore import state as urlstate
from sparsefinder.methods.registry import METHODS
from sparsefinder.metrics.measures import GraphScores
from sparsefinder.models.loading import (
    DEFAULT_MODEL,
    LoadedModel,
    ModelLoadError,
    load_model,
    set_alpha,
)
from sparsefinder.serving import InputRefused, ServingPolicy

#: Projections of the bundled model for the raw methods: the bundle's best WITH k-means
#: centroids (k-means and quantization need one space for queries and keys); the calibrated
#: methods read the calibration table's own file, the bundle's best projections. The
#: environment variable points elsewhere (e.g. fresh ones from `sparsefinder train`) without
#: touching the package's assets.
DEFAULT_PROJECTIONS = Path(os.environ.get("SPARSEFINDER_DEFAULT_PROJECTIONS")
                           or bundle().best("centroids"))
#: Calibrated target-sparsity settings; used only for the projections they were fitted for.
DEFAULT_CALIBRATION = Path(os.environ.get("SPARSEFINDER_DEFAULT_CALIBRATION")
                           or bundle().path("calibration"))
VIEW_KEY = "_view"
CONTEXT_KEY = "_context"
PRED_CACHE_KEY = "_predictions"
CLUSTER_KEY = "_cluster"  # the k-means cluster picked on the Clusters page (None: none)
CLUSTER_ANCHOR_KEY = "_cluster_for"  # (model, text hash, layer, head) it was picked on
CLUSTER_PARAM = "cluster"
PAIR_KEY = "_pair"  # (layer, head, query, key) picked on Learned space; the Explorer rings it
#: The settings of a link that were fixed, and the (view state, cache key) they were fixed
#: for: one warning, shown until the user changes something.
FIXES_KEY = "_fixes"
FIXES_CLEARED_KEY = "_fixes_cleared"  # a fragment's widget cleared them: rerun the page
TEXT_PARAM = "text"  # a short custom text itself, compressed (see explore.texts)
UPLOAD_DIR = Path(tempfile.gettempdir()) / "sparsefinder-uploads"  # <digest>/<upload name>


def serving_policy() -> ServingPolicy:
    """What this server accepts: exposed (allowlist only) unless bound to a loopback address."""
    return ServingPolicy.from_env(st.get_option("server.address"))



class CacheKey(NamedTuple):
    """What every cache derived from the current text is keyed by (a plain tuple underneath,
    so Streamlit hashes it as before); named, so no page slices it by position."""

    model: str
    alpha: float
    text_hash: str
    projections: str  # the projections file's digest, or "none"

    @property
    def model_alpha(self) -> tuple[str, float]:
        return (self.model, self.alpha)

    @property
    def model_key(self) -> tuple[str, float, str]:
        """Model, α and projections: caches that do not depend on the text."""
        return (self.model, self.alpha, self.projections)

@dataclass
class AppContext:
    """What the sidebar produced in this run; pages draw from it (never from widgets)."""

    loaded: LoadedModel | None = None
    prepared: prep.PreparedText | None = None
    state: urlstate.ViewState = field(default_factory=urlstate.ViewState)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    projections_note: str | None = None
    projections_failed: bool = False  # a file was given but cannot be used (vs. none given)
    cache_key: CacheKey | None = None  # keys every cache derived from the current text

    @property
    def ready(self) -> bool:
        return self.loaded is not None and self.prepared is not None


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


def view_state() -> urlstate.ViewState:
    """The current view state: session first, else the URL (first visit / shared link)."""
    if VIEW_KEY not in st.session_state:
        state, problems = urlstate.parse_view_state(st.query_params.to_dict())
        st.session_state[VIEW_KEY] = state
        st.session_state["_url_problems"] = problems
    return st.session_state[VIEW_KEY]


def set_view_state(state: urlstate.ViewState) -> None:
    """Store the state and mirror it into the URL (only changed parameters are written)."""
    st.session_state[VIEW_KEY] = state
    params = urlstate.view_state_to_params(state)
    current = st.query_params.to_dict()
    changed = {k: v for k, v in params.items() if current.get(k) != v}
    if changed:
        st.query_params.update(changed)
    for key in set(urlstate.PARAM_NAMES.values()) - set(params):
        if key in current:  # e.g. textid after switching back to an example
            del st.query_params[key]


def update_view(**changes: Any) -> urlstate.ViewState:
    state = replace(view_state(), **changes)
    set_view_state(state)
    return state


def _cluster_anchor() -> tuple | None:
    """What a picked cluster belongs to: (model, text, layer, head) of the current view; None
    while no text is ready."""
    key = context().cache_key
    state = view_state()
    return None if key is None else (key.model, key.text_hash, state.layer, state.head)


def selected_cluster() -> int | None:
    """The k-means cluster picked on the Clusters page (shared by pages): session first, else
    the URL's ``cluster``; the URL is kept in step (a page switch may drop it). A cluster is
    one head's on one text: it is forgotten once the text, model, layer or head changes."""
    if CLUSTER_KEY not in st.session_state:
        st.session_state[CLUSTER_KEY] = urlstate.parse_cluster(st.query_params.get(CLUSTER_PARAM))
        st.session_state[CLUSTER_ANCHOR_KEY] = _cluster_anchor()
    cluster = st.session_state[CLUSTER_KEY]
    if cluster is None:
        return None
    anchor, now = st.session_state.get(CLUSTER_ANCHOR_KEY), _cluster_anchor()
    if anchor is None:  # picked (or linked) before the text was ready: it is this view's
        st.session_state[CLUSTER_ANCHOR_KEY] = anchor = now
    if now is not None and anchor != now:
        set_cluster(None)
        return None
    if st.query_params.get(CLUSTER_PARAM) != str(cluster):
        st.query_params[CLUSTER_PARAM] = str(cluster)
    return cluster


def set_cluster(cluster: int | None) -> None:
    """Select (or with None clear) the shared cluster, mirrored into the URL; a selection
    belongs to the current model, text, layer and head."""
    st.session_state[CLUSTER_KEY] = None if cluster is None else int(cluster)
    st.session_state[CLUSTER_ANCHOR_KEY] = None if cluster is None else _cluster_anchor()
    if cluster is None:
        if CLUSTER_PARAM in st.query_params:
            del st.query_params[CLUSTER_PARAM]
    elif st.query_params.get(CLUSTER_PARAM) != str(int(cluster)):
        st.query_params[CLUSTER_PARAM] = str(int(cluster))


def seed(key: str, value: Any) -> None:
    """Give a widget that is drawn on every run (sidebar) its starting value once, without
    ``value=`` (avoids the double-set warning and keeps what the user chose)."""
    if key not in st.session_state:
        st.session_state[key] = value


def bind(key: str, field_name: str, to_widget: Any = None, from_widget: Any = None) -> dict:
    """Two-way bind a page widget to a ViewState field: returns ``key``/``on_change`` kwargs.

    The widget value is set from the view state before every draw, and a change writes back
    through ``on_change`` (callbacks run before the script). Page widgets need this rather
    than :func:`seed`: Streamlit drops a widget's state on a page switch, the view state and
    URL keep it.
    """
    if st.session_state.pop(FIXES_CLEARED_KEY, False):
        # A widget of a fragment cleared the link's warning, drawn above the fragment: the
        # whole page is drawn again without it (a full run pops the flag first, see
        # build_context, and so never gets here).
        st.rerun(scope="app")
    value = getattr(view_state(), field_name)
    st.session_state[key] = to_widget(value) if to_widget else value
    return {"key": key, "on_change": _sync, "args": (key, field_name, from_widget)}


def _sync(key: str, field_name: str, from_widget: Any) -> None:
    if st.session_state.pop(FIXES_KEY, None) is not None:  # the user changed something
        st.session_state[FIXES_CLEARED_KEY] = True
    value = st.session_state[key]
    update_view(**{field_name: from_widget(value) if from_widget else value})


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
    name = st.sidebar.text_input("Model id or folder", key="w_model_name",
                                 placeholder="e.g. bert-base-uncased or /path/to/model")
    if policy.exposed:  # served to others: only listed models, no server-side paths
        st.sidebar.caption("Models on this server: "
                           + ", ".join(("default", *policy.allowlist)))
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


PASTED_KEY = "_pasted_text"  # the last pasted text: survives mode and page switches


def _linked_text(state: urlstate.ViewState) -> tuple[str | None, str | None]:
    """The custom text a link names (``textid`` + ``text``), or (None, why not)."""
    payload = st.query_params.get(TEXT_PARAM)
    try:
        return texts.resolve_text(state.text_id, payload, text_store()), None
    except texts.TextLinkError as error:
        return None, f"This link's text: {error}"


def _text_controls(state: urlstate.ViewState) -> tuple[str | None, str | None]:
    """The text to analyse, or (None, error message). Pasted text is kept in the session
    (``PASTED_KEY``), the server's text store and the link, so switching modes or pages,
    or reloading, never loses it."""
    if PASTED_KEY not in st.session_state and state.text_id is not None:
        linked, problem = _linked_text(state)
        if linked is None:
            return None, problem
        st.session_state[PASTED_KEY] = linked
        seed("w_source", "paste")
    seed("w_source", "example")
    source = st.sidebar.radio(
        "Text", ["example", "paste", "upload"], key="w_source", horizontal=True,
        format_func={"example": "Example", "paste": "Paste", "upload": "Upload"}.get,
    )
    if source == "example":
        example = st.sidebar.selectbox("Example text", inputs.list_examples(),
                                       **bind("w_example", "example"))
        return inputs.read_example(example), None
    if source == "paste":
        seed("w_paste", st.session_state.get(PASTED_KEY) or inputs.read_example(state.example))
        text = st.sidebar.text_area("Paste a text", key="w_paste", height=180)
        st.session_state[PASTED_KEY] = text
        if not text.strip():
            return None, "The text is empty: paste or type some text (one word or more)."
        try:
            return serving_policy().check_text(text), None
        except InputRefused as error:
            return None, str(error)
    upload = st.sidebar.file_uploader("Upload a .txt file (UTF-8)", type=["txt"],
                                      key="w_text_upload")
    if upload is None:
        return None, "No file uploaded yet: choose a .txt file, or pick an example."
    try:
        serving_policy().check_text_bytes(upload.size, upload.name)
        text = serving_policy().check_text(inputs.decode_upload(upload.getvalue(), upload.name))
    except (TextInputError, InputRefused) as error:
        return None, str(error)
    if not text.strip():
        return None, f"{upload.name} is empty: upload a file with some text."
    return text, None


def _link_text(text: str | None, custom: bool) -> None:
    """Name the analysed text in the view state and the link: a bundled example by its name
    (already bound), a custom text by ``textid`` plus, when short, the text itself."""
    if not custom or text is None:
        update_view(text_id=None)
        if TEXT_PARAM in st.query_params:
            del st.query_params[TEXT_PARAM]
        return
    key = text_store().put(text)
    update_view(text_id=key)
    payload = texts.encode_text(text)
    if payload is None:
        if TEXT_PARAM in st.query_params:
            del st.query_params[TEXT_PARAM]
    elif st.query_params.get(TEXT_PARAM) != payload:
        st.query_params[TEXT_PARAM] = payload


def _method_changed() -> None:
    """A family chosen in the menu opens with its own default calibration."""
    _sync("w_method", "method", None)
    update_view(calibration=app_methods.APP_CALIBRATIONS[view_state().method][0])


def _method_control(prepared: prep.PreparedText | None) -> None:
    st.sidebar.selectbox(
        "Method", [f for names in app_methods.METHOD_GROUPS.values() for f in names],
        format_func=app_methods.menu_label,
        help="Predictor families, grouped: Sparsefinder (learned projections), other "
             "predictors, fixed patterns and oracles (bounds that need the full score "
             "matrix). Its hyperparameters are live sliders on each page; window and global "
             "tokens are added to any method (paper §4.7). SparseBERT's static masks are "
             "fitted on train graphs: compare them on the Pareto page of `sparsefinder sweep`.",
        **{**bind("w_method", "method"), "on_change": _method_changed, "args": ()},
    )
    offered = app_methods.APP_CALIBRATIONS[view_state().method]
    if len(offered) > 1:
        st.sidebar.radio(
            "Calibration", list(offered), format_func=app_methods.calibration_label,
            help="How the method's parameters are set: raw (your slider value for every "
                 "head) or per head from a target sparsity, chosen on TRAIN graphs so that "
                 "the heads share the budget with the highest mean recall.",
            **bind("w_calibration", "calibration",
                   lambda c: c if c in offered else offered[0], str))
    elif offered[0] != "none":
        st.sidebar.caption(f"Calibration: {app_methods.calibration_label(offered[0])}.")


def build_context() -> AppContext:
    """Draw the sidebar and compute (or fetch from cache) everything pages need."""
    ctx = AppContext()
    st.session_state.pop(FIXES_CLEARED_KEY, None)  # this full run draws the page anew
    first = VIEW_KEY not in st.session_state  # the view comes from the link (URL)
    state = view_state()
    fixes = list(st.session_state.pop("_url_problems", []))
    st.sidebar.title("Sparsefinder")
    name, proj_path, ctx.projections_note = _model_controls()
    low, high = urlstate.ALPHA_RANGE
    seed("w_alpha", float(state.alpha))
    alpha = st.sidebar.number_input("α (entmax)", min_value=low, max_value=high, step=0.05,
                                    key="w_alpha", format="%.2f",
                                    help="1 = softmax (dense), 1.5 = entmax15, 2 = sparsemax")
    text, text_error = _text_controls(state)
    if text_error is None or not text_error.startswith("This link's text"):
        _link_text(text, st.session_state.get("w_source") != "example")
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
    if ctx.loaded is not None and proj_path is not None:
        projections, proj_key = _load_projections(ctx, proj_path)
    if text_error:
        ctx.errors.append(text_error)
    elif ctx.loaded is not None and text is not None:
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


def context() -> AppContext:
    """The context of the last full run (pages and their fragments read it)."""
    return st.session_state.get(CONTEXT_KEY) or AppContext(errors=["The app is starting."])


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
    changing layer/head/query (which don't change predictions) costs nothing."""
    spec = live.spec_for(state, ctx.prepared)
    key = (id(ctx.prepared), spec)
    cached = st.session_state.get(PRED_CACHE_KEY)
    if cached is not None and cached[0] == key:
        return cached[1], cached[2]
    preds, scores = cached_predictions(ctx.cache_key, spec.key, spec, ctx.prepared)
    st.session_state[PRED_CACHE_KEY] = (key, preds, scores)
    return preds, scores


def method_sliders(ctx: AppContext, columns: int = 4) -> urlstate.ViewState:
    """Live hyperparameter sliders of the current method plus window / global tokens.

    Call inside an ``st.fragment``: moving one reruns only that fragment. Values are bound to
    the view state (and so to the URL), shared by every page.
    """
    prepared, state = ctx.prepared, view_state()
    method = live.effective_method(state, prepared)
    generic = app_methods.generic_params(method) if ":" not in method else ()
    col = iter(st.columns(max(columns, len(generic) + 2)))
    if ":" in method:  # a calibrated form: its parameters come from a target
        next(col).select_slider(
            "Target sparsity", options=prepared.calibration.targets,
            format_func=lambda t: f"{t:.2f}",
            help="Per-head settings chosen on TRAIN graphs so that the heads together keep "
                 "this share of pairs out, with the highest mean recall (a sparsity budget).",
            **bind("w_target", "target", float, float))
    elif method == "distance":
        next(col).slider(
            "t (distance threshold)", 0.0, float(prepared.t_max),
            step=float(prepared.t_max) / 200, format="%.3f",
            help="Edge iff ‖q′−k′‖ ≤ t in the learned projection space (§4.3).",
            **bind("w_t", "t", float, float))
    elif method == "quantization":
        next(col).slider(
            "β (bins per dimension)", 1, urlstate.MAX_BINS,
            help="Each projected dimension cut into β equal-population bins (§4.4).",
            **bind("w_bins", "bins", int, int))
    elif method == "kmeans":
        next(col).select_slider(
            "B (clusters)", options=prepared.cluster_choices,
            help="Number of k-means centroids learned offline per head (§4.5).",
            **bind("w_clusters", "clusters", int, int))
        top = min(urlstate.MAX_TOP_K, int(view_state().clusters))
        if top > 1:
            next(col).slider(
                "k (nearest centroids)", 1, top,
                help="Queries and keys join their k nearest centroids; larger k, more edges.",
                **bind("w_top_k", "top_k", lambda k: min(int(k), top), int))
    elif method == "quest":
        next(col).slider(
            f"Quest pages (of {urlstate.QUEST_PAGE} keys) per query", 1, urlstate.MAX_PAGES,
            help="Keys in pages; each query keeps the pages with the highest upper bound "
                 "Σ_d max(q_d·min_d, q_d·max_d) of its score (Quest, training-free).",
            **bind("w_pages", "pages", int, int))
    elif method == "hashattention":
        next(col).slider(
            "Hamming distance (of 16-bit codes)", 0, urlstate.HASH_BITS,
            help="Each query keeps the keys whose learned binary code differs from its own "
                 "in at most this many bits (HashAttention-style codes, learned on TRAIN "
                 "gold graphs; bundled for the default model).",
            **bind("w_hamming", "hamming", int, int))
    for param in generic:
        _generic_slider(next(col), method, param)
    next(col).select_slider("Window size", options=urlstate.WINDOW_CHOICES,
                            help="Adds edges |i−j| ≤ size//2 (0 = off).",
                            **bind("w_window", "window", urlstate.snap_window, int))
    box = next(col)
    for choice in urlstate.GLOBAL_CHOICES:
        box.checkbox(
            f"Global: {choice} token",
            help="That token ([CLS] / [SEP]) attends and is attended everywhere.",
            **bind(f"w_global_{choice}", "global_tokens",
                   lambda chosen, c=choice: c in chosen,
                   lambda on, c=choice: _toggle_global(c, on)))
    return view_state()


def _generic_slider(where: Any, family: str, param: Any) -> None:
    """A slider generated from a family's declared parameter (its range, label and help),
    bound to the view state's ``extra`` values and so to the link."""
    high = param.high if param.high is not None else param.app_high
    low = float(param.low or 0.0)
    value_of = functools.partial(app_methods.extra_value, family=family, param=param)
    if param.kind is int:
        kwargs: dict[str, Any] = {"min_value": int(low), "max_value": int(high), "step": 1}
        cast = int
    else:
        step = (float(high) - low) / 100
        kwargs = {"min_value": low + step if param.low_open else low,
                  "max_value": float(high), "step": step}
        cast = float
    where.slider(
        param.label[:1].upper() + param.label[1:],
        help=param.help or f"{param.name}: {param.describe()}", **kwargs,
        **bind(f"w_x_{family}_{param.name}", "extra",
               lambda _extra: value_of(view_state()),
               lambda v: app_methods.with_extra(view_state(), family, param.name, cast(v))))


def _toggle_global(choice: str, on: bool) -> tuple[str, ...]:
    chosen = set(view_state().global_tokens) - {choice} | ({choice} if on else set())
    return tuple(c for c in urlstate.GLOBAL_CHOICES if c in chosen)
