"""The bundle manifests match the files, and the loader reads them (sparsefinder.bundle)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from sparsefinder import bundle_manifest
from sparsefinder.bundle import (
    KINDS,
    MANIFEST,
    BundleError,
    assets_root,
    bundle,
    coref_probes,
    examples_dir,
    narrative_holdout,
    shared,
)
from sparsefinder.bundle_manifest import main
from sparsefinder.calibration.table import CalibrationTable
from sparsefinder.files import file_sha256
from sparsefinder.models.loading import DEFAULT_MODEL_ID
from sparsefinder.projections.heads import HeadProjections

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets"
NOT_LISTED = {MANIFEST, "__init__.py", "__pycache__"}


def _on_disk(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and not NOT_LISTED & set(p.relative_to(folder).parts)}


def test_the_source_tree_reads_its_own_assets() -> None:
    assert assets_root() == ASSETS
    assert examples_dir() == ASSETS / "examples" and coref_probes() == ASSETS / "coref_probes.json"
    assert narrative_holdout() == ASSETS / "narrative_holdout.txt"


def test_the_narrative_holdout_is_story_and_news_prose_of_the_stated_size() -> None:
    from sparsefinder.data.corpus import load_texts

    passages = load_texts(narrative_holdout())
    words = [len(p.split()) for p in passages]
    assert len(passages) >= 30 and min(words) >= 60 and max(words) <= 200
    assert len(set(passages)) == len(passages)
    assert shared().file("narrative hold-out").details == {"passages": len(passages)}


def test_every_file_is_listed_with_its_size_and_sha256() -> None:
    """A rebuilt asset without a manifest update fails here (`make assets` rewrites it)."""
    default = bundle()
    assert {f.name for f in default.files()} == _on_disk(ASSETS / "default")
    assert {f.name for f in shared().files()} == _on_disk(ASSETS) - {
        f"default/{name}" for name in _on_disk(ASSETS / "default")}
    for b in (default, shared()):
        for f in b.files():
            assert f.path.stat().st_size == f.bytes, f.name
            assert file_sha256(f.path) == f.sha256, f"{f.name}: rewrite the manifest"
        assert b.verify() == []


def test_the_manifests_are_what_the_files_give_now() -> None:
    """Kinds, purposes, fingerprints, details and rebuild commands too, not only the bytes."""
    assert bundle_manifest.check_manifests(ASSETS) == []
    for path, text in bundle_manifest.manifests(ASSETS).items():
        assert path.read_text(encoding="utf-8") == text, path


def test_each_file_says_what_it_is_and_what_it_was_built_for() -> None:
    default = bundle()
    assert default.model_id == DEFAULT_MODEL_ID
    assert {f.kind for f in default.files()} == set(KINDS)
    for f in default.files():
        assert f.purpose and "\n" not in f.purpose, f.name
        assert re.fullmatch(r"[0-9a-f]{64}", f.sha256)
        assert f.built_for["alpha"] == 1.5, f.name
        if f.kind == "adapter":
            assert f.built_for["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
            assert re.fullmatch(r"[0-9a-f]{64}", f.built_for["base_fingerprint"])
        else:
            assert f.built_for["model_id"] == DEFAULT_MODEL_ID, f.name


def test_rebuild_commands_are_the_makefiles() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    recipes = dict(re.findall(r"^([\w-]+):[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.M))
    looped = {"--rank", "--objective", "--block", "--filename"}  # values from `for` loops
    for f in bundle().files():
        recipe = " ".join(recipes[f.make].split())
        command = next(c for c in f.rebuild.split(" && ") if c.startswith("sparsefinder "))
        assert f"$(BIN)/{' '.join(command.split()[:2])} " in recipe, (f.name, f.make)
        assert "$(BIN)/python -m sparsefinder.bundle_manifest --write" in recipe, f.make
        for flag, value in re.findall(r"(--[\w-]+) (\S+)", command):
            if flag == "--out" and value.startswith("assets/default"):
                assert "--out assets/default" in recipe, f.name  # the file name may be looped
            elif flag not in looped:
                assert f"{flag} {value}" in recipe, (f.name, flag, value)


def test_best_projections_are_the_calibration_tables_and_centroids_the_shared_ones() -> None:
    default = bundle()
    table = CalibrationTable.load(default.path("calibration"))
    assert default.best("projections").name == table.projections_file \
        == "projections-r8-lowrank-mass.pt"
    assert default.best() == default.best("projections") == default.path("projections")
    centroids = HeadProjections.load(default.best("centroids"))
    assert default.best("centroids").name == "projections.pt"
    assert centroids.kind == "shared" and sorted(centroids.centroids) == [2, 4, 6, 8, 10, 12,
                                                                           16, 20]
    assert "calibration table" in default.why_best("projections")


def test_lookups_by_name_and_kind_and_their_errors() -> None:
    default = bundle()
    assert default.path("calibration") == ASSETS / "default" / "calibration.pt"
    assert default.path("projections-r4-logistic.pt").is_file()
    assert [f.details["block"] for f in default.files("block projections")] == [16, 32]
    with pytest.raises(BundleError, match="has 2 block projections files .*name one"):
        default.path("block projections")
    with pytest.raises(BundleError, match="neither a file nor a kind.*--write"):
        default.path("projections-r16.pt")
    with pytest.raises(BundleError, match="no 'tokenizer' files"):
        default.files("tokenizer")
    with pytest.raises(BundleError, match="marks no best file for 'speed'"):
        default.best("speed")
    with pytest.raises(BundleError, match="no bundle 'gpt2' .*bundles: default"):
        bundle("gpt2")
    assert shared().path("coreference probes") == coref_probes()


@pytest.fixture()
def copy(tmp_path: Path) -> Path:
    root = tmp_path / "assets"
    shutil.copytree(ASSETS, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_a_rebuilt_asset_is_caught_until_the_manifest_is_rewritten(copy: Path, capsys) -> None:
    proj = HeadProjections.load(copy / "default" / "projections.pt")
    proj.metadata["rebuilt"] = True
    proj.save(copy / "default" / "projections.pt")
    (problem,) = bundle(root=copy).verify()
    assert problem.startswith("projections.pt: ")
    assert main(["--check", "--root", str(copy)]) == 1
    assert "default/projections.pt: bytes, sha256 changed" in capsys.readouterr().out
    assert main(["--write", "--root", str(copy)]) == 0
    assert bundle(root=copy).verify() == [] and main(["--check", "--root", str(copy)]) == 0
    (copy / "default" / "extra.pt").write_bytes(b"x")
    with pytest.raises(BundleError, match="no rule for bundled file 'extra.pt'"):
        bundle_manifest.check_manifests(copy)


def test_a_missing_or_damaged_manifest_is_a_clear_error(copy: Path) -> None:
    (copy / "default" / "calibration.pt").unlink()
    assert bundle(root=copy).verify() == ["calibration.pt: listed but missing"]
    (copy / "default" / MANIFEST).write_text("{not json", encoding="utf-8")
    with pytest.raises(BundleError, match="not a readable manifest.*--write"):
        bundle(root=copy)
    (copy / "default" / MANIFEST).write_text(json.dumps({"format": "x"}), encoding="utf-8")
    with pytest.raises(BundleError, match="not a sparsefinder-bundle manifest"):
        bundle(root=copy)
    (copy / "default" / MANIFEST).write_text(json.dumps(
        {"format": "sparsefinder-bundle", "format_version": 9}), encoding="utf-8")
    with pytest.raises(BundleError, match="manifest format version 9"):
        bundle(root=copy)
