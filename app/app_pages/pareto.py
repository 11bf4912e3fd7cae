"""Pareto: sparsity–recall curves, a curated few by default, frontiers highlighted.

On the current text at once (cached per text); on the validation corpus on request, since
its gold graphs take a while on CPU. The current slider setting is the star on both; a click
on a point loads that setting into the view (and so into the Explorer).
"""

from __future__ import annotations

import functools

import streamlit as st

from app import shell
from sparsefinder.evaluation import curves, frontier
from sparsefinder.explore import accuracy as accuracy_view_model
from sparsefinder.explore import live, tables
from sparsefinder.explore import pareto as pareto_view_model
from sparsefinder.figures import accuracy as accuracy_figures
from sparsefinder.figures import common as common_figures
from sparsefinder.figures import pareto as pareto_figures

st.title("Pareto")

EXPLORER = "app_pages/explorer.py"
GROUPS_KEY = "_pareto_groups"  # the groups added to the default curves (mirrors ?curves=)
CLICK_KEY = "_pareto_click"  # a clicked (curve, params), applied on the next run
LOADED_KEY = "_pareto_loaded"  # what the last click did, in words (and whether it loaded)


def _groups() -> list[str]:
    """The added groups: session first, else the link's ``curves`` (a bad name is reported)."""
    if GROUPS_KEY not in st.session_state:
        groups, problems = pareto_view_model.parse_groups(
            st.query_params.get(pareto_view_model.GROUPS_PARAM))
        st.session_state[GROUPS_KEY] = groups
        for problem in problems:
            st.toast(problem, icon=":material/link_off:")
    return st.session_state[GROUPS_KEY]


def _set_groups() -> None:
    groups = [g for g in pareto_view_model.PAGE_GROUPS if g in st.session_state["w_groups"]]
    st.session_state[GROUPS_KEY] = groups
    if groups:
        st.query_params[pareto_view_model.GROUPS_PARAM] = ",".join(groups)
    elif pareto_view_model.GROUPS_PARAM in st.query_params:
        del st.query_params[pareto_view_model.GROUPS_PARAM]


def _group_picker() -> list[str]:
    st.session_state["w_groups"] = _groups()
    if st.session_state[GROUPS_KEY] and (st.query_params.get(pareto_view_model.GROUPS_PARAM)
                                         is None):  # a page switch dropped it
        st.query_params[pareto_view_model.GROUPS_PARAM] = ",".join(st.session_state[GROUPS_KEY])
    shown = ", ".join(pareto_view_model.DEFAULT_CURVES)
    return st.multiselect(
        "Add curves", list(pareto_view_model.PAGE_GROUPS), key="w_groups",
        on_change=_set_groups, placeholder="groups of curves to add (kept in the link)",
        help=f"Drawn always: {shown}. Each group adds its curves: "
             + "; ".join(f"{g}: {', '.join(names)}"
                         for g, names in pareto_view_model.PAGE_GROUPS.items()))


def _on_click(widget: str) -> None:
    points = (st.session_state.get(widget) or {}).get("selection", {}).get("points", [])
    picked = pareto_figures.clicked_point(points[0]) if points else None
    if picked is not None:
        st.session_state[CLICK_KEY] = picked


def _apply_click(ctx: shell.AppContext) -> None:
    """Load a clicked point into the view state (sliders, star, link), or say why not."""
    picked = st.session_state.pop(CLICK_KEY, None)
    if picked is None:
        return
    curve, params = picked
    spec = curves.curve_spec(curve, params)
    try:
        changes = pareto_view_model.explorer_changes(curve, params)
    except pareto_view_model.NotInExplorer as error:
        st.session_state[LOADED_KEY] = (False, f"{live.describe(spec)}: not in the Explorer "
                                               f"({str(error).split(': ', 1)[-1]}).")
        return
    state, _ = live.clamp(shell.view_state().with_(**changes), ctx.prepared)
    shell.set_view_state(state)
    st.session_state[LOADED_KEY] = (
        True, f"Loaded from the {pareto_view_model.curve_label(curve)} curve: "
              f"{live.describe(spec)}.")
    st.rerun(scope="app")  # the sidebar's method and the sliders show it


