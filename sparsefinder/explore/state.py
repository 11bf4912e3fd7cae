"""The view state a URL reproduces: which method and hyperparameters, what is selected.

Parsed from URL query parameters, never trusted: a bad value falls back to the default with a
message naming the parameter. :func:`to_spec` turns a state into the
:class:`~sparsefinder.methods.spec.PredictorSpec` it stands for — the same value the sweeps use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sparsefinder.evaluation.curves import QUEST_PAGE
from sparsefinder.explore.inputs import DEFAULT_EXAMPLE, list_examples
from sparsefinder.explore.texts import is_text_id
from sparsefinder.methods.registry import METHODS
from sparsefinder.methods.spec import GLOBAL_CHOICES, PredictorSpec
from sparsefinder.metrics.measures import EXTRA_METRICS
from sparsefinder.predictors.hash_codes import HASH_BITS

#: Methods the app's sliders drive (keys of the one registry,
#: ``sparsefinder.methods.spec.METHODS``).
APP_METHODS: tuple[str, ...] = ("distance-budget", "rowfrac-budget", "kmeans-routed-budget",
                                 "distance", "quantization", "kmeans", "hashattention", "quest",
                                 "fixed")
#: Methods driven by a target sparsity (per-head settings calibrated on train graphs).
TARGET_METHODS = frozenset({"rowfrac-budget", "distance-budget", "kmeans-routed-budget"})
DEFAULT_TARGET = 0.9
MAX_BINS = 16
MAX_WINDOW = 31
#: Window sizes worth offering: an even size behaves like the next odd one (Window docs).
WINDOW_CHOICES = (0, *range(1, MAX_WINDOW + 1, 2))
MAX_TOP_K = 8
#: Quest: at most MAX_PAGES pages of QUEST_PAGE keys kept per query.
MAX_PAGES = 64
#: B shown first: mid-range of the paper's grid (2–20), where k-means is neither trivial
#: (B = 2 keeps half the pairs) nor starved.
DEFAULT_CLUSTERS = 8


def method_label(method: str) -> str:
    """The registry's label of an app method, e.g. ``"Distance (t)"``."""
    return METHODS[method].label


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
    #: The best method of the bundled model at its calibrated setting: the highest TRAIN
    #: recall at target 0.90 in the bundled calibration table (`sparsefinder calibrate`
    #: prints it: distance-budget 0.884, rowfrac-budget 0.819, kmeans-routed-budget 0.751).
    method: str = "distance-budget"
    target: float = DEFAULT_TARGET
    t: float | None = None
    bins: int = 4
    clusters: int | None = None  # B; None = the smallest B the projections offer
    top_k: int = 1
    pages: int | None = None  # Quest; None = the pages that hold the text's gold density
    hamming: int = 3  # hashattention: largest Hamming distance of a kept key's code
    window: int = 3
    global_tokens: tuple[str, ...] = GLOBAL_CHOICES
    layer: int = 0
    head: int = 0
    query: int = 1  # the first word: query 0 is [CLS], which global tokens make all-True
    example: str = DEFAULT_EXAMPLE
    text_id: str | None = None
    overview: str = "recall"

    def with_(self, **changes: Any) -> ViewState:
        return replace(self, **changes)


#: Query-parameter names (short, URL-friendly) of each ViewState field.
PARAM_NAMES: dict[str, str] = {
    "model": "model",
    "alpha": "alpha",
    "method": "method",
    "target": "target",
    "t": "t",
    "bins": "beta",
    "clusters": "B",
    "top_k": "k",
    "pages": "pages",
    "hamming": "hd",
    "window": "window",
    "global_tokens": "global",
    "layer": "layer",
    "head": "head",
    "query": "query",
    "example": "example",
    "text_id": "textid",
    "overview": "overview",
}
#: The α range the app offers (1 = softmax, 1.5 = entmax15, 2 = sparsemax).
ALPHA_RANGE = (1.0, 4.0)
#: Metrics the layer × head overview can be coloured by (every metric the Scorer gives).
OVERVIEW_METRICS = ("recall", "sparsity", *EXTRA_METRICS)
MAX_MODEL_NAME = 300


