"""The Explorer's token window on long texts: the range slider of the tokens shown, the search
box that moves it to a word, and the block overview of the whole head whose strip recentres
it. Split from the Explorer page (one job: which tokens the panels show)."""

from __future__ import annotations

import streamlit as st

from sparsefinder.explore import long_view
from sparsefinder.figures import blocks as block_figures
from sparsefinder.figures import common as common_figures
from sparsefinder.figures import graphs as graph_figures


def token_range(record) -> slice:
    """All tokens, or (long texts) a window chosen with a range slider: a narrower window has
    bigger cells and labels more of its tokens, so a 512-token head stays readable. Texts
    longer than ``long_view.LONG_TEXT`` open on their first 256 tokens, with a search box
    that moves the window to a word."""
    n = record.n_tokens
    if n <= graph_figures.ALL_TICKS:
        return slice(None)
    if st.session_state.get("_w_token_range_n") != n or "w_token_range" not in st.session_state:
        st.session_state["w_token_range"] = long_view.default_window(n)  # a new text
        st.session_state["_w_token_range_n"] = n
    if n > long_view.LONG_TEXT:
        st.text_input("Find a token (moves the window to its first occurrence)",
                      key="w_token_search", on_change=_search_tokens, args=(record,),
                      placeholder="a word of the text")
        if st.session_state.get("_w_token_search_note"):
            st.caption(st.session_state["_w_token_search_note"])
    start, end = st.slider("Tokens shown (fewer: bigger cells, more labels)",
                           0, n, key="w_token_range")
    return slice(None) if (start, end) == (0, n) else slice(start, max(end, start + 1))


def _window_size(n: int) -> int:
    start, end = st.session_state.get("w_token_range", long_view.default_window(n))
    return max(1, end - start)


def _search_tokens(record) -> None:
    """Move the window to the first token matching the search box (callback)."""
    query = st.session_state.get("w_token_search", "")
    hits = long_view.find_tokens(record, query)
    n = record.n_tokens
    if not query.strip():
        st.session_state["_w_token_search_note"] = ""
        return
    if not hits:
        st.session_state["_w_token_search_note"] = f"No token matches {query!r}."
        return
    st.session_state["w_token_range"] = long_view.window_around(hits[0], n, _window_size(n))
    more = f"; also at {', '.join(map(str, hits[1:6]))}" + (" …" if len(hits) > 6 else "")
    st.session_state["_w_token_search_note"] = (
        f"{query!r}: token {hits[0]}" + (more if len(hits) > 1 else "") + ".")


def _pick_block() -> None:
    """A click on the block overview's query-block strip centres the window on that block
    (a heatmap cell returns no point; only the strip's markers carry a position)."""
    selection = st.session_state.get("w_block_overview") or {}
    points = selection.get("selection", {}).get("points", [])
    n = st.session_state.get("_w_token_range_n")
    if (points and points[0].get("curve_number") == block_figures.STRIP_TRACE
            and points[0].get("customdata") is not None and n):
        st.session_state["w_token_range"] = long_view.window_around(
            int(points[0]["customdata"]), n, _window_size(n))


def block_overview(record, preds, layer: int, head: int) -> None:
    """The whole head at block level, with the shown window outlined (long texts)."""
    overview = long_view.block_overview(record.layers[layer].gold_of(head), preds[layer][head])
    n = record.n_tokens
    window = st.session_state.get("w_token_range", long_view.default_window(n))
    st.markdown(f"**Whole head L{layer}H{head}, by blocks of {overview.block} tokens** · "
                "colour: recall in the block; click a ▸ left of a row to show its queries")
    st.plotly_chart(block_figures.block_overview_figure(overview, tuple(window)),
                    config=common_figures.chart_config(f"blocks_L{layer}H{head}"),
                    key="w_block_overview", on_select=_pick_block, selection_mode="points")
