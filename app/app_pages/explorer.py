"""Explorer: one head's gold graph, predicted graph and their diff, with live sliders.

Everything below the page title is one ``st.fragment``: a slider move or a head change
reruns only it, on cached gold graphs and projected vectors.
"""

from __future__ import annotations

import functools
import time

import streamlit as st

from app import page_width, run_log, shell, token_window
from sparsefinder.explore import clusters as exclusters
from sparsefinder.explore import inputs, live, long_view, tables
from sparsefinder.explore import prepared as prep
from sparsefinder.explore import state as urlstate
from sparsefinder.figures import common as common_figures
from sparsefinder.figures import graphs as graph_figures
from sparsefinder.figures import thumbnails

st.title("Explorer")


def _step_head(delta: int, layers: int, heads: int) -> None:
    """Previous/next head, wrapping into the neighbouring layer."""
    state = shell.view_state()
    flat = (state.layer * heads + state.head + delta) % (layers * heads)
    layer, head = divmod(flat, heads)
    shell.update_view(layer=layer, head=head)


def _pick_from_grid() -> None:
    """A click on the overview grid selects that (layer, head): x is the head, y the layer."""
    selection = st.session_state.get("w_overview") or {}
    points = selection.get("selection", {}).get("points", [])
    if points:
        shell.update_view(layer=int(points[0]["y"]), head=int(points[0]["x"]))


def _head_picker(ctx: shell.AppContext) -> None:
    layers, heads = ctx.prepared.num_layers, ctx.prepared.num_heads
    cols = st.columns([2, 2, 1, 1], vertical_alignment="bottom")
    cols[0].selectbox("Layer", range(layers), **shell.bind("w_layer", "layer"))
    cols[1].selectbox("Head", range(heads), **shell.bind("w_head", "head"))
    cols[2].button("◀ Prev", key="w_prev", on_click=_step_head, args=(-1, layers, heads),
                   width="stretch", help="Previous head")
    cols[3].button("Next ▶", key="w_next", on_click=_step_head, args=(1, layers, heads),
                   width="stretch", help="Next head")


#: Under the grid when the model has softmax layers (grey, crossed cells).
_SOFTMAX_NOTE = ("Grey, crossed: {layers} ran softmax (α = 1), so every allowed pair is a gold "
                 "edge: nothing sparse to predict there; the Model values leave them out, as "
                 "the sweep does.")
#: The gold sparsity is shown under each sparsity metric, as its delta: "gold 0.944".
GOLD_PREFIX = "gold "
_EXTRA_LABELS = urlstate.METRIC_LABELS
_EXTRA_HELP = ("precision: share of predicted pairs that are gold edges · exact rows: share of "
               "query rows whose whole gold support is predicted (they get exactly the true "
               "attention) · mass recall: share of the gold probability mass kept · block "
               "recall b: share of the gold b×b tiles the prediction touches (what a "
               "block-sparse kernel computes).")


def _metrics(summary: dict[str, live.Summary], layer: int, head: int) -> None:
    """The headline: recall and sparsity at three scopes, each sparsity over its gold sparsity
    (what a perfect predictor reaches). Two metrics per scope, not three: nine across did not
    fit a 1280-pixel screen (labels and values were cut to "Head r…", "0.…")."""
    scopes = {"head": f"Head L{layer}·H{head}", "layer": f"Layer {layer}", "model": "Model"}
    for column, (scope, title) in zip(st.columns(3), scopes.items(), strict=True):
        values = summary[scope]
        name = scope.title()
        column.markdown(f"**{title}**")
        a, b = column.columns(2)
        a.metric(f"{name} recall", f"{values.recall:.3f}",
                 help=f"**{name} recall**: share of gold edges (α-entmax probability > 0) the "
                      "prediction keeps, |Ĝ ∧ G| / |G|. Recall 1 means exactly the true "
                      "attention (sparse-consistency). Macro: texts → heads → layers.")
        b.metric(f"{name} sparsity", f"{values.sparsity:.3f}",
                 delta=f"{GOLD_PREFIX}{values.gold_sparsity:.3f}", delta_color="off",
                 delta_arrow="off",
                 help=f"**{name} sparsity**: share of query–key pairs the prediction drops, "
                      "1 − |Ĝ| / (n·m) (decoders: over the n(n+1)/2 allowed pairs).\n\n"
                      f"Below it, **{name} gold sparsity**: sparsity of the true α-entmax "
                      "graph, what a perfect predictor reaches.")


