"""The adapter file: round trip on a tiny model, and every bad input a clear error."""

from __future__ import annotations

import pytest
import torch
from tolerances import forward_tol
from transformers import AutoModel

from sparsefinder.adaptation.distill import adapter_metadata, lora_student
from sparsefinder.adaptation.objective import AdaptConfig
from sparsefinder.models.adapter_file import AdapterError, apply_adapter, read_adapter, save_adapter

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


def _adapter(folder, out, scale=0.05):
    """A LoRA adapter with non-zero B for the tiny BERT at ``folder``, saved to ``out``."""
    from peft import get_peft_model_state_dict

    model = AutoModel.from_pretrained(folder)
    config = AdaptConfig(rank=2, targets=("attention", "ffn"))
    student = lora_student(model, config)
    torch.manual_seed(1)
    for name, param in student.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0, scale)
    meta = adapter_metadata(student, config, "tiny-bert", "bert", {"training_data": "none"})
    save_adapter(out, get_peft_model_state_dict(student), meta)
    return student


def test_round_trip_merges_the_same_function(tiny_model_dirs, tmp_path):
    folder = tiny_model_dirs["bert"]
    student = _adapter(folder, tmp_path / "a.safetensors").eval()
    merged, meta = apply_adapter(AutoModel.from_pretrained(folder), tmp_path / "a.safetensors")
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    with torch.no_grad():
        expected = student(input_ids=ids).last_hidden_state
        got = merged.eval()(input_ids=ids).last_hidden_state
        plain = AutoModel.from_pretrained(folder).eval()(input_ids=ids).last_hidden_state
    # merged weights W + BA against W·x + B·(A·x): the forward's rounding and the merge's
    # (rank 2 more terms per weight), in float32
    tol = forward_tol(merged.config, expected, ids.shape[1])
    torch.testing.assert_close(got, expected, **tol)
    assert float((got - plain).abs().max()) > tol["atol"]  # the adapter changed the model
    assert meta["base_model"] == "tiny-bert" and meta["rank"] == "2"
    assert type(merged).__name__ == "BertModel"  # merged: no PEFT layers at inference


def test_truncated_and_foreign_files_are_clear_errors(tiny_model_dirs, tmp_path):
    _adapter(tiny_model_dirs["bert"], tmp_path / "a.safetensors")
    data = (tmp_path / "a.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(AdapterError, match="corrupt or truncated"):
        read_adapter(tmp_path / "cut.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(AdapterError, match="corrupt or truncated"):
        read_adapter(tmp_path / "junk.safetensors")
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(AdapterError, match="not a Sparsefinder entmax adapter"):
        read_adapter(tmp_path / "other.safetensors")
    with pytest.raises(AdapterError, match="not found"):
        read_adapter(tmp_path / "missing.safetensors")


def test_adapter_for_another_base_model_is_refused(tiny_model_dirs, tmp_path):
    folder = tiny_model_dirs["bert"]
    _adapter(folder, tmp_path / "a.safetensors")
    other = AutoModel.from_pretrained(folder)
    with torch.no_grad():
        other.encoder.layer[0].attention.self.query.weight.add_(0.1)  # same shapes, other weights
    with pytest.raises(AdapterError, match="fingerprint mismatch"):
        apply_adapter(other, tmp_path / "a.safetensors")


def test_uncovered_model_family_is_refused(tiny_model_dirs, tmp_path):
    _adapter(tiny_model_dirs["bert"], tmp_path / "a.safetensors")
    gpt2 = AutoModel.from_pretrained(tiny_model_dirs["gpt2"])
    with pytest.raises(AdapterError, match="covers model family 'bert', not 'gpt2'"):
        apply_adapter(gpt2, tmp_path / "a.safetensors")


def test_other_model_size_is_refused(tiny_model_dirs, tmp_path, default_model):
    _adapter(tiny_model_dirs["bert"], tmp_path / "a.safetensors")
    from sparsefinder.models.loading import ModelLoadError, load_model

    with pytest.raises(ModelLoadError, match="another model size"):
        load_model("default-softmax", adapter=tmp_path / "a.safetensors", device="cpu")
