"""Shared fixtures: the bundled default model (loaded once) and tiny random models on disk."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Without a GPU, Triton kernels run in Triton's CPU interpreter (the Triton kernel's tests).
# Triton reads this when it is first imported, and transformers imports it (through
# torch._dynamo) long before any test runs: it must be set here, before anything else.
if not Path("/dev/nvidiactl").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# CI runs the property tests on a fixed set of examples (a red CI must be reproducible, and
# must not depend on the draw); local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

REPO = Path(__file__).resolve().parents[1]
# The tests' shared helpers (tolerances.py: tolerances from dtype eps and magnitudes) import as
# top-level modules from every test folder.
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))


def pytest_configure(config) -> None:
    """Under pytest-xdist (``make test`` runs ``-n auto``), each worker gets its share of the
    cores for torch's intra-op threads: two workers × all cores each would oversubscribe the
    machine and run slower than one process."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers is None:
        return
    threads = str(max(1, (os.cpu_count() or 1) // int(workers)))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, threads)  # also for the servers and torchrun it starts
    import torch

    torch.set_num_threads(int(threads))


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked ``cuda`` skip (and say so) on machines without a CUDA GPU."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible here)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def default_model():
    """all-MiniLM-L6-v2 with entmax-1.5 attention; shared because loading costs seconds."""
    from sparsefinder.models.loading import load_model

    return load_model("default", alpha=1.5, device="cpu")


@pytest.fixture(scope="session")
def default_model64(default_model):
    """A float64 copy of the default model: for comparisons of two evaluations (batched and
    alone, blocked and dense) whose float64 rounding differences are far below any bug's
    (tests/tolerances.py), whatever the CPU's kernels."""
    import copy
    import dataclasses

    return dataclasses.replace(default_model, model=copy.deepcopy(default_model.model).double())


@pytest.fixture(scope="session")
def default_tokenizer(default_model):
    return default_model.tokenizer


def _save_tiny(tmp_dir: Path, config, tokenizer) -> Path:
    import torch
    from transformers import AutoModel

    torch.manual_seed(0)
    model = AutoModel.from_config(config)
    model.save_pretrained(tmp_dir)
    tokenizer.save_pretrained(tmp_dir)
    return tmp_dir


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory, default_tokenizer) -> dict[str, Path]:
    """Tiny randomly initialised models of each supported family, saved as local folders.

    All use the default model's WordPiece tokenizer, so no download is needed.
    """
    from transformers import BertConfig, DistilBertConfig, GPT2Config, RobertaConfig

    vocab = default_tokenizer.vocab_size
    # A wide initialisation makes the random attention scores spread out, so entmax is sparse.
    wide = {"initializer_range": 0.5}
    configs = {
        "bert": BertConfig(
            vocab_size=vocab,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            **wide,
        ),
        "roberta": RobertaConfig(
            vocab_size=vocab,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=66,
            pad_token_id=0,
            **wide,
        ),
        "distilbert": DistilBertConfig(
            vocab_size=vocab,
            dim=32,
            n_layers=2,
            n_heads=4,
            hidden_dim=64,
            max_position_embeddings=64,
            **wide,
        ),
        "gpt2": GPT2Config(
            vocab_size=vocab,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            bos_token_id=101,
            eos_token_id=102,
            **wide,
        ),
    }
    root = tmp_path_factory.mktemp("tiny_models")
    return {
        name: _save_tiny(root / name, config, default_tokenizer) for name, config in configs.items()
    }


@pytest.fixture(scope="session")
def tiny_entmax_bert():
    """A 2-layer, 4-head random BERT with α = 1.5 attention and the default tokenizer: small
    enough to run the restricted model on many settings (accuracy tests)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from sparsefinder.attention.interface import use_entmax
    from sparsefinder.models.loading import LoadedModel, default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=128, initializer_range=0.5)
    model = BertModel(config).eval()
    use_entmax(model, 1.5)
    return LoadedModel(model=model, tokenizer=tokenizer, model_id="tiny", alpha=1.5,
                       device=torch.device("cpu"), causal=False, max_length=128)


@pytest.fixture(scope="session")
def sparse_modernbert_dir(tmp_path_factory, default_tokenizer) -> Path:
    """A tiny SparseModernBERT-like folder (α = 1.5 in its config; layers 0 and 3 global, 1
    and 2 local ±4), see :mod:`sparsefinder.models.encoders`."""
    from sparsefinder.models.encoders import save_sparse_modernbert

    return save_sparse_modernbert(tmp_path_factory.mktemp("sparse_modernbert"),
                                  default_tokenizer, alpha=1.5)


@pytest.fixture(scope="session")
def sparse_modernbert_records(sparse_modernbert_dir):
    """Gold records of four texts on that model (two softmax local layers)."""
    from sparsefinder.data.records import extract
    from sparsefinder.models.loading import load_model

    loaded = load_model(str(sparse_modernbert_dir), device="cpu")
    texts = ["Sparse attention keeps only the keys that matter, and the rest get zero.",
             "The cat sat on the mat while the dog slept by the warm fire all night long.",
             "Entmax gives exact zeros; softmax never does, whatever the scores are.",
             "Local layers look at their neighbours, global layers at the whole text."]
    return extract(loaded, texts)
