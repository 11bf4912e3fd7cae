"""Pareto: sparsity–recall curves of every available method, frontiers highlighted.

On the current text at once (cached per text); on the validation corpus on request, since
its gold graphs take a while on CPU. The current slider setting is marked on both.
"""

from __future__ import annotations

import functools

import streamlit as st

from app import shell
from sparsefinder.evaluation import curves, frontier
from sparsefinder.explore import live, tables
from sparsefinder.figures import accuracy as accuracy_figures
from sparsefinder.figures import common as common_figures
from sparsefinder.figures import pareto as pareto_figures

st.title("Pareto")


def _downloads(frame, prefix: str) -> None:
    a, b = st.columns(2)
    a.download_button(f"All points ({prefix}, CSV)", functools.partial(tables.to_csv, frame),
                      file_name=f"sweep_{prefix}.csv", mime="text/csv", on_click="ignore",
                      key=f"w_dl_sweep_{prefix}")
    b.download_button(
        f"Frontiers ({prefix}, CSV)",
        functools.partial(lambda f: tables.to_csv(frontier.pareto_frontier(f)), frame),
        file_name=f"frontier_{prefix}.csv", mime="text/csv", on_click="ignore",
        key=f"w_dl_frontier_{prefix}")


def _figure(frame, current: live.Summary, label: str, title: str, name: str) -> None:
    fig = pareto_figures.pareto_figure(frame, frame.attrs.get("gold_sparsity"), title=title)
    pareto_figures.mark_current(fig, current.sparsity, current.recall, label)
    st.plotly_chart(fig, config=common_figures.chart_config(name), key=f"w_fig_{name}")


#: Curves drawn on the accuracy axis: Sparsefinder's and the cheap patterns it must beat.
ACCURACY_CURVES = ("distance", "distance+window", "kmeans", "kmeans-top2+window",
                   "quantization", "window", "longformer", "bigbird")


def _accuracy_axis(ctx: shell.AppContext, methods: list[str], gold: float | None) -> None:
    """The sparsity–accuracy view of this text: the model's output under each setting."""
    if not st.toggle("Accuracy axis: how much each setting changes the model's output "
                     "(runs the model once per grid point)", key="w_pareto_accuracy"):
        return
    curves = [m for m in ACCURACY_CURVES if m in methods]
    clicked = st.button("Compute the accuracy axis for this text", key="w_accuracy_run")
    frame = shell.text_accuracy_sweep(ctx, curves, compute=clicked)
    if frame is None:
        st.caption(f"Not computed yet: {', '.join(curves)} on this text.")
        return
    fig = accuracy_figures.accuracy_figure(
        frame, gold, title="Sparsity–accuracy on this text",
        measures=("output_cosine", "embedding_cosine"))
    st.plotly_chart(fig, config=common_figures.chart_config("pareto_accuracy_text"),
                    key="w_fig_pareto_accuracy")
    st.caption("Full α-entmax is the star (accuracy 1 at the gold sparsity); retrieval "
               "agreement on the validation split: `sparsefinder sweep --accuracy`.")


@st.fragment
def pareto_view() -> None:
    ctx = shell.context()
    if not ctx.ready:
        return
    prepared = ctx.prepared
    shell.method_sliders(ctx)
    state = shell.view_state()
    _, scores = shell.predictions(ctx, state)
    label = live.describe(live.spec_for(state, prepared))
    methods, skipped = curves.available_curves(prepared.projections)
    if prepared.calibration is not None:  # their curves come from the bundled table
        skipped = {m: why for m, why in skipped.items() if not prepared.calibration.has(m)}
    if prepared.hash_codes is not None:  # its curve comes from the bundled codes
        skipped.pop("hashattention", None)
    if skipped:
        st.caption("Not swept: " + "; ".join(f"{m} ({why})" for m, why in skipped.items()))

    st.subheader(f"This text ({prepared.n_tokens} tokens)")
    frame = shell.cached_text_sweep(ctx.cache_key, tuple(methods), prepared)
    current = live.summarize(scores, state.layer, state.head)["model"]
    _figure(frame, current, label, "Sparsity–recall on this text", "pareto_text")
    _downloads(frame, "text")
    with st.expander("Recall of each frontier at fixed sparsity"):
        st.dataframe(frontier.recall_at_sparsity(frame), hide_index=True)

    _accuracy_axis(ctx, methods, frame.attrs.get("gold_sparsity"))

    st.subheader("Validation corpus")
    left, right = st.columns([1, 3], vertical_alignment="bottom")
    shell.seed("w_val_passages", 24)
    passages = left.number_input("Passages", 4, 200, step=4, key="w_val_passages",
                                 help="Validation passages of the built-in corpus to use.")
    clicked = right.button("Run on the validation corpus", key="w_val_run",
                           help="Extracts gold graphs (slow on CPU), then sweeps every method.")
    model_key = ctx.cache_key.model_key
    result = shell.corpus_sweep(model_key, ctx.loaded, prepared, methods, int(passages),
                                compute=clicked)
    if result is None:
        st.caption("Not computed yet for this model and number of passages.")
        return
    records, corpus_frame = result
    spec = live.spec_for(state, prepared)
    corpus_current = live.score_setting(records, prepared.projections_for(spec.method_id), spec,
                                        prepared.fitted(spec.method_id))
    _figure(corpus_frame, corpus_current, label,
            f"Sparsity–recall on {len(records)} validation texts", "pareto_validation")
    _downloads(corpus_frame, "validation")


ctx = shell.context()
st.caption("Each point is one hyperparameter setting, macro-averaged over layers and heads; "
           "lines are each method's Pareto frontier; the star is your current setting.")
if shell.show_messages(ctx):
    pareto_view()