def _more_metrics(summary: dict[str, live.Summary], layer: int, head: int) -> None:
    """Precision, exact rows, mass recall and block recall per scope, under the panels (the
    headline above them holds recall and sparsity only, so the panels start on the first
    screen)."""
    scopes = {"head": f"Head L{layer}·H{head}", "layer": f"Layer {layer}", "model": "Model"}
    with st.expander("More metrics: precision, exact rows, mass recall, block recall"):
        for column, (scope, title) in zip(st.columns(3), scopes.items(), strict=True):
            values = summary[scope]
            if values.extra:
                column.markdown(f"**{title}**")
                column.caption(" · ".join(f"{_EXTRA_LABELS.get(key, key)} {value:.3f}"
                                          for key, value in values.extra.items()),
                               help=_EXTRA_HELP)


@st.fragment
def explorer() -> None:
    with run_log.timed("fragment"):  # a slider move; off unless SPARSEFINDER_RUN_LOG is set
        _explorer()


def _explorer() -> None:
    ctx = shell.context()
    if not ctx.ready:
        return
    prepared = ctx.prepared
    record = prepared.record
    shell.method_sliders(ctx)
    _head_picker(ctx)
    state = shell.view_state()
    layer, head = state.layer, state.head
    preds, scores = shell.predictions(ctx, state)
    summary = live.summarize(scores, layer, head)
    with st.container(key="w_headline"):  # what the benchmarks wait for on the first screen
        _metrics(summary, layer, head)
    note = live.short_text_note(live.spec_for(state, prepared), record.n_tokens,
                                summary["model"].sparsity)
    if note:
        st.info(note, icon=":material/info:")

    labels = inputs.token_labels(record)
    width = page_width.main_width()  # the panels grow with the page
    slot = st.container()  # the panels, above the token window that picks what they show
    shown = token_window.token_range(record)
    figure = _head_figure(record, preds, layer, head, labels, shown, width)
    tag = f"L{layer}H{head}"
    cluster = _cluster_outline(ctx, state, figure, labels) if shown == slice(None) else None
    pair = _picked_pair(state, figure, labels, shown)
    slot.plotly_chart(figure, config=common_figures.chart_config(f"head_{tag}"),
                      key="w_fig_head")
    other = _compare_picker(prepared, layer, head)
    if other is not None:
        st.plotly_chart(_head_figure(record, preds, *other, labels, shown, width),
                        config=common_figures.chart_config(f"head_L{other[0]}H{other[1]}"),
                        key="w_fig_head_compare")
    if cluster is not None:
        left, right = st.columns([4, 1], vertical_alignment="center")
        left.caption(cluster)
        right.button("Clear cluster", key="w_clear_cluster", on_click=shell.set_cluster,
                     args=(None,), help="Stop highlighting the cluster picked on Clusters.")
    if pair is not None:
        st.caption(pair)
    where = "an edge" if _edge_hover(record) == "all" else "an edge of the diff panel"
    st.caption("Gold: the α-entmax graph (pairs with probability > 0) · predicted: the pairs "
               "the method keeps · diff: :blue[■ TP] predicted gold edge · :red[■ FN] missed "
               f"gold edge · :orange[■ FP] extra predicted edge. Hover {where} for its "
               "tokens; zooming one panel zooms all three.")
    _more_metrics(summary, layer, head)
    _accuracy(ctx, state)
    if record.n_tokens > long_view.LONG_TEXT:
        token_window.block_overview(record, preds, layer, head)
    grid_col, dl_col = st.columns([2, 1])
    with grid_col:
        st.radio("Overview colour", list(urlstate.OVERVIEW_METRICS), horizontal=True,
                 format_func=urlstate.METRIC_LABELS.get,
                 help="Colour of the layer × head grid below (kept in the link).",
                 **shell.bind("w_colour_by", "overview"))
        metric = shell.view_state().overview
        words = urlstate.METRIC_LABELS[metric]
        st.markdown(f"**All layers × heads** · coloured by {words}; click a cell to open it")
        values = getattr(scores, metric).numpy()
        softmax = live.softmax_layers(scores)
        st.plotly_chart(graph_figures.overview_figure(values, words, (layer, head), softmax),
                        config=common_figures.chart_config(f"overview_{metric}"), key="w_overview",
                        on_select=_pick_from_grid, selection_mode="points")
        if softmax:
            st.caption(_SOFTMAX_NOTE.format(layers=", ".join(f"L{i}" for i in softmax)))
    with dl_col:
        st.caption("Data behind the figures")
        st.download_button(
            "Edges of this head (CSV)",
            functools.partial(_edges_csv, prepared, layer, head, preds[layer][head]),
            file_name=f"edges_{tag}.csv", mime="text/csv", on_click="ignore",
            key="w_dl_edges")
        st.download_button(
            "Metrics per head (CSV)",
            functools.partial(lambda s: tables.to_csv(tables.metrics_frame(s)), scores),
            file_name="metrics_per_head.csv", mime="text/csv", on_click="ignore",
            key="w_dl_metrics")
        st.download_button(
            "View + metrics (JSON)",
            functools.partial(
                lambda: tables.to_json(tables.view_report(
                    state, scores, ctx.loaded.model_id, state.alpha, record.n_tokens,
                    live.describe(live.spec_for(state, prepared)), record.text))),
            file_name="view.json", mime="application/json", on_click="ignore",
            key="w_dl_json")
    if st.toggle("Model view: every head's pattern (gold, predicted or diff)",
                 key="w_model_view_on", help="bertviz's model view, with gold vs predicted; "
                 "off by default to keep slider moves fast."):
        _model_view(prepared, preds, scores, state)