def _parse_int(text: str, low: int, high: int | None) -> int:
    value = int(float(text))
    if value < low or (high is not None and value > high):
        raise ValueError(f"{value} is outside [{low}, {high if high is not None else '∞'}]")
    return value


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
        "model": _parse_model,
        "alpha": _parse_alpha,
        "method": lambda s: s if s in APP_METHODS else _bad(f"one of {', '.join(APP_METHODS)}"),
        "target": _parse_target,
        "t": lambda s: _finite_nonneg(float(s)),
        "bins": lambda s: _parse_int(s, 1, MAX_BINS),
        "clusters": lambda s: _parse_int(s, 1, None),
        "top_k": lambda s: _parse_int(s, 1, None),
        "pages": lambda s: _parse_int(s, 1, MAX_PAGES),
        "hamming": lambda s: _parse_int(s, 0, HASH_BITS),
        "window": lambda s: _parse_int(s, 0, MAX_WINDOW),
        "global_tokens": _parse_global,
        "layer": lambda s: _parse_int(s, 0, None),
        "head": lambda s: _parse_int(s, 0, None),
        "query": lambda s: _parse_int(s, 0, None),
        "example": lambda s: s if s in list_examples() else _bad("a bundled example name"),
        "text_id": lambda s: s if is_text_id(s) else _bad("16 hex digits (a text's name)"),
        "overview": lambda s: s if s in OVERVIEW_METRICS else _bad(
            f"one of {', '.join(OVERVIEW_METRICS)}"),
    }
    for name, parse in parsers.items():
        text = raw(name)
        if text is None:
            continue
        try:
            changes[name] = parse(text)
        except (ValueError, TypeError, OverflowError) as error:  # int(inf): OverflowError
            problems.append(f"ignored URL parameter {PARAM_NAMES[name]}={text!r}: {error}")
    return replace(state, **changes), problems


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


def _bad(expected: str) -> Any:
    raise ValueError(f"expected {expected}")


def _parse_target(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or not 0.0 < value < 1.0:
        raise ValueError("expected a target sparsity strictly between 0 and 1")
    return value


def _parse_model(text: str) -> str:
    if not text or len(text) > MAX_MODEL_NAME or any(ord(c) < 32 for c in text):
        raise ValueError(f"expected a model name or path of 1–{MAX_MODEL_NAME} characters")
    return text


def _parse_alpha(text: str) -> float:
    value = float(text)
    low, high = ALPHA_RANGE
    if not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"expected a number in [{low:g}, {high:g}]")
    return value


def _finite_nonneg(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError("expected a finite number >= 0")
    return value


def _parse_global(text: str) -> tuple[str, ...]:
    parts = [p for p in (s.strip() for s in text.split(",")) if p and p != "none"]
    unknown = [p for p in parts if p not in GLOBAL_CHOICES]
    if unknown:
        raise ValueError(f"expected a comma list of {GLOBAL_CHOICES} or 'none'")
    return tuple(c for c in GLOBAL_CHOICES if c in parts)


def snap_window(size: int) -> int:
    """The window choice equivalent to ``size`` (even sizes act like the next odd one)."""
    size = max(0, min(int(size), MAX_WINDOW))
    return size if size == 0 or size % 2 else size + 1


def view_state_to_params(state: ViewState) -> dict[str, str]:
    """ViewState → query parameters (strings); ``None`` fields are left out."""
    out: dict[str, str] = {}
    for name, key in PARAM_NAMES.items():
        value = getattr(state, name)
        if value is None:
            continue
        if name == "global_tokens":
            out[key] = ",".join(value) or "none"
        elif isinstance(value, float):
            out[key] = repr(value)  # shortest text that reads back as the same float
        else:
            out[key] = str(value)
    return out


def to_spec(state: ViewState, method: str | None = None) -> PredictorSpec:
    """The predictor spec the sliders stand for (``method`` overrides ``state.method``, e.g.
    "fixed" when the learned methods cannot run)."""
    method = method or state.method
    params: dict[str, Any] = {}
    if method == "distance":
        params = {"threshold": float(state.t if state.t is not None else 0.0)}
    elif method == "quantization":
        params = {"bins": int(state.bins)}
    elif method in TARGET_METHODS:
        params = {"target_sparsity": float(state.target)}
    elif method == "kmeans":
        if state.clusters is None:
            raise ValueError("k-means needs a number of clusters B; clamp the state first")
        params = {"n_clusters": int(state.clusters), "top_k": int(state.top_k)}
    elif method == "quest":
        if state.pages is None:
            raise ValueError("Quest needs a number of pages; clamp the state first")
        params = {"page_size": QUEST_PAGE, "pages": int(state.pages)}
    elif method == "hashattention":
        params = {"max_distance": int(state.hamming)}
    return PredictorSpec.of(method, params, window=int(state.window),
                            global_tokens=state.global_tokens)


def parse_cluster(value: str | Sequence[str] | None, clusters: int | None = None) -> int | None:
    """The ``cluster`` URL parameter → a cluster id, or None when absent, malformed or (given
    ``clusters`` = B) out of range: a hand-edited URL never raises."""
    if value is not None and not isinstance(value, str):
        value = value[-1] if len(value) else None
    if value is None:
        return None
    try:
        return _parse_int(value.strip(), 0, None if clusters is None else int(clusters) - 1)
    except (ValueError, OverflowError):
        return None