def _loaded_note() -> None:
    loaded = st.session_state.get(LOADED_KEY)
    if loaded is None:
        return
    ok, text = loaded
    st.caption(text)
    if ok and st.button("Open in the Explorer", key="w_pareto_open",
                        icon=":material/grid_view:"):
        st.switch_page(EXPLORER)


def _downloads(frame, prefix: str, points: str = "All points") -> None:
    a, b = st.columns(2)
    a.download_button(f"{points} ({prefix}, CSV)", functools.partial(tables.to_csv, frame),
                      file_name=f"sweep_{prefix}.csv", mime="text/csv", on_click="ignore",
                      key=f"w_dl_sweep_{prefix}")
    b.download_button(
        f"Frontiers ({prefix}, CSV)",
        functools.partial(lambda f: tables.to_csv(frontier.pareto_frontier(f)), frame),
        file_name=f"frontier_{prefix}.csv", mime="text/csv", on_click="ignore",
        key=f"w_dl_frontier_{prefix}")


def _shown(frame, groups: list[str]):
    """The rows of the curves drawn (a validation frame also has every other curve)."""
    curves_here = pareto_view_model.chosen_curves(dict.fromkeys(frame["method"]), groups)
    return frame[frame["method"].isin(curves_here)]


def _figure(frame, groups: list[str], current: live.Summary, label: str, title: str,
            name: str) -> None:
    drawn = _shown(frame, groups)
    fig = pareto_figures.pareto_figure(drawn, frame.attrs.get("gold_sparsity"), title=title)
    pareto_figures.mark_current(fig, current.sparsity, current.recall, label)
    key = f"w_fig_{name}"
    st.plotly_chart(fig, config=common_figures.chart_config(name), key=key,
                    on_select=functools.partial(_on_click, key), selection_mode="points")


def _frontier_table(frame, groups: list[str]) -> None:
    table = frontier.recall_at_sparsity(_shown(frame, groups))
    table["method"] = table["method"].map(pareto_view_model.curve_label)
    st.dataframe(pareto_view_model.display_table(table), hide_index=True)


#: Curves drawn on the accuracy axis: Sparsefinder's and the cheap patterns it must beat.
ACCURACY_CURVES = ("distance", "distance+window", "kmeans", "kmeans-top2+window",
                   "quantization", "window", "longformer", "bigbird")


def _accuracy_axis(ctx: shell.AppContext, methods: list[str], gold: float | None,
                   state, label: str) -> None:
    """The sparsity–accuracy view of this text: the model's output under each setting, the
    current method's own curve (the app's default on opening) and the current setting's ★."""
    if not st.toggle("Accuracy axis: how much each setting changes the model's output "
                     "(runs the model once per grid point)", key="w_pareto_accuracy"):
        return
    curves = [m for m in ACCURACY_CURVES if m in methods]
    own = accuracy_view_model.current_curve(state, ctx.prepared)
    clicked = st.button("Compute the accuracy axis for this text", key="w_accuracy_run")
    frame = shell.text_accuracy_sweep(ctx, curves, compute=clicked, extra=own)
    if frame is None:
        names = [*(pareto_view_model.curve_label(m) for m in curves[:3]), "…",
                 *([pareto_view_model.curve_label(own[0].curve)] if own else [])]
        st.caption(f"Not computed yet on this text: {', '.join(names)}.")
        return
    measures = ("output_cosine", "embedding_cosine")
    fig = accuracy_figures.accuracy_figure(frame, gold, title="Sparsity–accuracy on this text",
                                           measures=measures)
    spec = live.spec_for(state, ctx.prepared)
    mine = shell.cached_accuracy(ctx.cache_key, spec.key, spec, ctx.prepared)
    accuracy_figures.mark_current(fig, mine.sparsity, {"output_cosine": mine.output_cosine,
                                                       "embedding_cosine": mine.embedding_cosine},
                                  measures, label)
    st.plotly_chart(fig, config=common_figures.chart_config("pareto_accuracy_text"),
                    key="w_fig_pareto_accuracy")
    st.caption("Full α-entmax is the black diamond (accuracy 1 at the gold sparsity), the star "
               "your setting; "
               "colours are those of the recall chart; retrieval agreement on the validation "
               "split: `sparsefinder sweep --accuracy`.")


