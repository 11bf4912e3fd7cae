"""The method controls: the grouped method menu, its calibration, and each family's live
sliders (generated from its declared parameters, shown as its catalog entry's ``Control``s
say, with ranges that may depend on the text), plus window and global tokens.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app.binding import _sync, bind, update_view, view_state
from app.context import AppContext
from sparsefinder.explore import app_methods, live, text_ranges
from sparsefinder.explore import prepared as prep
from sparsefinder.explore import state as urlstate


def _method_changed() -> None:
    """A family chosen in the menu opens with its own default calibration."""
    _sync("w_method", "method", None)
    update_view(calibration=app_methods.APP_CALIBRATIONS[view_state().method][0])


def _method_control(prepared: prep.PreparedText | None) -> None:
    st.sidebar.selectbox(
        "Method", [f for names in app_methods.METHOD_GROUPS.values() for f in names],
        format_func=app_methods.menu_label,
        help="Predictor families, grouped: Sparsefinder (learned projections), other "
             "predictors, fixed patterns and references on the exact scores (top-k, top-p: they "
             "read the full score matrix; uniform per query, so not bounds). Its "
             "hyperparameters are live sliders on each page; window and global "
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


def method_sliders(ctx: AppContext, columns: int = 4) -> urlstate.ViewState:
    """Live hyperparameter sliders of the current method plus window / global tokens.

    Call inside an ``st.fragment``: moving one reruns only that fragment. Values are bound to
    the view state (and so to the URL), shared by every page.
    """
    prepared, state = ctx.prepared, view_state()
    method = live.effective_method(state, prepared)
    shown = app_methods.controls(method) if ":" not in method else ()
    col = iter(st.columns(max(columns, len(shown) + 2)))
    if ":" in method:  # a calibrated form: its parameters come from a target
        next(col).select_slider(
            "Target sparsity", options=prepared.calibration.targets,
            format_func=lambda t: f"{t:.2f}",
            help="Per-head settings chosen on TRAIN graphs so that the heads together keep "
                 "this share of pairs out, with the highest mean recall (a sparsity budget).",
            **bind("w_target", "target_sparsity", float, float))
    for param, control in shown:
        _slider(col, prepared, method, param, control)
    next(col).select_slider("Window size", options=urlstate.WINDOW_CHOICES,
                            help="Adds edges |i−j| ≤ size//2 (0 = off).",
                            **bind("w_window", "window", urlstate.snap_window, int))
    box = next(col)
    for choice in urlstate.GLOBAL_CHOICES:
        box.checkbox(
            f"Global: {choice}",  # short: a narrow column (1024 px) cut "… token" off
            help=f"The {choice} token ([CLS] / [SEP]) attends and is attended everywhere.",
            **bind(f"w_global_{choice}", "global_tokens",
                   lambda chosen, c=choice: c in chosen,
                   lambda on, c=choice: _toggle_global(c, on)))
    return view_state()


def _slider(col: Any, prepared: prep.PreparedText, family: str, param: Any,
            control: Any) -> None:
    """A slider generated from a family's declared parameter: its range (or the text's, by
    the control's hook), label and help, bound to its view-state field or the state's
    ``extra`` values, and so to the link. None when its range holds at most one value (k of
    B = 1)."""
    span = text_ranges.text_range(prepared, view_state(), param, control)
    cast = int if param.kind is int else float
    label = control.label or param.label[:1].upper() + param.label[1:]
    words: dict[str, Any] = {"help": control.help or param.help
                             or f"{param.name}: {param.describe()}"}
    if span.options is not None and not span.options:
        return
    if span.options is None:
        low, high = cast(span.low or 0), cast(span.high)
        if high <= low:
            return
        step = span.step or (1 if cast is int else (high - low) / 100)
        words.update(min_value=low + step if param.low_open else low, max_value=high,
                     step=step, **({"format": span.format} if span.format else {}))

    def to_widget(value: Any) -> Any:  # a state value outside the slider: its nearest end
        value = cast(value)
        return value if span.options is not None else min(max(value, words["min_value"]),
                                                           words["max_value"])

    if control.field:
        binding = bind(f"w_{control.field}", control.field, to_widget, cast)
    else:
        binding = bind(f"w_x_{family}_{param.name}", "extra",
                       lambda _extra: to_widget(app_methods.extra_value(
                           view_state(), family, param)),
                       lambda v: app_methods.with_extra(view_state(), family, param.name,
                                                        cast(v)))
    where = next(col)
    if span.options is not None:
        where.select_slider(label, options=list(span.options), **words, **binding)
    else:
        where.slider(label, **words, **binding)


def _toggle_global(choice: str, on: bool) -> tuple[str, ...]:
    chosen = set(view_state().global_tokens) - {choice} | ({choice} if on else set())
    return tuple(c for c in urlstate.GLOBAL_CHOICES if c in chosen)
