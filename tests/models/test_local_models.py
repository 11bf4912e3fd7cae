"""Only models that load offline are listed: complete hub-cache snapshots and model folders."""

from __future__ import annotations

from pathlib import Path

from sparsefinder.models.local_models import hub_cache_models, is_model_folder, local_models


def _snapshot(cache: Path, repo_id: str, files: tuple[str, ...]) -> Path:
    """A hub-cache layout (models--org--name/refs, blobs, snapshots) holding ``files``."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for index, name in enumerate(files):
        blob = repo / "blobs" / f"{index:040x}"
        blob.write_text("{}")
        (snapshot / name).symlink_to(blob)
    return snapshot


def test_own_model_hub_cache_lists_complete_snapshots_only(tmp_path):
    _snapshot(tmp_path, "org/complete", ("config.json", "model.safetensors", "tokenizer.json"))
    _snapshot(tmp_path, "org/config-only", ("config.json",))
    _snapshot(tmp_path, "org/no-tokenizer", ("config.json", "model.safetensors"))
    listed = hub_cache_models(tmp_path)
    assert [m.name for m in listed] == ["org/complete"]
    assert listed[0].source == "hub cache" and Path(listed[0].detail).is_dir()


def test_own_model_missing_cache_lists_nothing(tmp_path):
    assert hub_cache_models(tmp_path / "absent") == []


def test_own_model_list_has_the_bundled_model_and_real_folders_only(tmp_path, tiny_model_dirs):
    listed = local_models([tiny_model_dirs["bert"], tmp_path], cache_dir=tmp_path / "none")
    assert listed[0].name == "default" and listed[0].source == "bundled"
    assert [m.name for m in listed[1:]] == [str(tiny_model_dirs["bert"])]
    assert not is_model_folder(tmp_path)