@st.fragment
def pareto_view() -> None:
    ctx = shell.context()
    if not ctx.ready:
        return
    prepared = ctx.prepared
    _apply_click(ctx)
    shell.method_sliders(ctx)
    state = shell.view_state()
    _, scores = shell.predictions(ctx, state)
    label = live.describe(live.spec_for(state, prepared))
    methods, skipped = curves.available_curves(prepared.projections)
    if prepared.calibration is not None:  # their curves come from the bundled table
        skipped = {m: why for m, why in skipped.items() if not prepared.calibration.has(m)}
    if prepared.hash_codes is not None:  # its curve comes from the bundled codes
        skipped.pop("hashattention", None)
    groups = _group_picker()
    line = pareto_view_model.not_swept_line(skipped)
    if line:
        st.caption(line, help="; ".join(f"{m}: {why}" for m, why in skipped.items()))
    _loaded_note()

    st.subheader(f"This text ({prepared.n_tokens} tokens)")
    drawn = pareto_view_model.chosen_curves(shell.text_curve_names(methods, prepared), groups)
    frame = shell.text_sweep(ctx.cache_key, drawn, prepared,
                             first=pareto_view_model.DEFAULT_CURVES)
    current = live.summarize(scores, state.layer, state.head)["model"]
    _figure(frame, groups, current, label, "Sparsity–recall on this text", "pareto_text")
    _downloads(frame, "text", points="Points of the drawn curves")
    with st.expander("Recall of each frontier at fixed sparsity"):
        _frontier_table(frame, groups)

    _accuracy_axis(ctx, methods, frame.attrs.get("gold_sparsity"), state, label)

    st.subheader("Validation corpus")
    left, right = st.columns([1, 3], vertical_alignment="bottom")
    shell.seed("w_val_passages", 24)
    passages = left.number_input("Passages", 4, 200, step=4, key="w_val_passages",
                                 help="Validation passages of the built-in corpus to use.")
    clicked = right.button("Run on the validation corpus", key="w_val_run",
                           help="Extracts gold graphs (slow on CPU), then sweeps every method.")
    result = shell.corpus_sweep(ctx, methods, int(passages), compute=clicked)
    if result is None:
        st.caption("Not computed yet for this model and number of passages.")
        return
    records, corpus_frame = result
    spec = live.spec_for(state, prepared)
    corpus_current = live.score_setting(records, prepared.projections_for(spec.method_id), spec,
                                        prepared.fitted(spec.method_id))
    _figure(corpus_frame, groups, corpus_current, label,
            f"Sparsity–recall on {len(records)} validation texts", "pareto_validation")
    _downloads(corpus_frame, "validation")
    with st.expander("Recall of each frontier at fixed sparsity (validation)"):
        _frontier_table(corpus_frame, groups)


ctx = shell.context()
st.caption("Each point is one hyperparameter setting, macro-averaged over layers and heads; "
           "lines are each method's Pareto frontier; grey dashed: references that read the exact "
           "scores (a uniform top-k or top-p per query: not a bound, a cheap predictor can keep "
           "more gold edges at the same sparsity); "
           "the star is your setting. Click a point to load it.")
if shell.show_messages(ctx):
    pareto_view()
