"""Coreference: which heads send pronouns to their antecedents, and does k-means keep those
edges? (paper §6, Fig. 5: a RoBERTa head with recall ≈ 0.80 at sparsity ≈ 0.75).

Probes come from ``assets/coref_probes.json``; each probe text is extracted through the shell's
cached extraction (like the main text). The head ranking is over the chosen probe, or over all
probes on request (cached).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from app import plots, shell
from sparsefinder import coref, views

st.title("Coreference")

#: The paper's coreference head (RoBERTa, Sparsefinder k-means): Fig. 5 / §6.
PAPER_RECALL, PAPER_SPARSITY = 0.80, 0.75
_PRED_RGB = "rgb({},{},{})".format(*plots.PRED_COLOR)


@st.cache_resource(show_spinner=False)
def _probes() -> list[coref.Probe]:
    return coref.load_probes()


def _prepared_probe(ctx: shell.AppContext, probe: coref.Probe) -> views.PreparedText:
    name, alpha, _, proj_key = ctx.cache_key
    projections = ctx.prepared.projections if proj_key != "none" else None
    return shell.cached_prepared(name, alpha, probe.text, proj_key, projections)


@st.cache_resource(max_entries=2, show_spinner="Extracting every probe and ranking heads…")
def _all_probes(model_key: tuple, _loaded, _projections) -> tuple[pd.DataFrame, list]:
    """Ranking over all probes and the prepared probe texts (model_key keys the cache)."""
    probes = _probes()
    prepared = [views.prepare(views.extract_one(_loaded, p.text)[0], _projections,
                              t_range=False) for p in probes]
    return coref.rank_heads([p.record for p in prepared], probes), prepared


def _pronoun_figure(frame: pd.DataFrame, tag: str) -> go.Figure:
    """Gold probabilities (left) and predicted edges (right) of the pronoun rows only;
    antecedent keys are outlined in both panels."""
    rows = frame.drop_duplicates(["pair", "query"])
    ylabels = [f"pair {p}: {q} · {t}" for p, q, t in
               zip(rows["pair"], rows["query"], rows["query_token"], strict=True)]
    keys = frame.loc[frame["query"] == rows["query"].iloc[0], "key_token"].tolist()
    xlabels = [f"{i} · {t}" for i, t in enumerate(keys)]
    shape = (len(rows), len(keys))
    prob = frame["prob"].to_numpy().reshape(shape)
    pred = frame["predicted"].to_numpy().reshape(shape).astype(float)
    ante = frame["antecedent"].to_numpy().reshape(shape)
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=(f"Gold α-entmax probability · {tag}",
                                        f"Predicted (k-means) · {tag}"))
    fig.add_trace(go.Heatmap(z=prob, x=xlabels, y=ylabels, colorscale="Blues", zmin=0,
                             zmax=max(float(prob.max()), 1e-6), showscale=False,
                             hovertemplate="%{y} → %{x}: %{z:.3f}<extra></extra>"), 1, 1)
    fig.add_trace(go.Heatmap(z=pred, x=xlabels, y=ylabels, zmin=0, zmax=1, showscale=False,
                             colorscale=[[0, "white"], [1, _PRED_RGB]],
                             hovertemplate="%{y} → %{x}: %{z}<extra></extra>"), 1, 2)
    r, c = np.nonzero(ante)
    for col in (1, 2):
        fig.add_trace(go.Scatter(
            x=[xlabels[i] for i in c], y=[ylabels[i] for i in r], mode="markers",
            marker=dict(symbol="square-open", size=14, color="#d62728", line=dict(width=2)),
            name="antecedent", showlegend=col == 1, hoverinfo="skip"), 1, col)
    fig.update_layout(height=140 + 34 * len(rows), margin=dict(l=0, r=0, t=40, b=0),
                      legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(tickangle=-60, tickfont=dict(size=10))
    return fig


def _reference_figure(ours: list[tuple[str, float, float]]) -> go.Figure:
    """The paper's coreference head beside ours on the sparsity–recall plane."""
    fig = go.Figure([
        go.Scatter(x=[PAPER_SPARSITY], y=[PAPER_RECALL], mode="markers+text",
                   marker=dict(size=14, symbol="star", color="#7f7f7f"),
                   text=["paper (RoBERTa)"], textposition="bottom center", name="paper"),
        *[go.Scatter(x=[s], y=[r], mode="markers+text", marker=dict(size=12),
                     text=[label], textposition="top center", name=label)
          for label, r, s in ours if not np.isnan(r)],
    ])
    fig.update_layout(xaxis_title="sparsity of the head's graph", yaxis_title=(
        "recall on pronoun→antecedent edges"), xaxis_range=[0, 1.02], yaxis_range=[0, 1.05],
        height=360, showlegend=False, margin=dict(l=0, r=0, t=10, b=0))
    return fig


def _kmeans_controls(prepared: views.PreparedText) -> tuple[int, int]:
    left, right = st.columns(2)
    left.select_slider("B (clusters)", options=sorted(prepared.centroids),
                       **shell.bind("w_clusters", "clusters", int, int))
    top = min(views.MAX_TOP_K, int(shell.view_state().clusters))
    if top > 1:
        right.slider("k (nearest centroids)", 1, top,
                     **shell.bind("w_top_k", "top_k", lambda k: min(int(k), top), int))
    state = shell.view_state()
    return int(state.clusters), int(state.top_k)


