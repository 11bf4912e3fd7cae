"""The view state a URL reproduces: which method and hyperparameters, what is selected.

Parsed from URL query parameters, never trusted: a bad value falls back to the default with a
message naming the parameter. :func:`to_spec` turns a state into the
:class:`~sparsefinder.methods.spec.PredictorSpec` it stands for — the same value the sweeps use.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sparsefinder.catalog import BINS, HAMMING, PAGES, TOP_K, WINDOW
from sparsefinder.evaluation.curves import QUEST_PAGE as QUEST_PAGE  # pages and tests read it
from sparsefinder.explore.app_methods import (
    APP_CALIBRATIONS,
    APP_METHODS,
    controls,
    extra_value,
    field_controls,
    generic_params,
    old_method_name,
    pinned_params,
    shown,
)
from sparsefinder.explore.inputs import DEFAULT_EXAMPLE, list_examples
from sparsefinder.explore.texts import is_text_id
from sparsefinder.explore.url_values import ALPHA_RANGE as ALPHA_RANGE  # the app reads them
from sparsefinder.explore.url_values import MAX_MODEL_NAME as MAX_MODEL_NAME
from sparsefinder.explore.url_values import (
    bad,
    parse_alpha,
    parse_global,
    parse_head,
    parse_int,
    parse_model,
    parse_number,
    parse_pairs,
    parse_target,
)
from sparsefinder.methods.registry import CALIBRATION_LABELS, METHODS, display_name, method_id
from sparsefinder.methods.spec import GLOBAL_CHOICES as GLOBAL_CHOICES  # the app reads it
from sparsefinder.methods.spec import PredictorSpec
from sparsefinder.metrics.measures import EXTRA_METRICS

DEFAULT_TARGET = 0.9
#: The app's ranges are the families' declared ones (the catalog's ``Param``: ``low`` and
#: ``app_high``, the slider's useful region), not numbers of its own.
MAX_BINS = int(BINS.app_high)
MAX_WINDOW = int(WINDOW.app_high)
#: Window sizes worth offering: an even size behaves like the next odd one (Window docs).
WINDOW_CHOICES = (0, *range(1, MAX_WINDOW + 1, 2))
MAX_TOP_K = int(TOP_K.app_high)
#: Quest: at most MAX_PAGES pages of QUEST_PAGE keys kept per query.
MAX_PAGES = int(PAGES.app_high)
HASH_BITS = int(HAMMING.app_high)


@dataclass(frozen=True)
class ViewState:
    """Everything a shared URL fixes: model, α, the text, method, its hyperparameters and what
    is selected. (The page is the URL's path, which Streamlit's navigation keeps.)

    ``t=None`` means "the default threshold of this text" (see :func:`default_threshold`),
    because a good distance threshold depends on the scale of the learned projections.
    ``text_id`` names a custom (pasted or uploaded) text (see :mod:`.texts`); None means the
    bundled ``example``.
    """

    model: str = "default"
    alpha: float = 1.5
    #: The method whose restricted model's output is closest to the full model's at the
    #: calibrated setting (validation, sparsity 0.90: output cosine 0.9912 against 0.9897 for
    #: distance:budget, docs/results/quality.md "A per-row floor"): the calibrated distance
    #: threshold with each row's 5 nearest keys, from the bundled calibration table.
    method: str = "distance-floor"
    calibration: str = "budget"
    #: the calibrated forms' target (URL key ``target``; range: ``TARGET_SPARSITY``)
    target_sparsity: float = DEFAULT_TARGET
    #: the fields of the controls that the catalog gives a field of their own (``Control``,
    #: ``app_methods.field_controls``: their link keys are their ``Param``s' ``url``); None: the
    #: text's own first value (``text_ranges``), set by ``live.clamp``
    t: float | None = None
    bins: int | None = None  # quantization β; None = the β closest to the text's gold sparsity
    clusters: int | None = None  # B; None = the B the projections hold nearest the default 8
    top_k: int = 1
    pages: int | None = None  # Quest; None = the pages that hold the text's gold density
    hamming: int = 3  # hashattention: largest Hamming distance of a kept key's code
    window: int = 0  # off by default: a calibrated target is then the sparsity shown
    global_tokens: tuple[str, ...] = ()
    layer: int = 0
    head: int = 0
    query: int = 1  # the first word: query 0 is [CLS], which global tokens make all-True
    example: str = DEFAULT_EXAMPLE
    text_id: str | None = None
    part: int = 0  # which model-sized part of a longer text (see .text_parts)
    overview: str = "recall"
    #: values of the generated controls, ``("family.param", value)`` pairs (sorted); a family
    #: keeps its own (two families' ``n_clusters`` are different numbers)
    extra: tuple[tuple[str, Any], ...] = ()
    #: The Coreference page's own state (its k-means demo setting is not the sidebar
    #: method's): the text ("own" = the sidebar's; None = the bundled probes), the probe, the
    #: chosen pairs as (pronoun, antecedent) spaCy word indices of the sidebar text, B and k,
    #: what the heads are ranked on ("all" probes; None = the text shown) and the head shown
    #: as (layer, head) (None = the best of the ranking; the page writes the head it shows).
    #: None is the page's default, which the link leaves out.
    coref_text: str | None = None
    coref_probe: str | None = None
    coref_pairs: tuple[tuple[int, int], ...] | None = None
    coref_B: int | None = None
    coref_k: int | None = None
    coref_scope: str | None = None
    coref_head: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        # a family the app offers without this calibration gets its default one (switching
        # from calibrated distance to quantization gives raw quantization)
        offered = APP_CALIBRATIONS.get(self.method)
        if offered is not None and self.calibration not in offered:
            object.__setattr__(self, "calibration", offered[0])

    def with_(self, **changes: Any) -> ViewState:
        return replace(self, **changes)

    @property
    def method_id(self) -> str:
        """The family with its calibration as written: ``distance:budget``, ``quest``."""
        return method_id(self.method, self.calibration)


#: Query-parameter names (short, URL-friendly) of each ViewState field.
PARAM_NAMES: dict[str, str] = {
    "model": "model",
    "alpha": "alpha",
    "method": "method",
    "calibration": "calibration",
    "target_sparsity": "target",
    **{control.field: param.url for _, param, control in field_controls()},
    "window": "window",
    "global_tokens": "global",
    "layer": "layer",
    "head": "head",
    "query": "query",
    "example": "example",
    "text_id": "textid",
    "part": "part",
    "overview": "overview",
    "coref_text": "coref",
    "coref_probe": "probe",
    "coref_pairs": "pairs",
    "coref_B": "coref_B",
    "coref_k": "coref_k",
    "coref_scope": "coref_rank",
    "coref_head": "coref_head",
}
#: The Coreference page's text choices (``coref=``); "probes" is the default.
COREF_TEXTS = ("probes", "own")
#: What the Coreference page ranks heads on (``coref_rank=``); "probe" is the default.
COREF_SCOPES = ("probe", "all")
#: Metrics the layer × head overview can be coloured by (every metric the Scorer gives).
OVERVIEW_METRICS = ("recall", "sparsity", *EXTRA_METRICS)
#: What the page shows for each metric (the link keeps the short name).
METRIC_LABELS = {"recall": "recall", "sparsity": "sparsity", "precision": "precision",
                 "exact_fraction": "exact rows", "mass_recall": "mass recall",
                 "block_recall16": "block recall 16", "block_recall64": "block recall 64"}


def parse_view_state(
    params: Mapping[str, str | Sequence[str]], default: ViewState | None = None
) -> tuple[ViewState, list[str]]:
    """URL query parameters → (ViewState, problems).

    A bad or out-of-range value never raises: it falls back to the default and a problem
    message names the parameter, so a hand-edited URL still opens a working view. Bounds that
    depend on the text or model (layer, head, query, B) are checked later by :func:`clamp`.
    """
    state = default or ViewState()
    problems: list[str] = []
    changes: dict[str, Any] = {}

    def raw(field_name: str) -> str | None:
        value = params.get(PARAM_NAMES[field_name])
        if value is None:
            return None
        if not isinstance(value, str):  # st.query_params.get_all style lists
            value = value[-1] if len(value) else ""
        return value.strip()

    parsers: dict[str, Callable[[str], Any]] = {
        "model": parse_model,
        "alpha": parse_alpha,
        "method": lambda s: s if s in APP_METHODS else bad(f"one of {', '.join(APP_METHODS)}"),
        "calibration": lambda s: s if s in CALIBRATION_LABELS else bad(
            f"one of {', '.join(CALIBRATION_LABELS)}"),
        "target_sparsity": parse_target,
        **{control.field: _field_parser(param, control)
           for _, param, control in field_controls()},
        "window": lambda s: parse_int(s, int(WINDOW.low), MAX_WINDOW),
        "global_tokens": parse_global,
        "layer": lambda s: parse_int(s, 0, None),
        "head": lambda s: parse_int(s, 0, None),
        "query": lambda s: parse_int(s, 0, None),
        "example": lambda s: s if s in list_examples() else bad("a bundled example name"),
        "text_id": lambda s: s if is_text_id(s) else bad("16 hex digits (a text's name)"),
        "part": lambda s: parse_int(s, 0, None),
        "overview": lambda s: s if s in OVERVIEW_METRICS else bad(
            f"one of {', '.join(OVERVIEW_METRICS)}"),
        "coref_text": lambda s: (None if s == "probes" else s) if s in COREF_TEXTS else bad(
            f"one of {', '.join(COREF_TEXTS)}"),
        "coref_probe": lambda s: s if re.fullmatch(r"[\w-]{1,40}", s) else bad(
            "a probe id such as p01"),
        "coref_pairs": parse_pairs,
        "coref_B": lambda s: parse_int(s, 1, None),
        "coref_k": lambda s: parse_int(s, 1, MAX_TOP_K),
        "coref_scope": lambda s: (None if s == "probe" else s) if s in COREF_SCOPES else bad(
            f"one of {', '.join(COREF_SCOPES)}"),
        "coref_head": parse_head,
    }
    old = raw("method")
    if old is not None and old not in APP_METHODS:  # an old name, e.g. distance-budget
        problem = old_method_name(old)
        if problem is not None:
            family, calibration = problem[0]
            changes.update(method=family, calibration=calibration)
            problems.append(problem[1])
    for name, parse in parsers.items():
        text = raw(name)
        if text is None or name in changes:
            continue
        try:
            changes[name] = parse(text)
        except (ValueError, TypeError, OverflowError) as error:  # int(inf): OverflowError
            problems.append(f"ignored URL parameter {PARAM_NAMES[name]}={text!r}: {error}")
    if "method" in changes and raw("calibration") is None and "calibration" not in changes:
        # a link naming a method but no calibration (links of the time before calibration
        # was a parameter) meant its raw parameters
        changes["calibration"] = "none"
    method = changes.get("method", state.method)
    calibration = changes.get("calibration", state.calibration)
    offered = APP_CALIBRATIONS[method]
    if calibration not in offered and "calibration" in changes:
        problems.append(f"ignored URL parameter calibration={calibration!r}: the app offers "
                        f"{shown(method)} with calibration {' / '.join(offered)}")
    state = replace(state, **changes)  # a calibration not offered becomes the default one
    if state.calibration == "none":  # the raw parameters of a generated family
        extra = _parse_extra(params, method, problems)
        if extra:
            state = replace(state, extra=tuple(sorted({**dict(state.extra), **extra}.items())))
    return state, problems


def _field_parser(param: Any, control: Any) -> Callable[[str], Any]:
    """The link parser of a control held in a state field: the declared range, and the
    slider's ``app_high`` unless a text hook sets the range (``clamp`` then fits the value to
    the text: k goes up to this text's B)."""
    high = param.high if param.high is not None or control.range else param.app_high
    if param.kind is int:
        return lambda s: parse_int(s, int(param.low or 0), None if high is None else int(high))
    return lambda s: parse_number(s, float(param.low or 0.0), high)


