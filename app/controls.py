"""The method controls: the grouped method menu, its calibration, and each family's live
sliders (hand-made for the learned families, generated from the declared parameters for
the baselines), plus window and global tokens.
"""

from __future__ import annotations

import functools
from typing import Any

import streamlit as st

from app.binding import bind, user_change, view_state
from app.context import AppContext
from sparsefinder.explore import app_methods, live
from sparsefinder.explore import prepared as prep
from sparsefinder.explore import state as urlstate


def _method_changed() -> None:
    """A menu entry opens with its own default calibration (and distance with its floor)."""
    user_change(**app_methods.entry_changes(st.session_state["w_method"]))


def _method_control(prepared: prep.PreparedText | None) -> None:
    st.sidebar.selectbox(
        "Method", app_methods.menu_entries(), format_func=app_methods.menu_label,
        help="Predictor families, grouped: Sparsefinder (learned projections), other "
             "predictors, fixed patterns and references on the exact scores (top-k, top-p: they "
             "read the full score matrix; uniform per query, so not bounds). Its "
             "hyperparameters are live sliders on each page; window and global "
             "tokens are added to any method (paper §4.7). SparseBERT's static masks are "
             "fitted on train graphs: compare them on the Pareto page of `sparsefinder sweep`.",
        **{**bind("w_method", "method", lambda _: app_methods.menu_entry(view_state())),
           "on_change": _method_changed, "args": ()},
    )
    offered = app_methods.entry_calibrations(app_methods.menu_entry(view_state()))
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
    generic = app_methods.generic_params(method) if ":" not in method else ()
    col = iter(st.columns(max(columns, len(generic) + 2)))
    if ":" in method:  # a calibrated form: its parameters come from a target
        next(col).select_slider(
            "Target sparsity", options=prepared.calibration.targets,
            format_func=lambda t: f"{t:.2f}",
            help="Per-head settings chosen on TRAIN graphs so that the heads together keep "
                 "this share of pairs out, with the highest mean recall (a sparsity budget).",
            **bind("w_target", "target_sparsity", float, float))
    elif method == "distance":
        next(col).slider(
            "t (distance threshold)", 0.0, float(prepared.t_max),
            step=float(prepared.t_max) / 200, format="%.3f",
            help="Edge iff ‖q′−k′‖ ≤ t in the learned projection space (§4.3).",
            **bind("w_t", "t", float, float))
    elif method == "quantization":
        next(col).slider(
            "β (bins per dimension)", int(urlstate.BINS.low), urlstate.MAX_BINS,
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
                "k (nearest centroids)", int(urlstate.TOP_K.low), top,
                help="Queries and keys join their k nearest centroids; larger k, more edges.",
                **bind("w_top_k", "top_k", lambda k: min(int(k), top), int))
    elif method == "quest":
        next(col).slider(
            f"Quest pages (of {urlstate.QUEST_PAGE} keys) per query", int(urlstate.PAGES.low),
            urlstate.MAX_PAGES,
            help="Keys in pages; each query keeps the pages with the highest upper bound "
                 "Σ_d max(q_d·min_d, q_d·max_d) of its score (Quest, training-free).",
            **bind("w_pages", "pages", int, int))
    elif method == "hashattention":
        next(col).slider(
            "Hamming distance (of 16-bit codes)", int(urlstate.HAMMING.low), urlstate.HASH_BITS,
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
            f"Global: {choice}",  # short: a narrow column (1024 px) cut "… token" off
            help=f"The {choice} token ([CLS] / [SEP]) attends and is attended everywhere.",
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
