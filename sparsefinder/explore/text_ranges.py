"""The text-dependent ranges and first values of the app's sliders, by the names the catalog's
:class:`~sparsefinder.methods.grids.Control` declarations give them.

A control's range is its ``Param``'s (``low`` and ``high``, or the slider's ``app_high``)
unless it names a ``range`` hook: the distance threshold's slider ends at this text's
:attr:`~.prepared.PreparedText.t_max`, k-means' B offers the centroid counts the projections
hold, its k goes up to B. A value left unset (None) opens on the control's ``default`` hook
(the quantization β and the Quest pages nearest the text's gold sparsity), else on the
declared default. :func:`fit` is what :func:`~.live.clamp` does with every control.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparsefinder.explore.app_methods import controls, extra_value, field_controls, with_extra
from sparsefinder.explore.prepared import PreparedText, default_pages, default_threshold
from sparsefinder.explore.state import ViewState


@dataclass(frozen=True)
class TextRange:
    """A slider's range on one text: ``low``/``high`` (None: unbounded), or the ``options``
    a select slider offers; ``step`` and ``format`` where the text sets them too."""

    low: float | None = None
    high: float | None = None
    options: tuple[Any, ...] | None = None
    step: float | None = None
    format: str | None = None


def _distance_quantiles(prepared: PreparedText, state: ViewState, param: Any) -> TextRange:
    # up to a high quantile of this text's projected distances, in 200 steps
    high = float(prepared.t_max)
    return TextRange(float(param.low or 0.0), high, step=high / 200, format="%.3f")


def _centroid_counts(prepared: PreparedText, state: ViewState, param: Any) -> TextRange:
    return TextRange(options=tuple(prepared.cluster_choices))


def _at_most_clusters(prepared: PreparedText, state: ViewState, param: Any) -> TextRange:
    # k of B: at most the slider's useful region, and B (k = B keeps every pair)
    high = param.app_high
    if state.clusters is not None:
        high = min(high, int(state.clusters)) if high is not None else int(state.clusters)
    return TextRange(param.low, high)


#: Range hooks: (prepared text, view state, Param) → the slider's range on that text.
RANGES: dict[str, Callable[[PreparedText, ViewState, Any], TextRange]] = {
    "distance_quantiles": _distance_quantiles,
    "centroid_counts": _centroid_counts,
    "at_most_clusters": _at_most_clusters,
}
#: First-value hooks: (prepared text, Param) → the value a text opens on.
DEFAULTS: dict[str, Callable[[PreparedText, Any], Any]] = {
    "gold_threshold": lambda prepared, param: default_threshold(prepared),
    "gold_bins": lambda prepared, param: prepared.bins_default or param.default,
    "gold_pages": lambda prepared, param: min(default_pages(prepared), int(param.app_high)),
}


def text_range(prepared: PreparedText, state: ViewState, param: Any, control: Any) -> TextRange:
    """The range of a control on this text: its hook's, else the declared one."""
    if control.range:
        return RANGES[control.range](prepared, state, param)
    high = param.high if param.high is not None else param.app_high
    return TextRange(param.low, high)


def _value(state: ViewState, family: str, param: Any, control: Any) -> Any:
    if control.field:
        return getattr(state, control.field)
    return dict(state.extra).get(f"{family}.{param.name}")


def fitted(prepared: PreparedText, state: ViewState, family: str, param: Any,
           control: Any) -> Any:
    """The control's value fitted to this text: an unset one its first value, one outside
    the text's range the nearest inside (None: no value fits, e.g. no centroids)."""
    value = _value(state, family, param, control)
    if value is None:
        value = (DEFAULTS[control.default](prepared, param) if control.default
                 else param.default)
    span = text_range(prepared, state, param, control)
    if span.options is not None:
        if not span.options:
            return _value(state, family, param, control)
        if value not in span.options:
            value = min(span.options, key=lambda option: (abs(option - value), option))
        return value
    if span.high is not None and value > span.high:
        value = span.high
    if span.low is not None and value < span.low:
        value = span.low
    return param.kind(value)


def fit(prepared: PreparedText, state: ViewState) -> dict[str, Any]:
    """The state changes that fit every control to this text: the fields of the paper's
    families (in every link, whatever the method), and the current family's own controls
    that have a text hook."""
    changes: dict[str, Any] = {}
    for family, param, control in field_controls():
        current = ViewState.with_(state, **changes)
        value = fitted(prepared, current, family, param, control)
        if value != getattr(current, control.field):
            changes[control.field] = value
    family = state.method
    for param, control in controls(family):
        if control.field or not (control.range or control.default):
            continue
        current = ViewState.with_(state, **changes)
        value = fitted(prepared, current, family, param, control)
        if value != extra_value(current, family, param) or f"{family}.{param.name}" not in dict(
                current.extra):
            changes["extra"] = with_extra(current, family, param.name, value)
    return changes