def _parse_extra(params: Mapping[str, Any], family: str,
                 problems: list[str]) -> dict[str, Any]:
    """The generated controls of ``family`` from the link (each parameter's own ``url`` key),
    checked against its declared range and the app's upper bound; a bad value is left out
    with a problem message."""
    values: dict[str, Any] = {}
    for param in generic_params(family):
        text = params.get(param.url)
        if text is None:
            continue
        if not isinstance(text, str):
            text = text[-1] if len(text) else ""
        text = text.strip()
        try:
            param.check(text)
            value = param.kind(float(text))
            if param.app_high is not None and value > param.app_high:
                raise ValueError(f"{param.name} must be at most {param.app_high:g} here")
        except ValueError as error:
            problems.append(f"ignored URL parameter {param.url}={text!r} of {shown(family)}: "
                            f"{error}")
            continue
        values[f"{family}.{param.name}"] = value
    return values


def fixes_message(fixes: Sequence[str], link: bool = True) -> str | None:
    """One message for every setting that was fixed (a bad URL value, or one out of this
    text's range), each on a line of its own; None when nothing was fixed. ``link``: the
    settings came with the link that opened the view (else: the text or model changed)."""
    if not fixes:
        return None
    count = "1 setting" if len(fixes) == 1 else f"{len(fixes)} settings"
    head = (f"This link had {count} that could not be used as given" if link
            else f"{count[0].upper()}{count[1:]} did not fit this text and model")
    return (f"{head}; the view shows what was used instead:\n"
            + "\n".join(f"- {fix}" for fix in fixes))


