"""A model of the local Hugging Face cache, in a real browser and offline: the model box names
it, typing it shows its gold graphs with the training-free methods, and "Prepare predictors
for this model" runs `sparsefinder prepare` in the background (a separate process, not a
model run of the server) with a progress bar, after which its learned methods are on.

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
    server_env = {"HF_HUB_CACHE": str(cache),  # the server process reads them at start
                  "SPARSEFINDER_CACHE_DIR": str(tmp_path_factory.mktemp("user-cache")),
                  "SPARSEFINDER_PREPARE_MAX_PASSAGES": "12"}
    before = {key: os.environ.get(key) for key in server_env}
    os.environ.update(server_env)
    try:
        url, stop = start_server()
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value
    yield url
    stop()


def _shot(page, name: str) -> None:
    """A screenshot for the notes when SPARSEFINDER_SHOTS names a folder."""
    folder = os.environ.get("SPARSEFINDER_SHOTS")
    if folder:
        page.screenshot(path=os.path.join(folder, name))


def test_own_model_from_the_cache_in_a_real_browser(cached_server, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 800})
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
        _shot(page, "prepare_1_own_model.png")
        page.get_by_role("button", name="Prepare predictors for this model").click()
        bar = page.get_by_text("Preparing predictors: stage")
        bar.first.wait_for(timeout=60_000)  # the job's stage and time left
        _shot(page, "prepare_2_progress.png")
        page.get_by_text("Gold L", exact=False).first.wait_for()  # the page still works
        page.get_by_text("Learned methods from this model's prepared bundle").wait_for(
            timeout=400_000)  # the job ended: the page reran with its bundle
        wait_until_idle(page)
        assert page.get_by_text("No projections file for this model").count() == 0
        assert page.get_by_text("Preparing predictors failed").count() == 0
        assert page_problems(page) == []
        _shot(page, "prepare_3_learned_methods.png")
    finally:
        page.close()
