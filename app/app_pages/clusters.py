"""Clusters: what Sparsefinder's k-means clusters of one head hold (paper §6, Fig. 6).

Stacked bars of POS tag × cluster for the head's queries or keys (this text, or the validation
corpus on request), the tokens of each cluster, one cluster highlighted in the text with its
edges, and the recall/sparsity of the k-means graph per POS tag of the query.
"""

from __future__ import annotations

import functools

import pandas as pd
import streamlit as st

from app import shell
from app.progress import progress_bar
from sparsefinder.analysis.clusters import HeadClusterAnalysis, cluster_tokens
from sparsefinder.explore import clusters as exclusters
from sparsefinder.explore import inputs, tables
from sparsefinder.explore import state as urlstate
from sparsefinder.figures import clusters as cluster_figures
from sparsefinder.figures import common as common_figures
from sparsefinder.figures import graphs as graph_figures

st.title("Clusters")


@st.cache_resource(max_entries=8, show_spinner="Tagging the text with spaCy…")
def _text_tags(cache_key: tuple, _record) -> list[str]:
    """POS tags of the current text's tokens (spaCy, aligned to the model's pieces)."""
    from sparsefinder.analysis.pos import align_pos

    return align_pos(_record.text, _record.offsets, _record.special)


def _corpus_tagged(ctx: shell.AppContext, passages: int, compute: bool):
    """Validation records (shared with Pareto) and their POS tags at the view's model and α:
    from the store, or computed now with a progress bar when ``compute``; None if not yet."""
    from sparsefinder.analysis.pos import align_pos

    store = shell.shared_store("clusters_tags", 2)
    key = (*ctx.cache_key.model_alpha, int(passages))
    if key in store or not compute:
        return store.get(key)
    with progress_bar("Validation corpus") as bar:
        records = shell.validation_records(*ctx.cache_key.model_alpha, passages,
                                           on_progress=bar.stage(0.0, 0.7))
        tagging = bar.stage(0.7, 1.0)
        tags = []
        for index, record in enumerate(records):
            tagging(index / max(len(records), 1), f"POS tags {index + 1}/{len(records)}")
            tags.append(align_pos(record.text, record.offsets, record.special))
    store.put(key, (records, tags))
    return records, tags


def _controls(ctx: shell.AppContext) -> None:
    prepared = ctx.prepared
    cols = st.columns([1, 1, 2, 2, 2, 2], vertical_alignment="bottom")
    cols[0].selectbox("Layer", range(prepared.num_layers), **shell.bind("w_layer", "layer"))
    cols[1].selectbox("Head", range(prepared.num_heads), **shell.bind("w_head", "head"))
    cols[2].select_slider("B (clusters)", options=prepared.cluster_choices,
                          **shell.bind("w_clusters", "clusters", int, int))
    top = min(urlstate.MAX_TOP_K, int(shell.view_state().clusters))
    if top > 1:
        cols[3].slider("k (nearest centroids)", 1, top,
                       **shell.bind("w_top_k", "top_k", lambda k: min(int(k), top), int))
    shell.seed("w_cl_side", "queries")
    cols[4].radio("Show", ["queries", "keys"], key="w_cl_side", horizontal=True)
    shell.seed("w_cl_corpus", "text")
    cols[5].radio("Corpus", ["text", "validation"], key="w_cl_corpus", horizontal=True,
                  format_func={"text": "This text", "validation": "Validation"}.get)


def _corpus_analysis(ctx: shell.AppContext, layer: int, head: int, clusters: int,
                     top_k: int) -> HeadClusterAnalysis | None:
    left, right = st.columns([1, 3], vertical_alignment="bottom")
    shell.seed("w_cl_passages", 24)
    passages = left.number_input("Passages", 4, 200, step=4, key="w_cl_passages",
                                 help="Validation passages of the built-in corpus to use.")
    clicked = right.button("Run on the validation corpus", key="w_cl_run",
                           help="Extracts gold graphs and POS tags (slow on CPU), once.")
    result = _corpus_tagged(ctx, int(passages), clicked)
    if result is None:
        st.caption("Validation corpus not computed yet for this model and number of "
                   "passages; showing nothing until you run it.")
        return None
    records, tags = result
    analysis = HeadClusterAnalysis(ctx.prepared.projections, layer, head, clusters, top_k)
    for record, record_tags in zip(records, tags, strict=True):
        analysis.add(record, record_tags)
    st.caption(f"Pooled over {analysis.n_records} validation texts.")
    return analysis


def _pick_from_bars(columns: list) -> None:
    """A click on a bar segment selects its cluster (shared with the Explorer)."""
    selection = st.session_state.get("w_fig_breakdown") or {}
    points = selection.get("selection", {}).get("points", [])
    cluster = exclusters.cluster_from_point(points[0], columns) if points else None
    if cluster is not None:
        shell.set_cluster(cluster)