def snap_window(size: int) -> int:
    """The window choice equivalent to ``size`` (even sizes act like the next odd one)."""
    size = max(0, min(int(size), MAX_WINDOW))
    return size if size == 0 or size % 2 else size + 1


def view_state_to_params(state: ViewState) -> dict[str, str]:
    """ViewState → query parameters (strings); ``None`` fields are left out, and so is the
    bundled example's name while a custom text (``textid``) is shown: it is not what the link
    opens."""
    out: dict[str, str] = {}
    for param in generic_params(state.method) if state.calibration == "none" else ():
        value = extra_value(state, state.method, param)
        out[param.url] = repr(value) if isinstance(value, float) else str(value)
    for name, key in PARAM_NAMES.items():
        value = getattr(state, name)
        if value is None or (name == "example" and state.text_id is not None):
            continue
        if name == "global_tokens":
            out[key] = ",".join(value) or "none"
        elif name == "coref_pairs":
            out[key] = ",".join(f"{i}-{j}" for i, j in value) or "none"
        elif name == "coref_head":
            out[key] = f"L{value[0]}H{value[1]}"
        elif isinstance(value, float):
            out[key] = repr(value)  # shortest text that reads back as the same float
        else:
            out[key] = str(value)
    return out


def to_spec(state: ViewState, method: str | None = None) -> PredictorSpec:
    """The predictor spec the sliders stand for (``method``, a written family with its
    calibration, overrides the state's, e.g. "window" when the learned methods cannot run)."""
    method, _, calibration = (method or state.method_id).partition(":")
    calibration = calibration or "none"
    params: dict[str, Any] = {}
    if calibration != "none":  # the target; any other declared setting at its default
        params = {"target_sparsity": float(state.target_sparsity)}  # (an optional one too,
        params.update({p.name: p.default for p in METHODS[method].variant(calibration).params
                       if p.name not in params  # when its default is a setting, not None)
                       and (not p.optional or p.default is not None)})
    else:  # the raw parameters: each control's value (a pinned one at the app's value)
        params = dict(pinned_params(method))
        for param, control in controls(method):
            value = (getattr(state, control.field) if control.field
                     else extra_value(state, method, param))
            if value is None:
                raise ValueError(f"{display_name(method)} needs a value of {param.name}; "
                                 "clamp the state first")
            params[param.name] = param.kind(value)
    return PredictorSpec.of(method, params, window=int(state.window),
                            global_tokens=state.global_tokens, calibration=calibration)


def parse_cluster(value: str | Sequence[str] | None, clusters: int | None = None) -> int | None:
    """The ``cluster`` URL parameter → a cluster id, or None when absent, malformed or (given
    ``clusters`` = B) out of range: a hand-edited URL never raises."""
    if value is not None and not isinstance(value, str):
        value = value[-1] if len(value) else None
    if value is None:
        return None
    try:
        return parse_int(value.strip(), 0, None if clusters is None else int(clusters) - 1)
    except (ValueError, OverflowError):
        return None
