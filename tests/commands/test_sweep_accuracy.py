"""`sparsefinder sweep --accuracy` end to end on a tiny randomly initialised BERT."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from sparsefinder.cli import main
from sparsefinder.commands._accuracy import format_table
from sparsefinder.evaluation.curves import curve_display_name

_spec = importlib.util.spec_from_file_location(
    "_tiny_train", Path(__file__).with_name("test_train.py")
)
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sweep-accuracy")
    tiny = _helpers.make_tiny_bert(root / "tiny")
    rc = main([
        "train", "--model", str(tiny), "--max-passages", "3", "--out", str(root / "proj"),
        "--clusters", "2,4", "--kmeans-n-init", "1", "--kmeans-max-points", "500",
        "--device", "cpu",
    ])
    assert rc == 0
    return tiny, root / "proj" / "projections.pt"


def test_sweep_accuracy_writes_frontiers(trained, tmp_path: Path, capsys) -> None:
    tiny, proj = trained
    out = tmp_path / "sweep"
    rc = main(["sweep", "--model", str(tiny), "--projections", str(proj), "--out", str(out),
               "--max-passages", "3", "--device", "cpu", "--accuracy",
               "--methods", "distance+window,kmeans,window,longformer,bigbird,sparsebert-dams",
               "--train-passages", "2"])
    assert rc == 0
    text = capsys.readouterr()
    assert "output_cosine@0.75" in text.out and "accuracy" in text.err  # table and progress
    points = pd.read_csv(out / "accuracy_points.csv")
    assert {"distance+window", "kmeans", "window", "longformer", "bigbird",
            "sparsebert-dams"} == set(points["method"])
    recall_points = pd.read_csv(out / "points.csv")
    assert len(points) == len(recall_points)  # every grid point got an accuracy
    assert points["recall"].notna().all() and points["sweep_sparsity"].notna().all()
    assert (out / "pareto_accuracy.html").stat().st_size > 1_000_000
    assert (out / "pareto.html").is_file()  # the recall figure is still written
    summary = json.loads((out / "accuracy.json").read_text())
    assert summary["split"] == "validation" and summary["gold_sparsity"] > 0
    dom = pd.read_csv(out / "accuracy_dominance.csv")
    assert {"window", "longformer", "bigbird"} <= set(dom["baseline"])
    # the printed table: every method at 0.75/0.90/0.95, its graph measures those of the
    # recall sweep's same configuration
    table = pd.read_csv(out / "accuracy_table.csv")
    assert table.columns[-1] == "label"  # the display name, after the printed columns
    assert (table["label"] == table["method"].map(curve_display_name)).all()
    assert format_table(table.drop(columns="label")) in text.out
    assert set(table["method"]) == set(points["method"]) and len(table) == 6 * 3
    merged = points.merge(recall_points, on=["method", "params"], suffixes=("", "_sweep"))
    for column in ("mass_recall", "exact_fraction"):
        assert merged[column].tolist() == pytest.approx(merged[f"{column}_sweep"].tolist())


def test_sweep_accuracy_without_projections_names_the_train_command(trained, tmp_path,
                                                                     capsys) -> None:
    tiny, _ = trained
    rc = main(["sweep", "--model", str(tiny), "--out", str(tmp_path / "o"),
               "--max-passages", "2", "--device", "cpu", "--accuracy"])
    assert rc == 2
    assert f"sparsefinder train --model {tiny} --out DIR" in capsys.readouterr().err
