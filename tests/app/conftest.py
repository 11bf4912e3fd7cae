"""AppTest helpers: the app script, a fresh cache per test, fake projections on demand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, Path(__file__).resolve().parent):  # `app` package; apptest_helpers
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


@pytest.fixture(autouse=True)
def fresh_streamlit_caches():
    """Every test starts without cached models/texts (the library keeps torch warm)."""
    import streamlit as st

    st.cache_resource.clear()
    yield
    st.cache_resource.clear()


@pytest.fixture(scope="session")
def default_projections_file(tmp_path_factory) -> Path:
    from apptest_helpers import random_projections

    from sparsefinder.models.loading import DEFAULT_MODEL_ID

    return random_projections(DEFAULT_MODEL_ID).save(
        tmp_path_factory.mktemp("proj") / "projections.pt")


@pytest.fixture
def with_projections(monkeypatch, default_projections_file):
    """The default model with (random) projections, whatever assets/ holds right now."""
    from app import shell

    monkeypatch.setattr(shell, "DEFAULT_PROJECTIONS", default_projections_file)
    return default_projections_file


@pytest.fixture
def without_projections(monkeypatch, tmp_path):
    from app import shell

    monkeypatch.setattr(shell, "DEFAULT_PROJECTIONS", tmp_path / "missing.pt")


@pytest.fixture(scope="module")
def server(request) -> str:
    """The app served by `streamlit run` on a free port (browser tests); one per module."""
    from browser_helpers import start_server

    url, stop = start_server()
    request.addfinalizer(stop)
    return url


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium through Playwright, shared by a module's tests."""
    from browser_helpers import CHROMIUM, CHROMIUM_ARGS
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()
