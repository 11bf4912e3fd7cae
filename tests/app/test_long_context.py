"""The app on a long-context decoder (tiny random Qwen2, 4096 positions) with a long text."""

from __future__ import annotations

import base64

import pytest
from apptest_helpers import assert_clean, assert_head_graphs, figures, new_app

from sparsefinder.data.long_context import long_texts
from sparsefinder.explore.long_view import DEFAULT_WINDOW
from sparsefinder.models.decoders import save_tiny_decoder
from sparsefinder.models.loading import load_model

N_TOKENS = 1600  # > 1024: the bounded-memory extraction path, > 512: the long-text view


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    return save_tiny_decoder("qwen2", tmp_path_factory.mktemp("long") / "qwen2",
                             max_positions=4096)


@pytest.fixture(scope="module")
def long_text(long_model):
    tokenizer = load_model(str(long_model), device="cpu").tokenizer
    return long_texts(tokenizer, N_TOKENS, 1, "train")[0]


def _paste(at, text: str):
    at.run()
    at.radio(key="w_source").set_value("paste").run()
    at.text_area(key="w_paste").input(text).run()
    return at


def test_long_text_on_a_long_context_model_opens_on_a_window_with_block_overview(
        long_model, long_text, without_projections):
    at = _paste(new_app(model=str(long_model), method="window", window="3"), long_text)
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    assert any("at most **4096 tokens**" in c.value for c in at.sidebar.caption)
    assert not [w.value for w in at.warning if "too long" in w.value]  # nothing truncated
    start, end = at.slider(key="w_token_range").value
    assert (start, end) == (0, DEFAULT_WINDOW)
    head = assert_head_graphs(at)
    # a long text names edges' tokens on the diff panel only (fewer markers to redraw)
    assert {t["xaxis"] for t in head["data"] if t["type"] == "scattergl"} == {"x3"}
    assert any("Hover an edge of the diff panel" in c.value for c in at.caption)
    assert any(f"tokens 0–{DEFAULT_WINDOW - 1}" in a["text"]
               for a in head["layout"]["annotations"])
    blocks = [f for f in figures(at) if "key block" in str(f["layout"].get("xaxis", {}))]
    assert len(blocks) == 1
    recall, _, strip = blocks[0]["data"]
    assert recall["type"] == "heatmap" and strip["type"] == "scatter"
    rows = -(-N_TOKENS // 32)  # one clickable strip marker per 32-token query block
    assert len(base64.b64decode(strip["y"]["bdata"])) == 4 * rows
    # the search box moves the window to a word far into the text
    late = int(0.75 * len(long_text))
    word = next(w for w in long_text[late:].split()
                if w.isalpha() and len(w) > 5 and long_text.find(w) >= late)
    at.text_input(key="w_token_search").input(word).run()
    assert_clean(at)
    start, end = at.slider(key="w_token_range").value
    assert end - start == DEFAULT_WINDOW and start > 0
    assert any(word.lower() in c.value.lower() for c in at.caption)
    at.text_input(key="w_token_search").input("zzzqqq-not-there").run()
    assert any("No token matches" in c.value for c in at.caption)
    # a live slider still works on the long text
    at.select_slider(key="w_window").set_value(5).run()
    assert_clean(at)
    # the Quest baseline is in the method menu and runs from the model's own q/k
    at.selectbox(key="w_method").set_value("quest").run()
    assert_clean(at)
    sparse = float(at.metric[1].value)
    at.slider(key="w_pages").set_value(32).run()
    assert_clean(at)
    assert at.query_params["pages"] == ["32"] or at.query_params["pages"] == "32"
    assert float(at.metric[1].value) < sparse  # more pages, less sparse


def test_default_model_limit_is_shown_and_a_long_text_is_shown_in_parts(without_projections):
    at = _paste(new_app(method="window"), "word " * 900)
    assert_clean(at)
    assert any("at most **512 tokens**" in c.value for c in at.sidebar.caption)
    assert any("900 tokens" in w.value and "2 parts" in w.value for w in at.warning)
    start, end = at.slider(key="w_token_range").value
    assert start == 0 and 448 <= end <= 512  # the first part: at most the model's limit
