"""`sparsefinder train` end to end on a tiny randomly initialised BERT (fast, offline)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from sparsefinder.cli import main
from sparsefinder.models.loading import default_model_path
from sparsefinder.projections.heads import HeadProjections


def make_tiny_bert(folder: Path) -> Path:
    """2 layers × 2 heads, hidden 32 (head dim 16), the default model's tokenizer.

    ``initializer_range=0.2`` (not BERT's 0.02): with near-zero scores entmax attends to every
    key, and a graph without non-edges has nothing to learn; at 0.2 ~20 % are edges.
    """
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, max_position_embeddings=512,
        initializer_range=0.2,
    )
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def test_train_writes_projections(tiny: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    rc = main([
        "train", "--model", str(tiny), "--corpus", "default", "--max-passages", "3",
        "--out", str(out), "--clusters", "2,4", "--kmeans-n-init", "1", "--device", "cpu",
    ])
    assert rc == 0
    text = capsys.readouterr().out
    assert "3 passages of the train split" in text and "hinge loss" in text
    proj = HeadProjections.load(out / "projections.pt", expected_model_id=str(tiny))
    assert proj.weight.shape == (2, 2, 4, 16)
    assert sorted(proj.centroids) == [2, 4] and proj.centroids[4].shape == (2, 2, 4, 4)
    assert proj.metadata["split"] == "train" and proj.metadata["max_passages"] == 3
    assert proj.metadata["n_texts"] >= 3
    assert (out / "projections.pt").stat().st_size < 100_000


def test_train_rejects_bad_arguments(tiny: Path, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["train", "--model", str(tiny), "--out", str(tmp_path), "--clusters", "2,x"])
    assert info.value.code == 2
    assert "comma-separated integers" in capsys.readouterr().err
    rc = main(["train", "--model", str(tiny), "--out", str(tmp_path), "--max-passages", "2",
               "--rank", "0", "--device", "cpu"])
    assert rc == 2 and "rank must be an integer" in capsys.readouterr().err


@pytest.mark.parametrize("objective", ["lowrank", "logistic", "lowrank-logistic"])
def test_train_objectives(tiny: Path, tmp_path: Path, capsys, objective: str) -> None:
    rc = main([
        "train", "--model", str(tiny), "--corpus", "default", "--max-passages", "3",
        "--out", str(tmp_path), "--objective", objective, "--rank", "2",
        "--filename", f"p-{objective}.pt", "--clusters", "2", "--kmeans-n-init", "1",
        "--device", "cpu",
    ])
    assert rc == 0
    text = capsys.readouterr().out
    proj = HeadProjections.load(tmp_path / f"p-{objective}.pt", expected_model_id=str(tiny))
    assert proj.objective == objective and proj.metadata["split"] == "train"
    if objective.startswith("lowrank"):
        assert proj.centroids == {} and "no k-means centroids for augmented" in text
        assert proj.kind == "augmented" and proj.rank == 3 and proj.dim == 5  # + row threshold
        assert "score energy" in text
        assert ("logistic loss" in text) == (objective == "lowrank-logistic")
    else:
        assert proj.kind == "shared" and proj.rank == 2 and "logistic loss" in text
        assert proj.centroids[2].shape == (2, 2, 2, 2)
