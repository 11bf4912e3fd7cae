"""Tiny random stand-ins of the field's entmax checkpoints, saved as local folders.

Why: tests and benchmarks need the features of these checkpoints — ModernBERT's alternating
global and bidirectional local layers, the training code's config keys — with no download.

SparseModernBERT (``sardinelab/SparseModernBERT-alpha1.5`` / ``-alpha2.0``) and the
sparse-RoBERTa checkpoints of the same training code (deep-spin/SparseModernBERT) are stock
ModernBERT / RoBERTa weights whose config carries the training code's keys
(``initial_alpha``, ``alpha``, ``use_triton_entmax``, ``pre_iter``, ``post_iter``) and the
training code's class names under ``architectures``. These folders have the same keys, a
masked-LM head (its weights are unexpected for ``AutoModel``, as in the real checkpoints) and
an ``auto_map`` naming code that does not exist: loading must never try to run it.
The tokenizer is the caller's (tests pass the default model's WordPiece, which ships in a pip
package); load a folder with ``load_model(str(folder))``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    ModernBertConfig,
    ModernBertForMaskedLM,
    PreTrainedTokenizerBase,
    RobertaConfig,
    RobertaForMaskedLM,
)

TRAINING_KEYS = {"use_triton_entmax": False, "pre_iter": 5, "post_iter": 5}
#: ModernBERT layers: global every 3rd (0 and 3), local (±4 keys) in between.
MODERNBERT_LOCAL = 8


def _stamp(config: object, alpha: float, architecture: str) -> None:
    config.initial_alpha = alpha
    config.alpha = alpha
    for key, value in TRAINING_KEYS.items():
        setattr(config, key, value)
    config.architectures = [architecture]
    config.auto_map = {"AutoModel": "sparse_code.DoesNotExist"}  # must never be imported


def save_sparse_modernbert(folder: Path, tokenizer: PreTrainedTokenizerBase, *,
                           alpha: float = 1.5, layers: int = 4, **extra: object) -> Path:
    """A random 4-head ModernBERT (global layers 0, 3, …; local ±4 in between) with
    SparseModernBERT's config keys at ``alpha``; ``extra`` sets more config keys."""
    ids = {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.cls_token_id,
           "eos_token_id": tokenizer.sep_token_id, "cls_token_id": tokenizer.cls_token_id,
           "sep_token_id": tokenizer.sep_token_id}
    config = ModernBertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
        num_hidden_layers=layers, num_attention_heads=4, max_position_embeddings=256,
        local_attention=MODERNBERT_LOCAL, global_attn_every_n_layers=3,
        initializer_range=0.5, **ids)
    _stamp(config, alpha, "CustomModernBertForMaskedLM")
    for key, value in extra.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    ModernBertForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_sparse_roberta(folder: Path, tokenizer: PreTrainedTokenizerBase, *,
                        alpha: float = 2.0) -> Path:
    """A random 2-layer RoBERTa with the sparse-RoBERTa config keys at ``alpha``."""
    config = RobertaConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64, max_position_embeddings=130,
        pad_token_id=tokenizer.pad_token_id, initializer_range=0.5)
    _stamp(config, alpha, "CustomRobertaForMaskedLM")
    torch.manual_seed(0)
    RobertaForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
