"""`sparsefinder fit-block-projections` end to end on a few passages of the default model."""

from __future__ import annotations

from pathlib import Path

from sparsefinder.cli import main
from sparsefinder.models.loading import DEFAULT_MODEL_ID
from sparsefinder.projections.blocks import load_block_projections


def test_fit_block_projections_writes_a_loadable_file(tmp_path: Path, capsys) -> None:
    out = tmp_path / "blocks.pt"
    code = main(["fit-block-projections", "--max-passages", "4", "--block", "16", "--rank", "2",
                 "--device", "cpu", "--out", str(out)])
    assert code == 0
    projections = load_block_projections(out, expected_model_id=DEFAULT_MODEL_ID)
    assert (projections.num_layers, projections.num_heads, projections.rank,
            projections.head_dim) == (6, 12, 2, 32)
    meta = projections.metadata
    assert meta["split"] == "train" and meta["block"] == 16 and meta["n_texts"] >= 4
    printed = capsys.readouterr().out
    assert "positive block pairs" in printed and "wrote" in printed


def test_fit_block_projections_rejects_a_zero_block(tmp_path: Path, capsys) -> None:
    assert main(["fit-block-projections", "--block", "0", "--out", str(tmp_path / "x.pt")]) == 2
    assert "--block must be a positive number of tokens" in capsys.readouterr().err
    assert not (tmp_path / "x.pt").exists()
