"""Commands default to the bundle's best parts; explicit paths still win."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from sparsefinder.bundle import bundle
from sparsefinder.cli import build_parser
from sparsefinder.commands import clusters, sweep
from sparsefinder.evaluation.curves import resolve_methods
from sparsefinder.projections.heads import HeadProjections


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_sweep_defaults_to_the_best_projections() -> None:
    args = _args("sweep", "--out", "x")
    assert args.projections is None
    assert sweep._projections_path(args) == bundle().best("projections")
    assert sweep._projections_path(args).name == "projections-r8-lowrank-mass.pt"
    mine = _args("sweep", "--out", "x", "--projections", "mine.pt")
    assert sweep._projections_path(mine) == Path("mine.pt")
    with pytest.raises(ValueError, match="--projections is required for model 'gpt2'"):
        sweep._projections_path(_args("sweep", "--out", "x", "--model", "gpt2"))


@pytest.mark.parametrize("command", ["clusters", "coref"])
def test_clusters_and_coref_default_to_the_best_projections_with_centroids(command) -> None:
    extra = ["--layer", "0", "--head", "0"] if command == "clusters" else []
    args = _args(command, "--out", "x", *extra)
    assert clusters.projections_path(args) == bundle().best("centroids")
    assert HeadProjections.load(clusters.projections_path(args)).centroids
    mine = _args(command, "--out", "x", *extra, "--projections", "mine.pt")
    assert clusters.projections_path(mine) == Path("mine.pt")


def test_sweep_names_the_projections_for_the_curves_the_default_cannot_run(capsys) -> None:
    best = HeadProjections.load(bundle().best("projections"))
    sweep._note_centroids(_args("sweep", "--out", "x"), best, resolve_methods("sparsefinder"))
    out = capsys.readouterr().out
    assert "skipping kmeans, kmeans+window" in out
    assert f"--projections {bundle().best('centroids')}" in out
    explicit = _args("sweep", "--out", "x", "--projections", "p.pt")
    sweep._note_centroids(explicit, best, resolve_methods("sparsefinder"))
    sweep._note_centroids(_args("sweep", "--out", "x"), best, ["distance:budget", "window"])
    assert capsys.readouterr().out == ""