@st.fragment
def clusters_view() -> None:
    ctx = shell.context()
    if not ctx.ready:
        return
    prepared = ctx.prepared
    record = prepared.record
    try:
        tags = _text_tags(ctx.cache_key, record)
    except ImportError as error:
        st.error(f"POS tags need a spaCy English pipeline: {error}", icon=":material/error:")
        return
    if not prepared.cluster_choices:
        st.info("The cluster analysis needs learned projections with k-means centroids, "
                "which are not loaded for this model. "
                + (ctx.projections_note or "") + " POS tags of this text are below.",
                icon=":material/info:")
        st.dataframe(pd.Series(tags, name="tag").value_counts().rename("tokens"))
        return
    _controls(ctx)
    state = shell.view_state()
    layer, head, clusters, top_k = state.layer, state.head, int(state.clusters), state.top_k
    side = st.session_state["w_cl_side"]
    tag = f"L{layer}H{head} B={clusters} k={top_k}"

    if st.session_state["w_cl_corpus"] == "validation":
        analysis = _corpus_analysis(ctx, layer, head, clusters, top_k)
        where = "validation corpus"
    else:
        analysis = HeadClusterAnalysis(prepared.projections, layer, head, clusters, top_k)
        analysis.add(record, tags)
        where = "this text"
    if analysis is not None:
        table = analysis.query_percentages if side == "queries" else analysis.key_percentages
        counts = analysis.pos_scores["tokens"]
        st.plotly_chart(
            cluster_figures.breakdown_figure(
                table, counts=counts, title=f"POS tags of the {side} × cluster · {tag} · "
                                            f"{where}"),
            config=common_figures.chart_config(f"clusters_{side}"), key="w_fig_breakdown",
            on_select=functools.partial(_pick_from_bars, list(table.columns)),
            selection_mode="points")
        st.caption("Click a bar segment to highlight its cluster here and in the Explorer.")

    q_ids, k_ids = exclusters.head_cluster_ids(prepared, layer, head, clusters, top_k)
    ids = q_ids if side == "queries" else k_ids
    groups = cluster_tokens(record.tokens, ids)
    st.subheader(f"Tokens of each cluster ({side}, this text)")
    st.dataframe(
        pd.DataFrame({
            "cluster": list(groups),
            "tokens": [len(members) for members in groups.values()],
            "members": [" ".join(token for _, token in members)
                        for members in groups.values()],
        }),
        hide_index=True, width="stretch")
    options = list(range(clusters))
    shared = shell.selected_cluster()
    st.session_state["w_cl_cluster"] = (shared if shared in options else
                                        exclusters.default_cluster(q_ids, k_ids, clusters))
    chosen = st.selectbox(
        "Cluster to highlight", options, key="w_cl_cluster",
        on_change=lambda: shell.set_cluster(st.session_state["w_cl_cluster"]),
        format_func=lambda c: f"cluster {c} · {len(groups.get(c, []))} {side}",
        help="Also highlighted in the Explorer's graphs (method k-means, same B).")
    positions = [p for p, _ in groups.get(chosen, [])]
    st.markdown(
        "<div style='line-height:1.9;padding:0.5em;border:1px solid #ddd;border-radius:4px'>"
        + tables.highlight_html(record.text, record.offsets, positions) + "</div>",
        unsafe_allow_html=True)
    gold = record.layers[layer].gold_of(head)
    gold_c, pred_c = exclusters.cluster_masks(q_ids, k_ids, chosen, gold)
    codes = tables.diff_codes(pred_c, gold_c)
    st.plotly_chart(
        graph_figures.head_figure(gold_c.numpy(), pred_c.numpy(), codes,
                                  inputs.token_labels(record), f"L{layer}H{head} c{chosen}",
                                  tables.diff_counts(codes)),
        config=common_figures.chart_config(f"cluster_{chosen}_edges"), key="w_fig_cluster_edges")
    st.caption(f"Gold: the gold edges of the queries in cluster {chosen}; predicted: pairs "
               f"whose query and key both join cluster {chosen}; FN are gold edges this "
               "cluster misses (another of the query's k clusters may still cover them).")

    if analysis is not None:
        st.subheader(f"Recall and sparsity per POS tag of the query · {where}")
        scores = analysis.pos_scores
        left, right = st.columns([3, 2])
        left.plotly_chart(cluster_figures.pos_recall_figure(scores, title=f"k-means {tag}"),
                          config=common_figures.chart_config("pos_recall"), key="w_fig_pos_recall")
        right.caption("Worst-served tags first (k-means alone, no window/global tokens).")
        right.dataframe(scores.round(3), width="stretch")


ctx = shell.context()
st.caption("Which words share a k-means cluster? POS tags per cluster for one head (paper "
           "§6, Fig. 6), the tokens of each cluster and the edges it predicts.")
if shell.show_messages(ctx):
    clusters_view()
