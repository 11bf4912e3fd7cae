"""A model of the local Hugging Face cache, in a real browser and offline: the model box names
it, and typing it shows its gold graphs with the training-free methods.

Marked ``browser``; skipped (with the reason) only when /usr/bin/chromium is missing.
"""

from __future__ import annotations

import os

import pytest
from browser_helpers import CHROMIUM, SKIP_REASON, page_problems, start_server, wait_until_idle

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=SKIP_REASON),
]

REPO_ID = "someone/tiny-entmax-bert"


@pytest.fixture(scope="module")
def cached_server(tmp_path_factory, default_tokenizer):
    """The app served with a hub cache holding one complete snapshot: a tiny random BERT that
    reads 128 tokens (a 64-position model trips the app's text parts, a separate bug)."""
    import torch
    from transformers import AutoModel, BertConfig

    cache = tmp_path_factory.mktemp("hub")
    repo = cache / ("models--" + REPO_ID.replace("/", "--"))
    commit = "ab" * 20
    snapshot = repo / "snapshots" / commit
    torch.manual_seed(0)
    config = BertConfig(vocab_size=default_tokenizer.vocab_size, hidden_size=32,
                        num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=128, initializer_range=0.5)
    AutoModel.from_config(config).save_pretrained(snapshot)
    default_tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    before = os.environ.get("HF_HUB_CACHE")
    os.environ["HF_HUB_CACHE"] = str(cache)  # the server process reads it at start
    try:
        url, stop = start_server()
    finally:
        if before is None:
            os.environ.pop("HF_HUB_CACHE")
        else:
            os.environ["HF_HUB_CACHE"] = before
    yield url
    stop()


def test_own_model_from_the_cache_in_a_real_browser(cached_server, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(cached_server, timeout=240_000)
        wait_until_idle(page)
        page.get_by_text("Other", exact=True).first.click()
        box = page.get_by_label("Model id or folder")
        box.wait_for(timeout=120_000)
        assert box.get_attribute("placeholder") == f"e.g. {REPO_ID} or /path/to/model"
        box.fill(REPO_ID)
        box.press("Enter")
        page.wait_for_selector(r"text=/Gold L\d+H\d+/", timeout=240_000)  # its gold graph
        wait_until_idle(page)
        assert page_problems(page) == []
        assert page.get_by_text("No projections file for this model").count() == 1
    finally:
        page.close()
