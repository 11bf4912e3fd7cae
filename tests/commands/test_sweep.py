"""`sparsefinder sweep` end to end on a tiny randomly initialised BERT (fast, offline)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from sparsefinder.cli import main
from sparsefinder.data.corpus import split_of
from sparsefinder.evaluation.curves import curve_display_name

_spec = importlib.util.spec_from_file_location(
    "_tiny_train", Path(__file__).with_name("test_train.py")
)
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sweep")
    tiny = _helpers.make_tiny_bert(root / "tiny")
    rc = main([
        "train", "--model", str(tiny), "--max-passages", "3", "--out", str(root / "proj"),
        "--kmeans-n-init", "1", "--kmeans-max-points", "500", "--device", "cpu",
    ])
    assert rc == 0
    return tiny, root / "proj" / "projections.pt"


def test_sweep_writes_all_outputs(trained, tmp_path: Path, capsys) -> None:
    tiny, proj = trained
    out = tmp_path / "sweep"
    rc = main(["sweep", "--model", str(tiny), "--projections", str(proj), "--out", str(out),
               "--max-passages", "2", "--device", "cpu"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "gold sparsity:" in text and "recall@0.75" in text
    points = pd.read_csv(out / "points.csv")
    assert {"distance", "kmeans", "quantization", "window", "kmeans+window"} <= set(
        points["method"]
    )
    assert (points["n_texts"] == 2).all()
    summary = json.loads((out / "points.json").read_text())
    assert summary["split"] == "validation" and len(summary["points"]) == len(points)
    assert len(summary["gold_sparsity_per_layer"]) == 2
    assert len(summary["points"][0]["recall_per_layer"]) == 2
    assert "threshold" in summary["points"][0]["params"]
    frontier = pd.read_csv(out / "frontier.csv")
    assert 0 < len(frontier) <= len(points)
    at = pd.read_csv(out / "recall_at_sparsity.csv")
    assert list(at.columns) == ["method", "recall@0.75", "recall@0.9", "recall@0.95", "label"]
    assert (out / "pareto.html").stat().st_size > 1_000_000  # plotly.js inlined
    # every point carries every metric (issue 10), and the configuration behind each R@level
    extras = ["precision", "exact_fraction", "mass_recall", "block_recall16", "block_recall64"]
    assert list(points.columns[:4]) == ["method", "family", "calibration", "params"]
    assert list(points.columns[4:11]) == ["recall", "sparsity", *extras]
    assert points[extras].notna().all().all()
    assert ((points[extras] >= 0) & (points[extras] <= 1)).all().all()
    assert "exact_fraction" in summary["points"][0]
    metrics_at = pd.read_csv(out / "metrics_at_sparsity.csv")
    assert list(metrics_at.columns) == ["method", "level", "params", "recall", "sparsity",
                                        *extras, "label"]
    # every CSV names each method as the legends and the app do, in a last column
    for table in (points, frontier, at, metrics_at):
        assert table.columns[-1] == "label"
        assert (table["label"] == table["method"].map(curve_display_name)).all()
    assert set(points["label"]) >= {"Distance (t)", "Window (w)", "k-means (B, k) + window 3"}
    for row in metrics_at.itertuples():
        assert row.sparsity >= row.level
        reached = at.set_index("method").loc[row.method, f"recall@{row.level:g}"]
        assert row.recall == pytest.approx(reached)


def test_sweep_refuses_empty_validation(trained, tmp_path: Path, capsys) -> None:
    tiny, proj = trained
    passage = next(
        f"Passage number {i} talks about attention graphs and sparse transformers."
        for i in range(100)
        if split_of(f"Passage number {i} talks about attention graphs and sparse transformers.")
        == "train"
    )
    corpus = tmp_path / "one.txt"
    corpus.write_text(passage + "\n", encoding="utf-8")
    rc = main(["sweep", "--model", str(tiny), "--projections", str(proj), "--corpus",
               str(corpus), "--out", str(tmp_path / "o"), "--device", "cpu"])
    assert rc == 2
    assert "'validation' split" in capsys.readouterr().err
    rc = main(["sweep", "--model", str(tiny), "--projections", str(proj), "--out",
               str(tmp_path / "o"), "--max-passages", "0", "--device", "cpu"])
    assert rc == 2 and "no passages to evaluate" in capsys.readouterr().err


def test_sweep_refuses_projections_of_another_model(trained, tmp_path: Path, capsys) -> None:
    tiny, proj = trained
    other = shutil.copytree(tiny, tmp_path / "other-model")
    rc = main(["sweep", "--model", str(other), "--projections", str(proj), "--out",
               str(tmp_path / "o"), "--max-passages", "1", "--device", "cpu"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "trained for model" in err and f"sparsefinder train --model {other}" in err
    rc = main(["sweep", "--model", str(tiny), "--projections", str(proj), "--out",
               str(tmp_path / "o"), "--methods", "distance,bogus"])
    assert rc == 2 and "unknown method 'bogus'" in capsys.readouterr().err


def test_sweep_calibrated_methods_with_lowrank_projections(trained, tmp_path: Path,
                                                           capsys) -> None:
    """Low-rank (augmented) projections from `train --objective lowrank`, calibrated methods
    fitted on TRAIN passages, points near their target sparsity; an old method name is read
    as its family and calibration, with a deprecation note."""
    tiny, _ = trained
    assert main(["train", "--model", str(tiny), "--max-passages", "3", "--out", str(tmp_path),
                 "--objective", "lowrank", "--rank", "4", "--filename", "lr.pt",
                 "--clusters", "none", "--device", "cpu"]) == 0
    out = tmp_path / "sweep"
    rc = main(["sweep", "--model", str(tiny), "--projections", str(tmp_path / "lr.pt"),
               "--out", str(out), "--max-passages", "3", "--train-passages", "6",
               "--methods", "distance:equal,rowfrac-budget", "--device", "cpu"])
    assert rc == 0
    captured = capsys.readouterr()
    assert "fitting distance:equal, rowfrac:budget on the first 6 passages" in captured.out
    assert "'rowfrac-budget' is deprecated; use 'rowfrac:budget'" in captured.err
    points = pd.read_csv(out / "points.csv")
    assert set(points["method"]) == {"distance:equal", "rowfrac:budget"}
    assert set(points["calibration"]) == {"equal", "budget"}
    calibrated = points[points["method"] == "distance:equal"]
    targets = calibrated["params"].map(lambda p: json.loads(p)["target_sparsity"])
    # six train texts and three held-out ones: the estimate is coarse, the trend is not
    assert (calibrated["sparsity"] - targets).abs().max() < 0.1
    assert calibrated["sparsity"].is_monotonic_increasing


def test_calibrate_writes_a_table_naming_its_projections(trained, tmp_path: Path,
                                                         capsys) -> None:
    from sparsefinder.calibration.table import CalibrationTable, file_digest

    tiny, proj = trained
    folder = tmp_path / "assets"
    folder.mkdir()
    shutil.copy(proj, folder / "projections-x.pt")
    rc = main(["calibrate", "--model", str(tiny), "--max-passages", "4", "--projections",
               str(folder / "projections-x.pt"), "--out", str(folder / "calibration.pt"),
               "--device", "cpu"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "distance:budget: train sparsity at target 0.90" in out and "note:" not in out
    assert "distance-floor:budget: train sparsity at target 0.90" in out
    table = CalibrationTable.load(folder / "calibration.pt")
    assert table.projections_file == "projections-x.pt"
    assert table.projections_sha256 == file_digest(folder / "projections-x.pt")
    # routed k-means has no key codebooks for the tiny model; the window needs none
    assert {"distance", "distance-floor", "rowfrac", "window"} == set(table.params)
    assert table.own_projections(folder / "calibration.pt").model_id == table.model_id
