"""Loading models: the bundled default offline, local folders, and clear errors."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.attention.interface import ENTMAX_ATTENTION
from sparsefinder.models.loading import ModelLoadError, load_model, resolve_device, set_alpha


def test_default_model_loads_offline(default_model):
    info = default_model.describe()
    assert info["layers"] == 6 and info["heads"] == 12 and info["head_dim"] == 32
    assert info["alpha"] == 1.5 and info["causal"] is False
    assert info["max_length"] == 512
    assert default_model.model.config._attn_implementation == ENTMAX_ATTENTION


def test_local_folder_and_causal_flag(tiny_model_dirs):
    assert load_model(str(tiny_model_dirs["gpt2"]), device="cpu").causal is True
    assert load_model(str(tiny_model_dirs["bert"]), device="cpu").causal is False
    assert load_model(str(tiny_model_dirs["roberta"]), device="cpu").max_length == 64


@pytest.mark.parametrize("alpha", [0.5, 0.999, -1, float("nan"), float("inf"), "1.5", True])
def test_bad_alpha_is_rejected_with_a_message(alpha):
    with pytest.raises(ValueError, match="alpha"):
        load_model("default", alpha=alpha)


def test_no_alpha_means_the_models_own_else_1_5(tiny_model_dirs):
    loaded = load_model(str(tiny_model_dirs["bert"]), alpha=None, device="cpu")
    assert loaded.alpha == 1.5 and loaded.alpha_source == "default"
    assert loaded.layer_alphas == [1.5, 1.5]


def test_unknown_model_names_what_was_tried(tmp_path):
    with pytest.raises(ModelLoadError) as error:
        load_model("no-such-org/no-such-model", device="cpu")
    message = str(error.value)
    assert "no-such-org/no-such-model" in message and "HF_HUB_OFFLINE" in message
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(str(empty), device="cpu")
    with pytest.raises(ModelLoadError, match="empty"):
        load_model("   ")


def test_device_resolution():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(ModelLoadError, match="device"):
        resolve_device("tpu-42")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="CUDA"):
            resolve_device("cuda")


def test_set_alpha_changes_attention_without_reload(tiny_model_dirs):
    loaded = load_model(str(tiny_model_dirs["bert"]), alpha=1.5, device="cpu")
    set_alpha(loaded, 2.0)
    assert loaded.model.config.entmax_alpha == 2.0 and loaded.alpha == 2.0
    with pytest.raises(ValueError, match="alpha"):
        set_alpha(loaded, 0.3)


def test_missing_folder_says_folder_not_found(tmp_path):
    for name in (str(tmp_path / "nope"), "./no/such/folder", "~/no-such-sparsefinder-model"):
        with pytest.raises(ModelLoadError) as error:
            load_model(name, device="cpu")
        message = str(error.value)
        assert "folder not found" in message and "Repo id" not in message
    a_file = tmp_path / "weights.bin"
    a_file.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="is a file, not a model folder"):
        load_model(str(a_file), device="cpu")


def test_model_that_does_not_fit_is_refused_before_reading_weights(tiny_model_dirs, monkeypatch):
    from sparsefinder.models import loading as models

    class NoWeights:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            raise AssertionError("weights were read although the model does not fit")

    monkeypatch.setattr(models, "AutoModel", NoWeights)
    monkeypatch.setattr(models, "available_memory_bytes", lambda: 1024)
    with pytest.raises(ModelLoadError, match=r"needs about .* MB .* free; it was not loaded"):
        load_model(str(tiny_model_dirs["bert"]), device="cpu")


def test_concurrent_loads_are_serialised(tiny_model_dirs, monkeypatch):
    import threading
    import time

    from sparsefinder.models import loading as models

    real = models.AutoModel
    active, peak, lock = [0], [0], threading.Lock()

    class Counting:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.2)  # long enough for the other thread to arrive
            try:
                return real.from_pretrained(*args, **kwargs)
            finally:
                with lock:
                    active[0] -= 1

    monkeypatch.setattr(models, "AutoModel", Counting)
    results = []
    threads = [threading.Thread(target=lambda n=n: results.append(
        load_model(str(tiny_model_dirs[n]), device="cpu"))) for n in ("bert", "gpt2", "bert")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 3 and peak[0] == 1


def test_gpu_memory_is_checked_too(tiny_model_dirs, monkeypatch):
    """On a GPU the weights must also fit in free GPU memory (no GPU needed to test it)."""
    from transformers import AutoConfig

    from sparsefinder.models import loading as models

    folder = str(tiny_model_dirs["bert"])
    config = AutoConfig.from_pretrained(folder)
    monkeypatch.setattr(models.torch.cuda, "mem_get_info", lambda device=None: (1024, 2**34))
    models._check_memory("tiny", folder, config, torch.device("cpu"))  # host memory: plenty
    with pytest.raises(ModelLoadError, match="only 0 MB of GPU memory on cuda is free"):
        models._check_memory("tiny", folder, config, torch.device("cuda"))


def test_a_local_folder_holding_the_bundled_weights_is_the_default_model(tmp_path):
    from sparsefinder.bundle import bundle
    from sparsefinder.models.loading import DEFAULT_MODEL_ID, SOFTMAX_MODEL_ID, default_model_path
    from sparsefinder.projections.heads import HeadProjections, ProjectionsError

    link = tmp_path / "my-minilm"
    link.symlink_to(default_model_path(), target_is_directory=True)
    loaded = load_model(str(link), device="cpu")
    assert loaded.model_id == SOFTMAX_MODEL_ID and loaded.adapter is None  # = default-softmax
    # the bundled projections are for the adapted model, so they are refused for the raw one
    with pytest.raises(ProjectionsError, match="trained for model"):
        HeadProjections.load(bundle().path("projections.pt"), expected_model_id=loaded.model_id)
    adapted = load_model(str(link), device="cpu", adapter=bundle().path("adapter"))
    assert adapted.model_id == DEFAULT_MODEL_ID
    # so the bundled projections are accepted for it (the id, not the spelling, is compared)
    HeadProjections.load(bundle().path("projections.pt"), expected_model_id=adapted.model_id)
