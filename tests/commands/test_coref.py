"""`sparsefinder coref` through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sparsefinder.analysis.coref import DEFAULT_PROBES
from sparsefinder.cli import main


@pytest.fixture(scope="module")
def few_probes(tmp_path_factory) -> Path:
    """The first 6 bundled probes: enough pairs to rank heads, quick to extract."""
    data = json.loads(DEFAULT_PROBES.read_text(encoding="utf-8"))
    data["probes"] = data["probes"][:6]
    path = tmp_path_factory.mktemp("probes") / "probes.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_coref_ranks_heads_and_scores_kmeans(projections_file, few_probes, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["coref", "--projections", str(projections_file), "--probes", str(few_probes)]
    assert main([*args, "--clusters", "4", "8", "--top-k", "1", "2", "--out", str(out)]) == 0
    heads = pd.read_csv(out / "coref_heads.csv")
    assert len(heads) == 6 * 12 and heads["rank"].tolist() == list(range(1, 73))
    assert heads["mass"].is_monotonic_decreasing and heads["mass"].between(0, 1).all()
    grid = pd.read_csv(out / "coref_recall.csv")
    assert len(grid) == 4 and grid["pronoun_recall"].between(0, 1).all()
    assert set(grid["layer"]) == {heads["layer"][0]} and set(grid["head"]) == {heads["head"][0]}
    printed = capsys.readouterr().out
    assert "6 probes" in printed and "recall ~0.80" in printed


def test_coref_bad_probe_file_is_one_line(projections_file, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[", encoding="utf-8")
    args = ["coref", "--projections", str(projections_file), "--probes", str(bad)]
    assert main([*args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err
