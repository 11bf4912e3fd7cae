"""Learned space: why the selected query keeps or misses each key of one head.

Sparsefinder decides every pair in a small learned space (r projected coordinates per head).
This page draws that space for the shared selection (layer, head, query, method and its
sliders, the same as the Explorer's), the decision of the method for the query, and the row
of exact distances. Everything below the title is one ``st.fragment`` on cached vectors: the
model never reruns.
"""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from app import shell
from sparsefinder.explore import inputs, live
from sparsefinder.explore import learned_space as space_view
from sparsefinder.figures import common as common_figures
from sparsefinder.figures import learned_space as space_figures

st.title("Learned space")

PICKED_KEY = shell.PAIR_KEY  # (layer, head, query, key) of the key clicked last
EXPLORER = "app_pages/explorer.py"


def _step_query(delta: int, n: int) -> None:
    shell.update_view(query=(shell.view_state().query + delta) % n)


def _pick(widget: str) -> None:
    """A click on a point: a query becomes the selected query; a key is picked (its pair
    can then be opened in the Explorer)."""
    selection = st.session_state.get(widget) or {}
    points = selection.get("selection", {}).get("points", [])
    custom = points[0].get("customdata") if points else None
    if not custom or len(custom) != 2:
        return
    side, position = custom[0], int(custom[1])
    state = shell.view_state()
    if side == "q":
        shell.update_view(query=position)
        st.session_state.pop(PICKED_KEY, None)
    else:
        st.session_state[PICKED_KEY] = (state.layer, state.head, state.query, position)


def _controls(ctx: shell.AppContext) -> None:
    prepared = ctx.prepared
    labels = inputs.token_labels(prepared.record)
    n = prepared.n_tokens
    cols = st.columns([1, 1, 3, 1, 1], vertical_alignment="bottom")
    cols[0].selectbox("Layer", range(prepared.num_layers), **shell.bind("w_layer", "layer"))
    cols[1].selectbox("Head", range(prepared.num_heads), **shell.bind("w_head", "head"))
    cols[2].selectbox("Query token", range(n), format_func=labels.__getitem__,
                      **shell.bind("w_query", "query"))
    cols[3].button("◀ Prev query", key="w_ls_qprev", on_click=_step_query, args=(-1, n),
                   width="stretch")
    cols[4].button("Next query ▶", key="w_ls_qnext", on_click=_step_query, args=(1, n),
                   width="stretch")


def _summary(space: space_view.HeadSpace) -> None:
    kept = int((space.gold & space.predicted).sum())
    missed = int(space.missed.sum())
    a, b, c, d = st.columns(4)
    a.metric("Gold keys of the row", int(space.gold.sum()),
             help="Keys with α-entmax probability > 0 for the selected query.")
    b.metric("Missed gold keys", missed, delta=f"mass {space.missed_mass:.3f}",
             delta_color="inverse" if missed else "off", delta_arrow="off",
             help="Gold keys the prediction drops, and their share of the row's probability "
                  f"(of {space.gold_mass:.3f}).")
    c.metric("Kept gold keys", kept)
    d.metric("Extra keys", int((space.predicted & ~space.gold).sum()),
             help="Predicted keys that are not gold (FP): the sparsity they cost.")


def _margin(space: space_view.HeadSpace) -> str:
    """For a threshold: the t that would keep every gold key, and what it would cost."""
    t, reach = space.decision.threshold, space.reach()
    if space.decision.kind != space_view.THRESHOLD or reach is None:
        return ""
    kept_now = int((space.decision.keep & space.allowed).sum())
    if t is not None and math.isfinite(t) and reach <= t:
        return (f" Every gold key is within t; t could drop to {reach:.4g} "
                f"(margin {t - reach:.3g}) and still keep them all.")
    return (f" To keep every gold key, t would have to reach {reach:.4g}, which keeps "
            f"{space.kept_within(reach)} keys instead of {kept_now}.")


def _why_table(space: space_view.HeadSpace, labels: list[str]) -> pd.DataFrame:
    codes = space_figures.key_codes(space)
    names = {0: "", 1: "TP kept", 2: "FN missed", 3: "FP extra"}
    why = space_view.reasons(space)
    rows = [j for j in space.order.tolist() if codes[j] != 0]
    return pd.DataFrame({
        "key": [labels[j] for j in rows],
        "outcome": [names[int(codes[j])] for j in rows],
        "gold p": [round(float(space.probs[j]), 4) for j in rows],
        "distance": [round(float(space.distances[j]), 4) for j in rows],
        "why": [why[j] for j in rows],
    })


def _picked(space: space_view.HeadSpace, labels: list[str]) -> None:
    """The clicked key: what decided it, and a way to open its pair in the Explorer."""
    picked = st.session_state.get(PICKED_KEY)
    if picked is None or picked[:3] != (space.layer, space.head, space.query):
        st.caption("Click a key (in either chart) to see why it was kept or missed; click a "
                   "query to select it.")
        return
    key = picked[3]
    why = space_view.reasons(space)[key]
    p = float(space.probs[key])
    left, right = st.columns([3, 1], vertical_alignment="center")
    left.markdown(f"**Picked pair** query {labels[space.query]} → key {labels[key]}: "
                  f"d = {float(space.distances[key]):.4g}"
                  + (f", gold p = {p:.3f}" if p > 0 else ", not gold")
                  + f"; {why}.")
    if right.button("Open in the Explorer", key="w_ls_open", icon=":material/grid_view:",
                    help="The Explorer at this layer and head; this query stays selected "
                         "(Token view too)."):
        st.switch_page(EXPLORER)