def _accuracy(ctx: shell.AppContext, state: urlstate.ViewState) -> None:
    """What the setting costs the model: one restricted forward pass per slider release
    (cached per setting), compared with the full α-entmax run of the same text."""
    if not st.toggle("Output accuracy: run the model restricted to the predicted graph",
                     key="w_accuracy_on",
                     help="Later layers see the effect of earlier layers' misses (the paper's "
                          "model-level simulation). Retrieval agreement on the validation "
                          "split: `sparsefinder sweep --accuracy`."):
        return
    spec = live.spec_for(state, ctx.prepared)
    start = time.perf_counter()
    result = shell.cached_accuracy(ctx.cache_key, spec.key, spec, ctx.prepared)
    took = time.perf_counter() - start
    a, b, c, d = st.columns(4)
    a.metric("Output cosine", f"{result.output_cosine:.4f}",
             help="Cosine of the last hidden states (per token, averaged) with and without "
                  "the restriction; 1 = the model's output is unchanged.")
    b.metric("Embedding cosine", f"{result.embedding_cosine:.4f}",
             help="Cosine of the mean-pooled sentence embeddings (the default model's task).")
    c.metric("Sparsity run", f"{result.sparsity:.3f}",
             help="Sparsity of the graphs entmax ran over (repaired rows included).")
    d.metric("Rows repaired", f"{result.repaired_rows:.3f}",
             help="Share of query rows the graph left empty; they keep their diagonal.")
    st.caption(f"Accuracy of this setting: {took:.2f} s (cached per setting; the first time "
               "runs the model twice: full and restricted).")
    passages = shell.TASK_PASSAGES
    if st.button(f"Task measure: retrieval agreement on {passages} validation passages",
                 key="w_task_run", help="Does each passage keep its nearest neighbours among "
                 "the others when attention is restricted to this setting's graphs?"):
        model_key = ctx.cache_key.model_key
        start = time.perf_counter()
        task = shell.cached_task_accuracy(model_key, spec.key, spec,
                                          ctx.prepared.projections_for(spec.method_id),
                                          ctx.prepared.fitted(spec.method_id))
        took = time.perf_counter() - start
        a, b, c = st.columns(3)
        a.metric("Retrieval top-1 agreement", f"{task.retrieval_top1:.3f}")
        b.metric("Retrieval nDCG@10", f"{task.retrieval_ndcg10:.3f}")
        c.metric("Embedding cosine (passages)", f"{task.embedding_cosine:.4f}")
        st.caption(f"Task measure on {task.n_texts} validation texts: {took:.1f} s.")


def _head_figure(record, preds, layer: int, head: int, labels: list[str], shown: slice,
                 width: int | None = None):
    """Gold | predicted | diff of one head on the tokens ``shown``, sized for ``width`` px;
    hover: tokens and the gold probability."""
    gold = record.layers[layer].gold_of(head, shown)[:, shown]  # the window's rows only
    pred = preds[layer][head][shown, shown]
    probs = long_view.head_probs(record.layers[layer], head, shown, shown).numpy()
    codes = tables.diff_codes(pred, gold)
    where = "" if shown == slice(None) else f" · tokens {shown.start}–{shown.stop - 1}"
    return graph_figures.head_figure(gold.numpy(), pred.numpy(), codes, labels[shown],
                                     f"L{layer}H{head}{where}", tables.diff_counts(codes),
                                     probs, width, edge_hover=_edge_hover(record))


