"""`sparsefinder adapt` on a tiny random BERT through the real CLI entry point."""

from __future__ import annotations

import json

import pytest

from sparsefinder.cli import main
from sparsefinder.models.adapter_file import read_adapter
from sparsefinder.models.loading import load_model


def test_adapt_writes_a_loadable_adapter_and_resumes(tiny_model_dirs, tmp_path, capsys):
    folder = tiny_model_dirs["bert"]
    args = ["adapt", "--model", str(folder), "--out", str(tmp_path), "--max-passages", "6",
            "--eval-passages", "2", "--steps", "3", "--batch-size", "2", "--max-tokens", "24",
            "--rank", "2"]
    assert main(args) == 0
    out = capsys.readouterr()
    assert "before: pooled cosine" in out.out and "after: pooled cosine" in out.out
    path = tmp_path / "entmax_adapter.safetensors"
    tensors, meta = read_adapter(path)
    assert meta["base_model"] == str(folder) and meta["alpha"] == "1.5"
    assert "default corpus" in meta["training_data"]
    assert json.loads(meta["after"])["texts"] == 2
    assert (tmp_path / "adapt-checkpoint.pt").exists()
    loaded = load_model(str(folder), adapter=path, device="cpu")
    assert loaded.adapter is not None and "adapter" in loaded.describe()["adapter"]
    # Resuming a finished run trains nothing more and rewrites the same adapter.
    assert main([*args, "--resume"]) == 0
    again, _ = read_adapter(path)
    assert all((again[k] == tensors[k]).all() for k in tensors)


def test_adapt_refuses_an_uncovered_family(tiny_model_dirs, tmp_path, capsys):
    code = main(["adapt", "--model", str(tiny_model_dirs["gpt2"]), "--out", str(tmp_path),
                 "--max-passages", "4", "--eval-passages", "1", "--steps", "1"])
    assert code == 2
    err = capsys.readouterr().err
    assert "model family 'gpt2' is not covered" in err and "Traceback" not in err


@pytest.mark.cuda
def test_adapt_runs_on_cuda_and_the_adapter_loads_on_cpu(tiny_model_dirs, tmp_path):
    folder = tiny_model_dirs["bert"]
    assert main(["adapt", "--model", str(folder), "--out", str(tmp_path), "--device", "cuda",
                 "--max-passages", "6", "--eval-passages", "2", "--steps", "3",
                 "--batch-size", "2", "--max-tokens", "24", "--rank", "2"]) == 0
    loaded = load_model(str(folder), adapter=tmp_path / "entmax_adapter.safetensors",
                        device="cpu")
    assert loaded.adapter is not None


def test_adapt_evaluate_measures_an_adapter_on_each_text_set(tiny_model_dirs, tmp_path, capsys):
    folder = tiny_model_dirs["bert"]
    assert main(["adapt", "--model", str(folder), "--out", str(tmp_path), "--max-passages", "6",
                 "--eval-passages", "2", "--steps", "2", "--batch-size", "2",
                 "--max-tokens", "24", "--rank", "2", "--eval-corpus", "narrative"]) == 0
    out = capsys.readouterr().out
    assert "narrative hold-out (bundled): 36 texts, pooled cosine mean" in out
    extra = tmp_path / "extra.txt"
    extra.write_text("One short story about a dog.\n\nA news item about rain.\n")
    assert main(["adapt", "--evaluate", "--model", str(folder), "--adapter",
                 str(tmp_path / "entmax_adapter.safetensors"), "--eval-passages", "2",
                 "--eval-corpus", str(extra)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("default corpus, validation split: 2 texts, pooled cosine")
    assert lines[1].startswith(f"{extra} (all passages): 2 texts, pooled cosine mean")
    assert main(["adapt", "--evaluate", "--model", str(folder), "--no-validation"]) == 2
    assert "nothing to measure" in capsys.readouterr().err


def test_adapt_without_out_says_how(capsys):
    assert main(["adapt", "--steps", "1"]) == 2
    assert "give --out FOLDER" in capsys.readouterr().err
