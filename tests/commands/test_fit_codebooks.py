"""`sparsefinder fit-codebooks` end to end on a few passages of the default model."""

from __future__ import annotations

from pathlib import Path

from sparsefinder.cli import main
from sparsefinder.models.loading import DEFAULT_MODEL_ID
from sparsefinder.projections.key_codebooks import KeyCodebooks


def test_fit_codebooks_writes_a_loadable_file(tmp_path: Path, capsys) -> None:
    out = tmp_path / "books.pt"
    code = main(["fit-codebooks", "--max-passages", "3", "--clusters", "2,4",
                 "--device", "cpu", "--out", str(out)])
    assert code == 0
    books = KeyCodebooks.load(out, expected_model_id=DEFAULT_MODEL_ID)
    assert sorted(books.centroids) == [2, 4]
    assert books.centroids[4].shape == (6, 12, 4, 32)
    assert books.metadata["split"] == "train"
    assert "wrote" in capsys.readouterr().out


def test_fit_codebooks_rejects_bad_clusters(tmp_path: Path, capsys) -> None:
    import pytest

    with pytest.raises(SystemExit):
        main(["fit-codebooks", "--clusters", "1", "--out", str(tmp_path / "x.pt")])
    assert "integers >= 2" in capsys.readouterr().err