@st.fragment
def coreference_view() -> None:
    ctx = shell.context()
    if not ctx.ready:
        return
    try:
        probes = _probes()
    except coref.ProbeFileError as error:
        st.error(str(error), icon=":material/error:")
        return
    by_id = {p.id: p for p in probes}
    shell.seed("w_probe", probes[0].id)
    probe = by_id[st.selectbox(
        "Probe", list(by_id), key="w_probe",
        format_func=lambda i: f"{i} · {by_id[i].text[:90]}")]
    spans = [s for pair in probe.pairs for s in (pair.pronoun, pair.antecedent)]
    st.markdown(views.highlight_html(probe.text, spans, range(len(spans))),
                unsafe_allow_html=True)
    st.caption(" · ".join(
        f"pair {i}: **{probe.text[slice(*p.pronoun)]}** → "
        f"**{probe.text[slice(*p.antecedent)]}**" + (" (cataphora)" if p.cataphora else "")
        for i, p in enumerate(probe.pairs)))
    prepared = _prepared_probe(ctx, probe)
    record = prepared.record
    try:
        pairs = coref.pair_tokens(record, probe)
    except ValueError as error:
        st.error(str(error), icon=":material/error:")
        return

    shell.seed("w_coref_scope", "probe")
    scope = st.radio("Rank heads on", ["probe", "all"], key="w_coref_scope", horizontal=True,
                     format_func={"probe": "this probe",
                                  "all": f"all {len(probes)} probes (slower, cached)"}.get)
    everything = None
    if scope == "all":
        everything = _all_probes(ctx.cache_key[:2] + ctx.cache_key[3:], ctx.loaded,
                                 prepared.projections)
        ranking = everything[0]
    else:
        ranking = coref.rank_heads([record], [probe])
    left, right = st.columns([2, 3])
    left.markdown(f"**Head ranking** ({'all probes' if everything else probe.id}): mean "
                  "gold mass from a pronoun onto its antecedent")
    left.dataframe(ranking.head(10).round(3), hide_index=True, width="stretch")
    best = [(int(r.layer), int(r.head)) for r in ranking.head(5).itertuples()]
    if st.session_state.get("w_coref_head") not in best:
        st.session_state["w_coref_head"] = best[0]
    layer, head = right.selectbox(
        "Head (top 5 of the ranking)", best, key="w_coref_head",
        format_func=lambda lh: f"L{lh[0]}·H{lh[1]}")
    tag = f"L{layer}H{head}"

    learned = prepared.has_projections and bool(prepared.centroids)
    pred = None
    with right:
        if learned:
            clusters, top_k = _kmeans_controls(prepared)
            pred = views.kmeans_layer_mask(prepared, layer, clusters, top_k)
        else:
            st.info("Recall of Sparsefinder k-means needs learned projections with centroids, "
                    "which are not loaded for this model; the gold graphs and the ranking "
                    "still work.", icon=":material/info:")
    frame = views.pronoun_rows_frame(record, layer, head, pairs,
                                     pred[head] if pred is not None else None)
    st.plotly_chart(_pronoun_figure(frame, tag), config=plots.chart_config(f"coref_{tag}"),
                    key="w_fig_coref_rows")
    st.caption("Only the pronoun rows of the head: each row is one pronoun piece, red squares "
               "mark its antecedent's pieces.")
    if pred is None:
        return

    result = coref.evaluate_head([record], [probe], [pred], layer, head)
    ours = [(f"{probe.id}", result["pronoun_recall"], result["sparsity"])]
    cols = st.columns(4)
    cols[0].metric(f"Pronoun-edge recall ({probe.id})", f"{result['pronoun_recall']:.3f}")
    cols[1].metric(f"Head sparsity ({probe.id})", f"{result['sparsity']:.3f}")
    cols[2].metric("Pronoun gold edges", f"{result['pronoun_gold_edges']}")
    cols[3].metric("Head recall (all edges)", f"{result['head_recall']:.3f}")
    if everything is not None:
        preds = [views.kmeans_layer_mask(p, layer, clusters, top_k) for p in everything[1]]
        pooled = coref.evaluate_head([p.record for p in everything[1]], probes, preds,
                                     layer, head)
        ours.append(("all probes", pooled["pronoun_recall"], pooled["sparsity"]))
        a, b = st.columns(2)
        a.metric("Pronoun-edge recall (all probes)", f"{pooled['pronoun_recall']:.3f}")
        b.metric("Head sparsity (all probes)", f"{pooled['sparsity']:.3f}")
    paper, mine = st.columns(2)
    with paper:
        st.markdown("**Paper** (RoBERTa coreference head, k-means)")
        p1, p2 = st.columns(2)
        p1.metric("Paper recall", f"{PAPER_RECALL:.2f}")
        p2.metric("Paper sparsity", f"{PAPER_SPARSITY:.2f}")
    with mine:
        st.plotly_chart(_reference_figure(ours), config=plots.chart_config("coref_reference"),
                        key="w_fig_coref_reference")
    if np.isnan(result["pronoun_recall"]):
        st.caption("This head has no gold edge from the pronouns to their antecedents on this "
                   "probe, so its recall there is undefined.")


ctx = shell.context()
st.caption("Heads that attend from pronouns to their antecedents, and whether Sparsefinder "
           "k-means keeps those edges (paper §6, Fig. 5).")
if shell.show_messages(ctx):
    coreference_view()
