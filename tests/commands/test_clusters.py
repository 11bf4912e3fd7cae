"""`sparsefinder clusters` through the real CLI entry point, on 3 validation passages."""

from __future__ import annotations

import pandas as pd

from sparsefinder.cli import main


def test_clusters_writes_tables_and_offline_html(projections_file, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["clusters", "--layer", "3", "--head", "1", "--max-passages", "3"]
    args += ["--projections", str(projections_file), "--clusters", "4", "--out", str(out)]
    assert main(args) == 0
    for name in ("clusters_queries.csv", "clusters_keys.csv"):
        table = pd.read_csv(out / name, index_col="tag")
        assert list(table.columns) == ["0", "1", "2", "3"]
        assert table.sum(axis=1).round(2).eq(100.0).all()
        assert "NOUN" in table.index and "SPECIAL" in table.index
    scores = pd.read_csv(out / "pos_recall.csv", index_col="tag")
    assert {"tokens", "gold", "hit", "recall", "sparsity"} <= set(scores.columns)
    assert scores["recall"].between(0, 1).all() and scores.loc["SPECIAL", "tokens"] == 6
    html = (out / "clusters.html").read_text(encoding="utf-8")
    assert "<script src=" not in html and "plotly.js v" in html  # inlined: works offline
    assert html.count("Plotly.newPlot") == 2
    printed = capsys.readouterr().out
    assert "3 texts" in printed and "worst-served" in printed


def test_clusters_top_k_two_and_missing_b_is_one_line(projections_file, tmp_path, capsys):
    out = tmp_path / "k2"
    args = ["clusters", "--layer", "0", "--head", "0", "--max-passages", "1"]
    args += ["--projections", str(projections_file), "--clusters", "4", "--top-k", "2"]
    assert main([*args, "--out", str(out)]) == 0
    assert (
        pd.read_csv(out / "clusters_keys.csv", index_col="tag").sum(axis=1).round(2).eq(100).all()
    )
    bad = ["clusters", "--layer", "0", "--head", "0", "--projections", str(projections_file)]
    assert main([*bad, "--clusters", "7", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "B=7" in err and "Traceback" not in err
