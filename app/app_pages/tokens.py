"""Token view: for one query token, which keys each head of a layer attends to.

Only the selected row of every (n × n) matrix is drawn, bertviz-style, so a 512-token text
stays readable: bars are gold probabilities, ticks under them mark predicted (TP/FP) and
missed (FN) keys.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import streamlit as st
from torch import Tensor

from app import shell
from sparsefinder.data.records import AttentionRecord
from sparsefinder.explore import head_lines, inputs, tables
from sparsefinder.figures import common as common_figures
from sparsefinder.figures import graphs as graph_figures
from sparsefinder.figures import head_lines as head_lines_figures

st.title("Token view")

#: The head view: drawn in the browser; a click on a token comes back as the ``token`` event.
_head_view = st.components.v2.component(
    "sparsefinder.head_view", js=head_lines_figures.COMPONENT_JS, css=head_lines_figures.CSS)


def _step_query(delta: int, n: int) -> None:
    shell.update_view(query=(shell.view_state().query + delta) % n)


@st.fragment
def token_view() -> None:
    ctx = shell.context()
    if not ctx.ready:
        return
    record = ctx.prepared.record
    labels = inputs.token_labels(record)
    shell.method_sliders(ctx)
    cols = st.columns([1, 3, 1, 1, 2], vertical_alignment="bottom")
    cols[0].selectbox("Layer", range(record.num_layers), **shell.bind("w_layer", "layer"))
    cols[1].selectbox("Token", range(record.n_tokens), format_func=labels.__getitem__,
                      **shell.bind("w_query", "query"))
    shell.seed("w_direction", "row")
    direction = cols[4].radio("Direction", ["row", "column"], key="w_direction",
                              horizontal=True,
                              format_func={"row": "attends to (row)",
                                           "column": "attended by (column)"}.get)
    cols[2].button("◀ Prev", key="w_qprev", on_click=_step_query, help="Previous token",
                   args=(-1, record.n_tokens), width="stretch")
    cols[3].button("Next ▶", key="w_qnext", on_click=_step_query, help="Next token",
                   args=(1, record.n_tokens), width="stretch")
    state = shell.view_state()
    preds, _ = shell.predictions(ctx, state)
    frame = tables.token_row_frame(record, preds, state.layer, state.query, direction)
    summary = tables.token_row_summary(frame)
    row_recall = float(summary["recall"].mean())
    a, b, c = st.columns(3)
    a.metric("Row recall (mean over heads)", f"{row_recall:.3f}")
    b.metric("Gold keys per head", f"{summary['gold_edges'].mean():.1f}")
    c.metric("Predicted keys per head", f"{summary['predicted_edges'].mean():.1f}")
    heads = list(range(record.num_heads))
    lines_view(record, preds, state.layer, state.query, direction)
    st.plotly_chart(graph_figures.token_figure(frame, labels, state.query, heads, direction),
                    config=common_figures.chart_config(f"token_L{state.layer}_q{state.query}"),
                    key="w_fig_tokens")
    left, right = st.columns([3, 1])
    left.dataframe(summary, hide_index=True, width="stretch")
    right.download_button(
        "This row, every head (CSV)", functools.partial(tables.to_csv, frame),
        file_name=f"token_L{state.layer}_q{state.query}.csv", mime="text/csv",
        on_click="ignore", key="w_dl_tokens")


def _pick_token(n_tokens: int) -> None:
    """A click in the head view selects that token for the page and the link (a key on the
    right: its column)."""
    result = st.session_state.get("w_head_view")
    value = result.get("token") if hasattr(result, "get") else getattr(result, "token", None)
    picked = head_lines.picked_token(value, n_tokens)
    if picked is not None:
        query, direction = picked
        st.session_state["w_direction"] = direction
        shell.update_view(query=query)


def lines_view(record: AttentionRecord, preds: Sequence[Tensor], layer: int,
               query: int, direction: str = "row") -> None:
    """bertviz's head view for a window of tokens around the selected one, gold vs predicted:
    the selected token's lines are drawn at once; hovering runs in the browser (no rerun per
    hover), a click selects a token."""
    shell.seed("w_lines_window", head_lines.DEFAULT_WINDOW)
    size = st.slider("Head view: tokens shown around the selected one", 8,
                     head_lines.MAX_WINDOW, key="w_lines_window",
                     help="Queries on the left, keys on the right; each token's tooltip "
                          "counts its gold edges that leave this window.")
    start, stop = head_lines.window_bounds(record.n_tokens, query, size)
    lines = head_lines.head_lines(record, preds, layer, start, stop)
    side = "query" if direction == "row" else "key"
    with st.container(key="w_head_lines"):
        _head_view(key="w_head_view", data=head_lines_figures.view_data(lines, query, side),
                   height=head_lines_figures.page_height(lines),
                   on_token_change=functools.partial(_pick_token, record.n_tokens))


ctx = shell.context()
st.caption("Pick a token (here, or click it in the head view): per head, which keys the gold "
           "graph and the predictor keep.")
if shell.show_messages(ctx):
    token_view()
