"""`sparsefinder prepare` end to end on tiny random models: the bundle, the resume, the
refusals (corrupt bundle, model not cached offline, corpus too small)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sparsefinder.calibration.curves import DEFAULT_FLOOR, DEFAULT_FLOOR_SHARE
from sparsefinder.calibration.table import CalibrationTable
from sparsefinder.cli import main
from sparsefinder.learned_parts import LearnedParts
from sparsefinder.methods.spec import PredictorSpec
from sparsefinder.model_bundles import find_bundle, model_fingerprint, prepared_file
from sparsefinder.models.decoders import save_tiny_decoder
from sparsefinder.models.loading import load_model
from sparsefinder.prepare import MIN_TRAIN_TEXTS, PROJECTIONS, STAGES

#: Passages of each split: enough texts to calibrate, few enough for a quick run.
PASSAGES = "24"


def _prepare(model: Path | str, out: Path, *extra: str) -> int:
    return main(["prepare", "--model", str(model), "--device", "cpu", "--max-passages",
                 PASSAGES, "--out", str(out), *extra])


@pytest.fixture(scope="module")
def bert_bundle(tiny_model_dirs, tmp_path_factory):
    """The tiny BERT prepared in two runs: stopped after the codebooks, then resumed."""
    out = tmp_path_factory.mktemp("bundles")
    model = tiny_model_dirs["bert"]
    assert _prepare(model, out, "--stop-after", "codebooks") == 0
    loaded = load_model(str(model), device="cpu")
    folder = out / model_fingerprint(loaded)
    before = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.pt")}
    assert _prepare(model, out) == 0
    return model, loaded, out, folder, before


def test_prepare_writes_a_bundle_the_lookup_finds(bert_bundle) -> None:
    model, loaded, out, folder, _ = bert_bundle
    found = find_bundle(loaded, out)
    assert found is not None and found.folder == folder
    assert found.verify() == []
    assert found.model_id == str(model) and found.manifest["fingerprint"] == folder.name
    assert set(found.kinds()) == {"projections", "calibration", "key codebooks", "hash codes"}
    assert found.best("projections").name == PROJECTIONS
    assert found.manifest["prepared"]["stages"] == [name for name, _ in STAGES]
    atlas = json.loads((folder / "atlas" / "atlas.json").read_text())
    assert atlas  # the atlas of the validation split, with the calibrated predictor
    assert not (folder / ".work").exists()  # the train gold graphs are dropped at the end


def test_prepare_bundle_builds_the_calibrated_methods(bert_bundle) -> None:
    _, loaded, out, folder, _ = bert_bundle
    table = CalibrationTable.load(folder / "calibration.pt")
    assert table.model_id == loaded.model_id
    assert table.has("distance-floor:budget") and table.has("distance:budget")
    parts = LearnedParts(calibration=table,
                         calibration_projections=table.own_projections(folder / "calibration.pt"))
    spec = PredictorSpec.of("distance:budget",
                            {"target_sparsity": 0.9, "floor": DEFAULT_FLOOR,
                             "floor_share": DEFAULT_FLOOR_SHARE})
    layers = parts.build_layers(spec, loaded.num_layers)
    assert len(layers) == loaded.num_layers and all(p is not None for p in layers)


def test_prepare_resumes_after_its_last_finished_stage(bert_bundle, capsys) -> None:
    _, _, _, folder, before = bert_bundle
    after = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.pt")}
    for name in (PROJECTIONS, "key_codebooks.pt"):  # fitted by the first run, kept
        assert after[name] == before[name]
    assert "hash_codes.pt" not in before and "calibration.pt" not in before


def test_prepare_again_says_it_is_prepared(bert_bundle, capsys) -> None:
    model, _, out, folder, _ = bert_bundle
    assert _prepare(model, out) == 0
    assert f"already prepared: {folder}" in capsys.readouterr().out


def test_prepare_refuses_a_corrupt_bundle_with_its_path(bert_bundle, tmp_path, capsys) -> None:
    model, _, out, folder, _ = bert_bundle
    copy = tmp_path / "bundles"
    shutil.copytree(out, copy)
    damaged = copy / folder.name / "calibration.pt"
    damaged.write_bytes(damaged.read_bytes()[:-10])
    assert _prepare(model, copy) == 2
    err = capsys.readouterr().err
    assert str(copy / folder.name) in err and "corrupt" in err


def test_prepare_refuses_a_corrupt_stage_file_on_resume(tiny_model_dirs, tmp_path,
                                                        capsys) -> None:
    model = tiny_model_dirs["bert"]
    assert _prepare(model, tmp_path, "--stop-after", "projections") == 0
    (projections,) = tmp_path.glob(f"*/{PROJECTIONS}")
    projections.write_bytes(b"not projections")
    assert _prepare(model, tmp_path) == 2
    err = capsys.readouterr().err
    assert str(projections) in err and "corrupt" in err


def test_prepare_tiny_qwen2_with_gqa_and_a_local_window(tmp_path) -> None:
    model = save_tiny_decoder("qwen2", tmp_path / "qwen2", max_positions=128, sliding_window=16)
    loaded = load_model(str(model), device="cpu")
    assert loaded.num_key_value_heads < loaded.num_heads and loaded.sliding_window_layers
    assert _prepare(model, tmp_path / "bundles") == 0
    found = find_bundle(loaded, tmp_path / "bundles")
    assert found is not None and found.verify() == []
    table = CalibrationTable.load(found.path("calibration"))
    assert table.model_id == str(model) and table.has("distance:budget")
    assert (found.folder / "atlas" / "heads.csv").is_file()


def test_prepare_lookup_by_model_id_reads_the_cache_dir(bert_bundle, monkeypatch) -> None:
    model, _, out, folder, _ = bert_bundle
    monkeypatch.setenv("SPARSEFINDER_CACHE_DIR", str(out.parent))
    (out.parent / "bundles").mkdir(exist_ok=True)
    target = out.parent / "bundles" / folder.name
    if not target.exists():
        shutil.copytree(folder, target)
    assert prepared_file(str(model), "calibration") == target / "calibration.pt"
    assert prepared_file("some/other-model", "calibration") is None
    parts = LearnedParts.bundled(str(model))  # what the app and the atlas resolve methods with
    assert parts.calibration is not None and parts.calibration.model_id == str(model)
    assert parts.hash_codes is not None and parts.hash_codes.model_id == str(model)
    assert LearnedParts.bundled("some/other-model").calibration is None
    # routed k-means calibrated with the bundle's own codebooks (fitted before bundle.json)
    assert parts.calibration.has("kmeans-routed:budget")
    spec = PredictorSpec.of("kmeans-routed:budget", {"target_sparsity": 0.9})
    layers = parts.build_layers(spec, parts.calibration_projections.num_layers)
    assert layers and all(layer is not None for layer in layers)
    assert "kmeans-routed" in parts.calibration.grids


def test_prepare_refuses_a_model_not_cached_offline(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["prepare", "--model", "nobody/no-such-model", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1
    assert "'nobody/no-such-model' is not available offline" in err
    assert str(tmp_path / "hub") in err  # where it was looked for
    assert "huggingface-cli download nobody/no-such-model" in err  # how to make it available


def test_prepare_refuses_a_corpus_too_small_naming_the_minimum(tiny_model_dirs, tmp_path,
                                                               capsys) -> None:
    corpus = tmp_path / "small.txt"
    corpus.write_text("\n\n".join(f"Passage {i} is short but it is prose." for i in range(5)))
    code = main(["prepare", "--model", str(tiny_model_dirs["bert"]), "--device", "cpu",
                 "--corpus", str(corpus), "--out", str(tmp_path / "bundles")])
    assert code == 2
    err = capsys.readouterr().err
    assert f"at least {MIN_TRAIN_TEXTS}" in err and str(corpus) in err
    assert not (tmp_path / "bundles").exists()


def test_prepare_writes_its_progress_stage_by_stage(bert_bundle) -> None:
    """The progress file the app's bar reads: every stage in order, fractions rising to 1, a
    time left once a stage ran in this run."""
    from sparsefinder.prepare_jobs import PROGRESS, read_progress

    folder = bert_bundle[3]
    lines = [json.loads(line) for line in (folder / PROGRESS).read_text().splitlines()]
    assert [line["stage"] for line in lines][-7:] == [name for name, _ in STAGES] + ["done"]
    fractions = [line["fraction"] for line in lines[-7:]]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0
    # the resumed run ran hash codes first: its time left is known from the next stage on
    assert lines[-4]["stage"] == "hash-codes" and lines[-4]["seconds_left"] is None
    assert all(line["seconds_left"] is not None for line in lines[-3:])
    assert read_progress(folder)["stage"] == "done"


def test_prepare_on_two_torchrun_ranks_writes_the_same_bundle(bert_bundle, tmp_path) -> None:
    """`torchrun --nproc_per_node=2 -m sparsefinder prepare` (gloo, CPU): the ranks split the
    gold graphs and the atlas, rank 0 fits; the bundle lands in the same fingerprint folder
    with the same files, and its atlas covers the same validation texts as one process's."""
    import importlib.util

    worker = Path(__file__).resolve().parents[1] / "distributed_worker.py"
    spec = importlib.util.spec_from_file_location("distributed_worker", worker)
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    model, _, _, folder, _ = bert_bundle
    out = tmp_path / "bundles"
    run = helpers.torchrun(["-m", "sparsefinder", "prepare", "--model", str(model), "--device",
                            "cpu", "--max-passages", PASSAGES, "--out", str(out)], timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "over 2 ranks" in run.stdout
    two = find_bundle(load_model(str(model), device="cpu"), out)
    assert two is not None and two.folder.name == folder.name and two.verify() == []
    assert sorted(two.kinds()) == sorted(find_bundle(bert_bundle[1], bert_bundle[2]).kinds())
    one_atlas = (folder / "atlas" / "heads.csv").read_text().splitlines()
    two_atlas = (two.folder / "atlas" / "heads.csv").read_text().splitlines()
    assert len(two_atlas) == len(one_atlas) and two_atlas[0] == one_atlas[0]
    meta = json.loads((two.folder / "atlas" / "atlas.json").read_text())
    assert meta.get("meta", meta).get("ranks", 2) == 2
