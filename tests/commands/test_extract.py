"""`sparsefinder extract` and `sparsefinder info` through the real CLI entry point."""

from __future__ import annotations

from sparsefinder.cli import main
from sparsefinder.data.records_io import load_records
from sparsefinder.models.loading import DEFAULT_MODEL_ID


def test_extract_writes_compact_records(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("First passage about cats.\n\nSecond passage about dogs and their owners.\n")
    code = main(["extract", "--corpus", str(corpus), "--split", "all", "--out", str(tmp_path)])
    assert code == 0
    records, metadata = load_records(tmp_path / "records-all.pt")
    assert len(records) == 2 and metadata["model_id"] == DEFAULT_MODEL_ID
    assert "saved 2 records" in capsys.readouterr().out


def test_extract_reports_missing_corpus(tmp_path, capsys):
    code = main(["extract", "--corpus", str(tmp_path / "missing.txt"), "--out", str(tmp_path)])
    assert code == 2
    assert "missing.txt" in capsys.readouterr().err


def test_info_prints_shapes_and_bad_alpha_is_one_line(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "layers: 6" in out and "heads: 12" in out and "head_dim: 32" in out
    assert main(["info", "--alpha", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "alpha must be >= 1" in err and "Traceback" not in err
