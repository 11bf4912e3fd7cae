"""The model box suggests only models that load offline: the local hub cache's, or a folder."""

from __future__ import annotations

from apptest_helpers import assert_clean, new_app


def _cache_with(tmp_path, repo_id: str):
    """A hub cache holding one complete snapshot of ``repo_id``."""
    repo = tmp_path / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / ("ab" * 20)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("ab" * 20)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (snapshot / name).write_text("{}")
    return tmp_path


def _run_custom(monkeypatch, cache):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    at = new_app()
    at.session_state["w_model_kind"] = "custom"
    at.session_state["w_model_name"] = ""
    return at.run()


def test_own_model_box_names_the_cached_models_only(tmp_path, monkeypatch):
    at = _run_custom(monkeypatch, _cache_with(tmp_path, "someone/tiny-entmax"))
    assert_clean(at)
    box = at.text_input(key="w_model_name")
    assert box.placeholder == "e.g. someone/tiny-entmax or /path/to/model"
    assert any("someone/tiny-entmax" in c.value for c in at.caption)
    assert "bert-base-uncased" not in box.placeholder


def test_own_model_box_without_a_cache_suggests_a_folder(tmp_path, monkeypatch):
    at = _run_custom(monkeypatch, tmp_path / "no-cache")
    assert_clean(at)
    assert at.text_input(key="w_model_name").placeholder.startswith("a model folder")
    assert any("No model in the local Hugging Face cache" in c.value for c in at.caption)