def _edge_hover(record) -> str:
    """Long texts name an edge's tokens on the diff panel only: their slider moves redraw
    far fewer hover markers (the gold and predicted panels hover with positions)."""
    return "diff" if record.n_tokens > long_view.LONG_TEXT else "all"


def _compare_picker(prepared: prep.PreparedText, layer: int, head: int):
    """A second head to show under the first (bertviz-style side by side), or None."""
    heads = [(lay, hd) for lay in range(prepared.num_layers)
             for hd in range(prepared.num_heads) if (lay, hd) != (layer, head)]
    return st.selectbox("Compare with another head", [None, *heads], key="w_compare",
                        format_func=lambda lh: "—" if lh is None else f"L{lh[0]}·H{lh[1]}")


def _pick_from_mosaic() -> None:
    """A click on a model-view tile opens that head (the tile's customdata is (layer, head))."""
    selection = st.session_state.get("w_model_view") or {}
    points = selection.get("selection", {}).get("points", [])
    if points and points[0].get("customdata") is not None:
        layer, head = points[0]["customdata"]
        shell.update_view(layer=int(layer), head=int(head))


def _model_view(prepared: prep.PreparedText, preds, scores, state) -> None:
    """Every head's pattern at once (bertviz's model view, with gold vs predicted)."""
    kind = st.radio("Model view: every head's", ["diff", "gold", "predicted"], horizontal=True,
                    key="w_model_view_kind")
    codes = tables.heads_codes(prepared.record, preds, kind)
    values = getattr(scores, state.overview).numpy()
    st.plotly_chart(thumbnails.heads_figure(codes, kind, (state.layer, state.head), values,
                                            state.overview, live.softmax_layers(scores)),
                    config=common_figures.chart_config(f"model_view_{kind}"),
                    key="w_model_view", on_select=_pick_from_mosaic, selection_mode="points")
    st.caption("Click a tile to open that head. Diff colours as above.")


def _cluster_outline(ctx: shell.AppContext, state: urlstate.ViewState, figure,
                     labels: list[str]) -> str | None:
    """Outline the cluster picked on the Clusters page (k-means only); the caption to show,
    or None when no cluster is picked."""
    cluster = shell.selected_cluster()
    if cluster is None:
        return None
    prepared = ctx.prepared
    clusters = int(state.clusters)
    if live.effective_method(state, prepared) != "kmeans":
        return (f"Cluster {cluster} is selected on the Clusters page; choose the k-means "
                "method to highlight its edges.")
    if cluster >= clusters:
        return f"Cluster {cluster} does not exist with B={clusters}; nothing highlighted."
    rows, edges = exclusters.cluster_highlight(prepared, state.layer, state.head, clusters,
                                          state.top_k, cluster)
    graph_figures.outline_cluster(figure, edges.numpy(), rows.numpy(), cluster, labels)
    return (f"highlighting cluster {cluster} (B={clusters}, k={state.top_k}): ▸ its queries, "
            f"□ its {int(edges.sum())} edges (query and key both in cluster {cluster}).")


def _picked_pair(state: urlstate.ViewState, figure, labels: list[str],
                 shown: slice) -> str | None:
    """Ring the query–key pair picked on the Learned space page when it is in this head, row
    and window; the caption to show, or None."""
    picked = st.session_state.get(shell.PAIR_KEY)
    if picked is None or tuple(picked[:3]) != (state.layer, state.head, state.query):
        return None
    query, key = picked[2], picked[3]
    start, stop, _ = shown.indices(len(labels))
    if not (start <= query < stop and start <= key < stop):
        return None
    graph_figures.mark_pair(figure, query - start, key - start,
                            f"q{labels[query]} -> k{labels[key]}")
    return (f":violet[◯] the pair picked on Learned space: query {labels[query]} → key "
            f"{labels[key]}.")


def _edges_csv(prepared: prep.PreparedText, layer: int, head: int, pred) -> bytes:
    return tables.to_csv(tables.edges_frame(prepared.record, layer, head, pred))


ctx = shell.context()
st.caption("One head's gold graph (α-entmax probability > 0), the predicted graph and their "
           "diff; sliders re-predict on cached vectors (the model does not rerun).")
if shell.show_messages(ctx):
    explorer()
