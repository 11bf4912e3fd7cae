"""`sparsefinder extract` and `sparsefinder info` through the real CLI entry point."""

from __future__ import annotations

import pytest

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


def test_info_prints_each_layers_alpha_and_kind(sparse_modernbert_dir, capsys):
    assert main(["info", "--model", str(sparse_modernbert_dir), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "layer 0: global, entmax α=1.5" in out and "layer 1: local ±4, softmax" in out
    assert "alpha_from: config initial_alpha (global-only recipe)" in out
    assert "2 softmax layer(s)" in out
    assert main(["info", "--model", str(sparse_modernbert_dir), "--device", "cpu",
                 "--alpha-layers", "2,1.5,1.5,2"]) == 0
    out = capsys.readouterr().out
    assert "layer 1: local ±4, entmax α=1.5" in out and "layer 3: global, entmax α=2" in out
    assert main(["info", "--model", str(sparse_modernbert_dir), "--alpha-layers", "1.5,2"]) == 2
    err = capsys.readouterr().err
    assert "has 2 values but the model has 4 layers" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exit_:  # argparse: usage and the message, code 2
        main(["info", "--alpha-layers", "1.5,soft"])
    assert exit_.value.code == 2 and "comma-separated numbers" in capsys.readouterr().err


def test_extract_records_each_layers_alpha(sparse_modernbert_dir, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("First passage about cats and the mats they sit on all day long.\n")
    assert main(["extract", "--model", str(sparse_modernbert_dir), "--device", "cpu",
                 "--corpus", str(corpus), "--split", "all", "--out", str(tmp_path)]) == 0
    records, metadata = load_records(tmp_path / "records-all.pt")
    assert metadata["layer_alphas"] == [1.5, 1.0, 1.0, 1.5]
    assert [layer.alpha for layer in records[0].layers] == [1.5, 1.0, 1.0, 1.5]
    assert [layer.sliding_window for layer in records[0].layers] == [None, 5, 5, None]
