"""The bundled entmax adapter: `default` is the adapted model, `default-softmax` the raw one.

Fidelity and sparsity are checked on a few validation passages (the full measurement, 45
passages, is `make assets-adapter`'s; its numbers are in the file's metadata).
"""

from __future__ import annotations

import json
import shutil

import pytest

from sparsefinder.adaptation.distill import measure, softmax_teacher
from sparsefinder.bundle import bundle, narrative_holdout
from sparsefinder.data.corpus import default_corpus, load_texts
from sparsefinder.models.adapter_file import read_adapter
from sparsefinder.models.loading import (
    DEFAULT_MODEL_ID,
    SOFTMAX_MODEL_ID,
    ModelLoadError,
    load_model,
)


@pytest.fixture(scope="module")
def softmax_model():
    return load_model("default-softmax", device="cpu")


@pytest.mark.slow
def test_default_is_adapted_and_softmax_one_name_away(default_model, softmax_model):
    assert default_model.model_id == DEFAULT_MODEL_ID and default_model.adapter is not None
    assert "entmax-1.5 adapter" in default_model.describe()["adapter"]
    assert softmax_model.model_id == SOFTMAX_MODEL_ID and softmax_model.adapter is None
    assert "none" in softmax_model.describe()["adapter"]


@pytest.mark.slow
def test_adapted_model_is_faithful_and_sparse(default_model, softmax_model):
    texts = default_corpus("validation")[:6]
    teacher = softmax_teacher(softmax_model.model)
    tok = default_model.tokenizer
    adapted = measure(default_model.model, teacher, tok, texts, default_model.device)
    raw = measure(softmax_model.model, teacher, tok, texts, softmax_model.device)
    assert adapted.mean_cosine >= 0.95 and adapted.min_cosine >= 0.90
    assert adapted.mean_cosine > raw.mean_cosine + 0.05  # the adapter is what closes the gap
    assert adapted.sparsity >= 0.88


@pytest.mark.slow
def test_adapted_model_generalizes_to_the_narrative_holdout(default_model, softmax_model):
    """Story and news prose the adapter never saw (the full set: `adapt --evaluate`)."""
    texts = load_texts(narrative_holdout())[:6]
    teacher = softmax_teacher(softmax_model.model)
    adapted = measure(default_model.model, teacher, default_model.tokenizer, texts,
                      default_model.device)
    assert adapted.mean_cosine >= 0.90 and adapted.min_cosine >= 0.90
    assert adapted.sparsity >= 0.88


def test_asset_is_small_and_says_what_it_is():
    assert bundle().path("adapter").stat().st_size <= 10 * 1024 * 1024
    _, meta = read_adapter(bundle().path("adapter"))
    assert meta["base_model"] == SOFTMAX_MODEL_ID and meta["alpha"] == "1.5"
    assert "train split" in meta["training_data"] and "adapt" in meta["command"]
    after = json.loads(meta["after"])
    assert after["texts"] == len(default_corpus("validation"))
    assert after["mean_cosine"] >= 0.9 and len(after["layer_sparsity"]) == 6


@pytest.mark.slow
def test_broken_bundled_adapter_is_a_clear_load_error(tmp_path):
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(bundle().path("adapter").read_bytes()[:100_000])
    with pytest.raises(ModelLoadError, match="corrupt or truncated.*make assets-adapter"):
        load_model("default-softmax", adapter=cut, device="cpu")
    same = tmp_path / "entmax_adapter.safetensors"
    shutil.copy(bundle().path("adapter"), same)
    assert load_model("default-softmax", adapter=same, device="cpu").adapter is not None
