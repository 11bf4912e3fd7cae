"""`sparsefinder fit-hash-codes` end to end on a few passages of the default model."""

from __future__ import annotations

from pathlib import Path

from sparsefinder.cli import main
from sparsefinder.models.loading import DEFAULT_MODEL_ID
from sparsefinder.projections.hash_code_table import HashCodeTable


def test_fit_hash_codes_writes_a_loadable_file(tmp_path: Path, capsys) -> None:
    out = tmp_path / "codes.pt"
    code = main(["fit-hash-codes", "--max-passages", "3", "--bits", "8", "--steps", "5",
                 "--device", "cpu", "--out", str(out)])
    assert code == 0
    table = HashCodeTable.load(out, expected_model_id=DEFAULT_MODEL_ID)
    assert len(table.maps) == 6
    assert table.maps[0][0].shape == (12, 32, 8)
    assert table.metadata["split"] == "train" and table.metadata["bits"] == 8
    assert "wrote" in capsys.readouterr().out


def test_fit_hash_codes_rejects_zero_bits(tmp_path: Path, capsys) -> None:
    assert main(["fit-hash-codes", "--bits", "0", "--out", str(tmp_path / "x.pt")]) == 2
    assert "--bits and --steps must be positive" in capsys.readouterr().err
    assert not (tmp_path / "x.pt").exists()