@st.fragment
def learned_space() -> None:
    ctx = shell.context()
    if not ctx.ready:
        return
    prepared = ctx.prepared
    if not prepared.has_projections:
        st.info("The learned space needs learned projections for this model, which are not "
                "loaded. " + (ctx.projections_note or ""), icon=":material/info:")
        return
    shell.method_sliders(ctx)
    _controls(ctx)
    state = shell.view_state()
    layer, head, query = state.layer, state.head, state.query
    spec = live.spec_for(state, prepared)
    preds, _ = shell.predictions(ctx, state)
    space = space_view.head_space(prepared, spec, layer, head, query, preds[layer][head, query])
    labels = inputs.token_labels(prepared.record)
    _summary(space)
    decision = space.decision
    r = space.keys.shape[1]
    st.markdown(f"**{live.describe(spec)}** · L{layer}·H{head} · query {labels[query]} · "
                f"{decision.rule}.{_margin(space)}")
    if decision.kind == space_view.OUTSIDE:
        st.info("This method does not decide in the learned space (it reads the model's own "
                "queries and keys, or token positions): the map shows where its decisions "
                "fall, without a decision region.", icon=":material/info:")
    plane = (f"exact: the space has r = {r} dimensions" if space.plane.exact else
             f"PCA of this head's keys, r = {r} → 2, keeps "
             f"{100 * space.plane.explained:.0f}% of their variance")
    tag = f"L{layer}H{head}_q{query}"
    left, right = st.columns([1, 1])
    with left:
        around = _around_query(space)
        if around:
            st.markdown("**Around the query** · each key at its exact distance, in its "
                        f"direction on the plane ({plane})")
            figure = space_figures.query_figure(space, labels)
        else:
            st.markdown(f"**The head's space** · {plane}")
            figure = space_figures.space_figure(space, labels)
        st.plotly_chart(figure, config=common_figures.chart_config(f"learned_space_{tag}"),
                        key="w_ls_space", on_select=lambda: _pick("w_ls_space"),
                        selection_mode="points")
    with right:
        st.markdown("**The row at a glance** · every key's exact distance, nearest first")
        st.plotly_chart(space_figures.row_figure(space, labels),
                        config=common_figures.chart_config(f"learned_row_{tag}"),
                        key="w_ls_row", on_select=lambda: _pick("w_ls_row"),
                        selection_mode="points")
    st.caption(_legend(space, around))
    if decision.kind == space_view.QUANTIZATION:
        st.markdown("**The query's bins, per dimension** (exact): a key is kept when it falls "
                    "in the shaded interval of at least one dimension")
        st.plotly_chart(space_figures.bands_figure(space, labels),
                        config=common_figures.chart_config(f"learned_bins_{tag}"),
                        key="w_ls_bands", on_select=lambda: _pick("w_ls_bands"),
                        selection_mode="points")
    _picked(space, labels)
    with st.expander("Gold and predicted keys of this row, and why", expanded=False):
        st.dataframe(_why_table(space, labels), hide_index=True, width="stretch")


VIEWS = {"auto": "Decision first", "plane": "PCA plane", "query": "Around the query"}


def _hidden_on_the_plane(space: space_view.HeadSpace) -> bool:
    """A threshold whose circle on the PCA plane holds every key: it decides off the plane."""
    t = space.decision.threshold
    if space.decision.kind != space_view.THRESHOLD or space.plane.exact or t is None \
            or not math.isfinite(t):
        return False
    flat = (space.keys_2d - space.queries_2d[space.query]).norm(dim=1)
    return t >= float(flat.max())


def _around_query(space: space_view.HeadSpace) -> bool:
    """Whether the left chart shows the keys around the query (exact distances) rather than
    the PCA plane: chosen by the user, or, by default, where the plane cannot show the
    threshold."""
    if space.decision.kind != space_view.THRESHOLD or space.plane.exact:
        return False
    view = st.segmented_control("Left chart", list(VIEWS), format_func=VIEWS.get,
                                key="w_ls_view", default="auto",
                                help="Decision first: around the query wherever the PCA plane "
                                     "cannot show the threshold (every key inside its circle)."
                                     " Around the query: each key at its exact distance, so "
                                     "the circle is the decision. PCA plane: where the head's "
                                     "queries and keys lie.")
    return view == "query" or (view in (None, "auto") and _hidden_on_the_plane(space))


def _legend(space: space_view.HeadSpace, around: bool = False) -> str:
    text = (":blue[● TP] kept gold key · :red[● FN] missed gold key · :orange[● FP] extra "
            "key · grey: other keys; gold keys grow with their probability; ◆ kept by the "
            "window / global tokens; ★ the query. Hover a point for its token and exact "
            "distance.")
    kind = space.decision.kind
    if around:
        text += (" Around the query, a key's distance from the ★ is its exact distance less "
                 "that of the nearest key (shifted, so the keys spread out); its direction is "
                 "the plane's. A key lies inside the solid circle iff d ≤ t: the circle is the "
                 "decision. A dotted circle marks the farthest key a per-row floor keeps.")
    elif kind == space_view.THRESHOLD and not space.plane.exact:
        text += (" The circle has radius t on the plane: a projection never lengthens a "
                 "distance, so every key within t lies inside it, but a key inside it may "
                 "still be beyond t (the row chart has the exact distances).")
        if _hidden_on_the_plane(space):
            text += (" Here every key lies inside it: this head's distances are decided "
                     "mostly off the plane, so the left chart opens around the query, where "
                     "the circle of radius t is the decision itself.")
    elif kind == space_view.KMEANS:
        text += " ✕ centroids; purple: the query's chosen clusters."
    return text


ctx = shell.context()
st.caption("Why an edge is kept or missed: the selected head's learned space, where the "
           "method decides, around the selected query. Same selection and sliders as the "
           "Explorer; the model does not rerun.")
if shell.show_messages(ctx):
    learned_space()
