"""`sparsefinder atlas`: files, report, bad input, softmax layers, and 2 torchrun ranks = 1."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sparsefinder.analysis.atlas import MIN_TEXTS
from sparsefinder.cli import main

_spec = importlib.util.spec_from_file_location(
    "distributed_worker", Path(__file__).parents[1] / "distributed_worker.py")
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("atlas") / "corpus.txt"
    path.write_text("\n\n".join(helpers.TEXTS) + "\n", encoding="utf-8")
    return path


def _args(model: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    return ["atlas", "--model", str(model), "--corpus", str(corpus), "--split", "all",
            "--out", str(out), "--device", "cpu", "--batch", "4", *extra]


def test_atlas_writes_heads_csv_and_json(tiny_model_dirs, corpus, tmp_path, capsys):
    assert main(_args(tiny_model_dirs["bert"], corpus, tmp_path)) == 0
    out = capsys.readouterr().out
    assert "pattern types per layer" in out and "no calibration table" in out
    heads = pd.read_csv(tmp_path / "heads.csv")
    assert len(heads) == 2 * 4  # the tiny BERT: 2 layers × 4 heads
    payload = json.loads((tmp_path / "atlas.json").read_text())
    assert payload["meta"]["n_texts"] == len(helpers.TEXTS)
    assert np.asarray(payload["similarity"]).shape == (8, 8)
    assert set(heads["type"]) <= {"sink", "diagonal", "previous", "next", "local", "broad",
                                  "mixed"}  # entmax heads: none dense


def test_softmax_model_is_marked_dense(tiny_model_dirs, corpus, tmp_path, capsys):
    assert main(_args(tiny_model_dirs["bert"], corpus, tmp_path, "--alpha", "1")) == 0
    heads = pd.read_csv(tmp_path / "heads.csv")
    assert set(heads["type"]) == {"dense"}
    assert heads["gold_sparsity"].max() == 0.0  # every allowed pair kept: 1 - c/c, exactly


def test_too_small_a_corpus_names_the_minimum(tiny_model_dirs, corpus, tmp_path, capsys):
    code = main(_args(tiny_model_dirs["bert"], corpus, tmp_path, "--max-passages", "2"))
    assert code == 2
    err = capsys.readouterr().err
    assert f"needs at least {MIN_TEXTS}" in err and "gives 2 texts" in err


def test_default_model_reports_the_heads_the_predictor_loses(corpus, tmp_path, capsys):
    assert main(["atlas", "--corpus", str(corpus), "--split", "all", "--out", str(tmp_path),
                 "--device", "cpu", "--max-passages", "6"]) == 0
    out = capsys.readouterr().out
    assert "loses most" in out and (
        "distance:budget floor=12 floor_share=1 target_sparsity=0.9") in out
    heads = pd.read_csv(tmp_path / "heads.csv")
    assert len(heads) == 72 and heads["pred_recall"].between(0, 1).all()


def _same_atlas(one: Path, two: Path, rtol: float) -> None:
    a, b = pd.read_csv(one / "heads.csv"), pd.read_csv(two / "heads.csv")
    numeric = a.select_dtypes("number").columns
    np.testing.assert_allclose(a[numeric], b[numeric], rtol=rtol, atol=1e-12)
    assert a["type"].tolist() == b["type"].tolist()
    ja, jb = (json.loads((d / "atlas.json").read_text()) for d in (one, two))
    # 6 decimals in the file (np.round): two roundings of close values may be 1e-6 apart
    np.testing.assert_allclose(ja["similarity"], jb["similarity"], rtol=rtol, atol=1e-6)
    assert ja["sparsity_hist"] == jb["sparsity_hist"]
    assert ja["support_hist"] == jb["support_hist"]
    assert ja["meta"]["n_texts"] == jb["meta"]["n_texts"] and jb["meta"]["ranks"] == 2


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dirs, corpus, tmp_path_factory) -> Path:
    """ONE torchrun start (2 ranks) for both atlas runs: over a shard store of the corpus
    (``store/two``), and extracting every other text per rank (``texts/two``)."""
    root = tmp_path_factory.mktemp("atlas-ranks")
    assert main(helpers.extract_args(tiny_model_dirs["bert"], corpus, root / "store",
                                     "--sharded")) == 0
    run = helpers.torchrun_cli([
        ["atlas", "--records", str(root / "store" / "records-all"),
         "--out", str(root / "store" / "two"), "--device", "cpu"],
        _args(tiny_model_dirs["bert"], corpus, root / "texts" / "two")], root)
    assert run.returncode == 0, run.stdout + run.stderr
    return root


def test_two_torchrun_ranks_reduce_a_shard_store_exactly(two_ranks, tmp_path):
    """The same gold graphs (a shard store) on 1 process and on 2 ranks: equal sums."""
    one, two = tmp_path / "one", two_ranks / "store" / "two"
    store = two_ranks / "store" / "records-all"
    assert main(["atlas", "--records", str(store), "--out", str(one), "--device", "cpu"]) == 0
    _same_atlas(one, two, rtol=1e-12)
    ja, jb = (json.loads((d / "atlas.json").read_text()) for d in (one, two))
    assert ja["examples"] == jb["examples"] and ja["texts"] == jb["texts"]


def test_two_torchrun_ranks_extracting_their_texts_match_one_process(tiny_model_dirs, corpus,
                                                                      two_ranks, tmp_path):
    """Each rank extracts every other text (other batches: float noise of the forward pass
    only, ~1e-7)."""
    one = tmp_path / "one"
    assert main(_args(tiny_model_dirs["bert"], corpus, one)) == 0
    _same_atlas(one, two_ranks / "texts" / "two", rtol=1e-5)
