"""`sparsefinder coref` through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sparsefinder.analysis.coref import DEFAULT_PROBES
from sparsefinder.cli import main


def _probe_file(folder: Path, ids: list[str]) -> Path:
    data = json.loads(DEFAULT_PROBES.read_text(encoding="utf-8"))
    data["probes"] = [p for p in data["probes"] if p["id"] in ids]
    path = folder / "probes.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def few_probes(tmp_path_factory) -> Path:
    """6 bundled choose probes and 2 held-out ones: enough pairs to rank heads, quick."""
    ids = ["p01", "p02", "p03", "p04", "p05", "p06", "p43", "p45"]
    return _probe_file(tmp_path_factory.mktemp("probes"), ids)


def _run(projections: Path | None, probes: Path, out: Path, *extra: str) -> int:
    args = ["coref", "--probes", str(probes), "--out", str(out), *extra]
    return main(args + (["--projections", str(projections)] if projections else []))


def test_coref_scores_the_best_calibrated_method_by_default(few_probes, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(None, few_probes, out) == 0
    heads = pd.read_csv(out / "coref_heads.csv")
    assert len(heads) == 6 * 12 and heads["rank"].tolist() == list(range(1, 73))
    assert heads["mass"].is_monotonic_decreasing and heads["mass"].between(0, 1).all()
    assert heads["n_pairs"][0] == 15  # the pairs of the 6 choose probes only
    grid = pd.read_csv(out / "coref_recall.csv")
    assert set(grid["curve"]) == {"distance:budget"} and len(grid) == 28
    assert grid["choose_pronoun_recall"].between(0, 1).all()
    assert grid["heldout_pronoun_recall"].between(0, 1).all()
    assert (grid["choose_sparsity"].diff().dropna() >= -1e-9).all()  # denser targets keep more
    assert set(grid["layer"]) == {heads["layer"][0]} and set(grid["head"]) == {heads["head"][0]}
    chosen = grid[grid["chosen"]]
    assert len(chosen) == 1
    reaching = grid[grid["choose_pronoun_recall"] >= 0.8]
    assert chosen["choose_sparsity"].item() == reaching["choose_sparsity"].max()
    printed = capsys.readouterr().out
    assert "6 probes to choose on" in printed and "2 held out" in printed
    assert "recall ~0.80" in printed and "held-out recall" in printed


def test_coref_kmeans_and_held_out_probes_that_never_move_the_choice(
    projections_file, few_probes, tmp_path
):
    other = _probe_file(tmp_path, ["p01", "p02", "p03", "p04", "p05", "p06", "p48", "p50"])
    for probes, out in ((few_probes, tmp_path / "a"), (other, tmp_path / "b")):
        assert _run(projections_file, probes, out, "--method", "kmeans-top2",
                    "--min-sparsity", "0.5") == 0
    first, second = (pd.read_csv(tmp_path / x / "coref_recall.csv") for x in "ab")
    assert first["setting"].str.startswith("kmeans n_clusters=").all() and len(first) == 7
    assert not first["heldout_pronoun_recall"].equals(second["heldout_pronoun_recall"])
    kept = [c for c in first.columns if not c.startswith("heldout_")]
    pd.testing.assert_frame_equal(first[kept], second[kept])
    chosen = first[first["chosen"]].iloc[0]
    assert chosen["choose_sparsity"] >= 0.5 and chosen["reached"]


def test_coref_heldout_set_is_measured_alone_and_moves_nothing_else(
    projections_file, tmp_path, capsys
):
    probes = _probe_file(tmp_path, ["p01", "p02", "p03", "p04", "p05", "p06", "p43", "p77", "p78"])
    for out, extra in (("plain", ()), ("fresh", ("--heldout-set", "fresh"))):
        assert _run(projections_file, probes, tmp_path / out, "--method", "kmeans-top2",
                    *extra) == 0
    printed = capsys.readouterr().out
    assert "set 'fresh': 2 probes (7 pairs)" in printed and "set fresh alone: recall" in printed
    plain, fresh = (pd.read_csv(tmp_path / x / "coref_recall.csv") for x in ("plain", "fresh"))
    pd.testing.assert_frame_equal(fresh[plain.columns], plain)  # choice and held-out unchanged
    assert fresh["fresh_pronoun_recall"].between(0, 1).all()
    assert (fresh["fresh_pronoun_gold_edges"] < fresh["heldout_pronoun_gold_edges"]).all()
    assert _run(projections_file, probes, tmp_path / "x", "--heldout-set", "stale") == 2
    assert "no held-out probe of set 'stale'" in capsys.readouterr().err


def test_coref_bad_probe_file_is_one_line(projections_file, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[", encoding="utf-8")
    args = ["coref", "--projections", str(projections_file), "--probes", str(bad)]
    assert main([*args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err
