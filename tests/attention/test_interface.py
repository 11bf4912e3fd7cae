"""α-entmax attention through transformers' AttentionInterface, on tiny models of each family."""

from __future__ import annotations

import pytest
import torch
from entmax import entmax15
from transformers import AutoModel

from sparsefinder.attention.interface import ENTMAX_ATTENTION, AttentionCall, capture, register
from sparsefinder.models.loading import load_model

FAMILIES = ["bert", "roberta", "distilbert", "gpt2"]


def _inputs(tokenizer, texts):
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    return batch["input_ids"], batch["attention_mask"]


def _captured(loaded, texts) -> list[AttentionCall]:
    calls: list[AttentionCall] = []
    input_ids, mask = _inputs(loaded.tokenizer, texts)
    with torch.inference_mode(), capture(calls.append):
        loaded.model(input_ids=input_ids, attention_mask=mask)
    return calls


def test_register_is_idempotent_and_named():
    assert register() == ENTMAX_ATTENTION
    assert register() == ENTMAX_ATTENTION


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_runs_entmax_with_exact_zeros(family, tiny_model_dirs):
    loaded = load_model(str(tiny_model_dirs[family]), alpha=1.5, device="cpu")
    assert loaded.model.config._attn_implementation == ENTMAX_ATTENTION
    texts = ["a short one", "a somewhat longer sentence with more words in it"]
    calls = _captured(loaded, texts)
    assert [call.layer for call in calls] == list(range(loaded.num_layers))
    lengths = _inputs(loaded.tokenizer, texts)[1].sum(1)
    for call in calls:
        rows = call.probs.sum(-1)
        torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-5, rtol=0)
        # Padding keys of the short text get probability exactly 0.
        short = int(lengths[0])
        assert torch.all(call.probs[0, :, :, short:] == 0)
        # The probabilities are entmax15 of the scores over the allowed keys.
        scores = call.query @ call.key.transpose(-1, -2) * call.scaling
        expected = entmax15(scores.masked_fill(~call.allowed, -1e9), dim=-1)
        expected = expected.masked_fill(~call.allowed, 0)
        torch.testing.assert_close(call.probs, expected, atol=1e-6, rtol=0)
        assert call.causal == (family == "gpt2")
        if family == "gpt2":  # decoders never attend to the future
            n = call.probs.shape[-1]
            future = ~torch.ones(n, n, dtype=torch.bool).tril()
            assert torch.all(call.probs[..., future] == 0)
    # entmax is sparse: some allowed entries are exactly zero somewhere
    assert any(bool(((call.probs == 0) & call.allowed).any()) for call in calls)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_alpha_one_matches_stock_softmax(family, tiny_model_dirs):
    path = str(tiny_model_dirs[family])
    loaded = load_model(path, alpha=1.0, device="cpu")
    stock = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    input_ids, mask = _inputs(loaded.tokenizer, ["the cat sat", "on the mat today"])
    with torch.inference_mode():
        ours = loaded.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        theirs = stock(input_ids=input_ids, attention_mask=mask).last_hidden_state
    valid = mask.bool()
    torch.testing.assert_close(ours[valid], theirs[valid], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.3])
def test_alpha_changes_sparsity_monotonically(alpha, tiny_model_dirs):
    loaded = load_model(str(tiny_model_dirs["bert"]), alpha=alpha, device="cpu")
    calls = _captured(loaded, ["several words make a row long enough to be sparse"])
    assert all(call.probs.min() >= 0 for call in calls)
    if alpha >= 1.5:
        assert any(bool((call.probs == 0).any()) for call in calls)


def test_batched_equals_single(tiny_model_dirs):
    loaded = load_model(str(tiny_model_dirs["bert"]), alpha=1.5, device="cpu")
    texts = ["one two", "three four five six seven"]
    together = _captured(loaded, texts)
    alone = _captured(loaded, [texts[0]])
    n = alone[0].probs.shape[-1]
    for a, b in zip(together, alone, strict=True):
        torch.testing.assert_close(a.probs[0, :, :n, :n], b.probs[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_heads_read_their_shared_key_head(causal):
    """GQA: query head h uses key/value head h // groups (transformers' repeat_kv layout);
    checked head by head against the entmax package on the un-repeated tensors."""
    from types import SimpleNamespace

    from entmax import entmax15
    from transformers.models.llama.modeling_llama import repeat_kv

    from sparsefinder.attention.interface import entmax_attention_forward

    g = torch.Generator().manual_seed(0)
    batch, q_heads, kv_heads, n, d = 2, 6, 2, 5, 8
    query = torch.randn(batch, q_heads, n, d, generator=g)
    key = torch.randn(batch, kv_heads, n, d, generator=g)
    value = torch.randn(batch, kv_heads, n, d, generator=g)
    module = SimpleNamespace(config=SimpleNamespace(entmax_alpha=1.5), is_causal=causal,
                             training=False)
    output, probs = entmax_attention_forward(module, query, key, value, None)
    assert probs.shape == (batch, q_heads, n, n) and output.shape == (batch, n, q_heads, d)
    groups = q_heads // kv_heads
    for h in range(q_heads):
        scores = query[:, h] @ key[:, h // groups].transpose(-1, -2) * d**-0.5
        if causal:
            scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -1e9)
        expected = entmax15(scores, dim=-1)
        torch.testing.assert_close(probs[:, h], expected, atol=1e-6, rtol=0)
        torch.testing.assert_close(output[:, :, h], expected @ value[:, h // groups],
                                   atol=1e-5, rtol=0)
    # the same as transformers' own expansion of the key heads
    same, _ = entmax_attention_forward(module, query, repeat_kv(key, groups),
                                       repeat_kv(value, groups), None)
    torch.testing.assert_close(same, output, atol=0, rtol=0)
