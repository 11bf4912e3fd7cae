"""Tiny random decoder LLMs of the Llama, Qwen2 and Gemma families, saved as local folders.

Why: tests, benchmarks and the long-context sweep need models with the features of today's
decoders — grouped-query attention (fewer key/value heads than query heads), rotary
position embeddings and, where the family has them, sliding-window (local) layers — at long
n, with no download. Each family's own transformers config class builds them; the
tokenizer is the default model's WordPiece (shipped in a pip package) with its length limit
Their tokenizer is a small byte-level BPE (what these families use) trained in a second on
the bundled English texts and saved as a ``Qwen2Tokenizer`` (transformers forces that class
on every Qwen2 folder anyway), so ``load_model(folder)`` works offline like any checkpoint.

How heads are counted: always as QUERY heads (``num_attention_heads``). With GQA, query
head h reads key head ``h // (heads // kv_heads)`` (transformers' ``repeat_kv`` layout);
records, projections and metrics hold one entry per query head, each with its (shared) key
vectors, so a key head shared by g query heads appears g times.

Sliding-window layers: Qwen2 with ``use_sliding_window`` (layers ≥ ``max_window_layers``
are local), Gemma 2 (every other layer) and Gemma 3 (5 local : 1 global) declare them in
``config.layer_types``; transformers builds their masks, and the captured gold graphs, the
predictions and the metrics all respect them (``LayerGraph.sliding_window``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModel,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen2Tokenizer,
)

#: Families with a tiny config here (the name is also the folder name used by tests).
DECODER_FAMILIES: tuple[str, ...] = ("llama", "qwen2", "gemma2", "gemma3")
EOS = "<|endoftext|>"


def tiny_decoder_config(
    family: str,
    *,
    vocab_size: int,
    max_positions: int = 4096,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    sliding_window: int = 64,
    initializer_range: float = 0.5,
) -> PretrainedConfig:
    """A small random config of ``family`` with GQA, RoPE and (where the family has them)
    sliding-window layers. A wide ``initializer_range`` spreads the random scores so that
    α-entmax is sparse, as in a trained model."""
    if family not in DECODER_FAMILIES:
        raise ValueError(f"unknown decoder family {family!r}; choose from {DECODER_FAMILIES}")
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    common = dict(
        vocab_size=vocab_size, hidden_size=heads * head_dim, intermediate_size=2 * heads * head_dim,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, max_position_embeddings=max_positions,
        initializer_range=initializer_range, pad_token_id=0,
    )
    if family == "llama":
        return LlamaConfig(**common)
    if family == "qwen2":  # layer 0 global, the others local
        return Qwen2Config(**common, use_sliding_window=True, sliding_window=sliding_window,
                           max_window_layers=1)
    if family == "gemma2":  # alternating local/global, with attention-logit soft-capping
        return Gemma2Config(**common, sliding_window=sliding_window)
    types = ["sliding_attention"] * layers
    types[-1] = "full_attention"  # Gemma 3's pattern is 5 local : 1 global; keep one global
    # Gemma 3 normalises q and k (RMSNorm), so random scores stay small; a smaller
    # query_pre_attn_scalar (scaling = its -1/2 power) gives them a trained model's spread.
    return Gemma3TextConfig(**common, sliding_window=sliding_window, layer_types=types,
                            query_pre_attn_scalar=1)


def tiny_bpe_tokenizer(max_positions: int = 4096, vocab_size: int = 2000) -> Qwen2Tokenizer:
    """A byte-level BPE tokenizer trained on the bundled English texts (deterministic)."""
    import json
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from sparsefinder.bundle import examples_dir

    texts = [topics[key] for key in sorted(topics)]
    texts += [path.read_text() for path in sorted(examples_dir().glob("*.txt"))]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(texts, trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split()) for m in model["merges"]]
    return Qwen2Tokenizer(vocab=model["vocab"], merges=merges, model_max_length=max_positions,
                          eos_token=EOS, pad_token=EOS)


def save_tiny_decoder(family: str, folder: str | Path, *, max_positions: int = 4096,
                      seed: int = 0, **config: object) -> Path:
    """Build a random ``family`` model (see :func:`tiny_decoder_config`) and save it with a
    tokenizer to ``folder``; returns the folder (load it with ``load_model(str(folder))``)."""
    folder = Path(folder)
    tokenizer = tiny_bpe_tokenizer(max_positions)
    cfg = tiny_decoder_config(family, vocab_size=len(tokenizer), max_positions=max_positions,
                              **config)  # type: ignore[arg-type]
    torch.manual_seed(seed)
    model = AutoModel.from_config(cfg)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
