"""Safe to serve (issue 16): the sidebar's refusals are clear messages, never a traceback.

Exposure is what the running server is bound to (Streamlit's ``server.address``); tests set
that option as `make run HOST=0.0.0.0` would and restore it. Sidebar widgets are pre-set
through session state before the first run, as in test_bad_inputs.py.
"""

from __future__ import annotations

import tempfile

import pytest
from apptest_helpers import assert_clean, assert_head_graphs, new_app

from sparsefinder import serving
from sparsefinder.models.loading import default_model_path


def _messages(at) -> str:
    return " ".join(e.value for e in [*at.error, *at.warning, *at.info])


@pytest.fixture
def exposed(monkeypatch):
    """The app as served by `make run HOST=0.0.0.0` (or the Docker image)."""
    from streamlit import config

    monkeypatch.delenv(serving.ENV_ALLOWLIST, raising=False)
    before = config.get_option("server.address")
    config.set_option("server.address", "0.0.0.0")
    yield monkeypatch
    config.set_option("server.address", before)


def _custom(name: str, **state: str):
    at = new_app()
    at.session_state["w_model_kind"] = "custom"
    at.session_state["w_model_name"] = name
    for key, value in state.items():
        at.session_state[key] = value
    return at.run()


def test_text_over_the_cap_is_refused_with_the_numbers(without_projections):
    limit = serving.DEFAULT_MAX_TEXT_CHARS
    at = new_app()
    at.session_state["w_source"] = "paste"
    at.session_state["w_paste"] = "word " * (limit // 5) + "!"
    at.run()
    assert_clean(at)
    errors = " ".join(e.value for e in at.error)
    assert "too long" in errors and f"{limit + 1:,} characters" in errors
    assert f"limit is {limit:,}" in errors
    assert not at.get("plotly_chart")


def test_exposed_server_loads_only_allowlisted_models(exposed, without_projections):
    folder = str(default_model_path())
    at = _custom(folder)
    assert_clean(at)
    errors = " ".join(e.value for e in at.error)
    assert "not on this server's allowlist" in errors and serving.ENV_ALLOWLIST in errors
    assert not at.get("plotly_chart")
    assert "w_proj_path" not in [w.key for w in at.text_input]  # no server-side paths typed
    missing = _custom("/no/such/folder")  # the same answer: nothing to learn about folders
    assert "not on this server's allowlist" in " ".join(e.value for e in missing.error)
    assert "not found" not in _messages(missing)

    exposed.setenv(serving.ENV_ALLOWLIST, f"some/other-model, {folder}/")
    at = _custom(folder)
    assert_clean(at)
    assert not at.error
    assert "Models on this server: default, some/other-model" in " ".join(
        c.value for c in at.caption)
    assert_head_graphs(at)


def test_localhost_missing_folder_says_folder_not_found(without_projections):
    at = _custom("/no/such/sparsefinder/model")
    assert_clean(at)
    errors = " ".join(e.value for e in at.error)
    assert "Model not loaded" in errors and "folder not found" in errors
    assert "Repo id" not in errors
    assert "w_proj_path" in [w.key for w in at.text_input]  # localhost: paths still work


def test_model_that_does_not_fit_in_memory_is_refused(monkeypatch, without_projections):
    from sparsefinder.models import loading as models

    monkeypatch.setattr(models, "available_memory_bytes", lambda: 16 * 1024 * 1024)
    at = new_app().run()
    assert_clean(at)
    errors = " ".join(e.value for e in at.error)
    assert "Model not loaded" in errors and "needs about 87 MB" in errors
    assert "only 16 MB of memory is free" in errors
    assert not at.get("plotly_chart")


def _upload_projections(at, name: str, data: bytes):
    uploader = [u for u in at.get("file_uploader") if "projections" in u.label]
    assert uploader, "no projections uploader in the sidebar"
    uploader[0].set_value((name, data, "application/octet-stream"))
    return at.run()


def test_corrupt_projections_upload_says_so_without_internals(without_projections):
    at = _custom(str(default_model_path()))
    at = _upload_projections(at, "my projections.pt", b"PK\x03\x04 not really a zip" * 10)
    assert_clean(at)
    text = _messages(at)
    assert "my projections.pt is corrupt or truncated" in text
    assert tempfile.gettempdir() not in text  # never the server's temporary path
    assert "PytorchStreamReader" not in text and "zip archive" not in text
    assert_head_graphs(at)  # gold graphs still drawn


def test_oversized_projections_upload_is_refused_before_loading(monkeypatch,
                                                                without_projections):
    monkeypatch.setenv(serving.ENV_MAX_PROJECTIONS_MB, "1")
    at = _custom(str(default_model_path()))
    at = _upload_projections(at, "huge.pt", b"\0" * (1024 * 1024 + 1))
    assert_clean(at)
    text = _messages(at)
    assert "huge.pt is too large for a projections file" in text and "limit is 1 MB" in text
    assert "corrupt" not in text  # refused from its size: torch never read it
