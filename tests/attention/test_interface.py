"""α-entmax attention through transformers' AttentionInterface, on tiny models of each family."""

from __future__ import annotations

import pytest
import torch
from entmax import entmax15
from tolerances import (
    assert_same_support,
    attention_output_tol,
    entmax_prob_tol,
    matmul_bound,
    score_bound,
    sum_tol,
    support_bound,
    support_size,
    tol_for,
    transformer_terms,
)
from transformers import AutoModel

from sparsefinder.attention.interface import ENTMAX_ATTENTION, AttentionCall, capture, register
from sparsefinder.models.loading import load_model

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

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
        torch.testing.assert_close(rows, torch.ones_like(rows),
                                   atol=sum_tol(support_size(call.probs)), rtol=0)
        # Padding keys of the short text get probability exactly 0.
        short = int(lengths[0])
        assert torch.all(call.probs[0, :, :, short:] == 0)
        # The probabilities are entmax15 of the scores over the allowed keys.
        scores = call.query @ call.key.transpose(-1, -2) * call.scaling
        expected = entmax15(scores.masked_fill(~call.allowed, -1e9), dim=-1)
        expected = expected.masked_fill(~call.allowed, 0)
        # the scores recomputed here round like the model's at most by the product's bound
        score_err = score_bound(call.query, call.key, call.scaling)
        n = support_size(call.probs, expected)
        torch.testing.assert_close(call.probs, expected, atol=entmax_prob_tol(score_err, 1.5, n),
                                   rtol=0)
        assert call.causal == (family == "gpt2")
        if family == "gpt2":  # decoders never attend to the future
            n = call.probs.shape[-1]
            future = ~torch.ones(n, n, dtype=torch.bool).tril()
            assert torch.all(call.probs[..., future] == 0)
    # entmax is sparse: some allowed entries are exactly zero somewhere
    assert any(bool(((call.probs == 0) & call.allowed).any()) for call in calls)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_alpha_one_matches_stock_softmax(family, tiny_model_dirs):
    """Both in float64, so the tolerance is the whole forward's float64 rounding
    (tests/tolerances.py: transformer_terms), far below any difference a wrong mask or
    normaliser makes, whatever the CPU's kernels."""
    path = str(tiny_model_dirs[family])
    loaded = load_model(path, alpha=1.0, device="cpu")
    loaded.model.double()
    stock = AutoModel.from_pretrained(path, attn_implementation="eager").eval().double()
    input_ids, mask = _inputs(loaded.tokenizer, ["the cat sat", "on the mat today"])
    with torch.inference_mode():
        ours = loaded.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        theirs = stock(input_ids=input_ids, attention_mask=mask).last_hidden_state
    valid = mask.bool()
    config = stock.config
    terms = transformer_terms(layers=config.num_hidden_layers, hidden=config.hidden_size,
                              intermediate=config.n_inner or 4 * config.hidden_size
                              if family == "gpt2" else config.intermediate_size,
                              n=input_ids.shape[1])
    torch.testing.assert_close(ours[valid], theirs[valid], **tol_for(theirs, terms=terms))


@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.3])
def test_alpha_changes_sparsity_monotonically(alpha, tiny_model_dirs):
    loaded = load_model(str(tiny_model_dirs["bert"]), alpha=alpha, device="cpu")
    calls = _captured(loaded, ["several words make a row long enough to be sparse"])
    assert all(call.probs.min() >= 0 for call in calls)
    if alpha >= 1.5:
        assert any(bool((call.probs == 0).any()) for call in calls)


def test_batched_equals_single(tiny_model_dirs):
    """In float64: the padded batch and the text alone differ only by rounding (products over
    other shapes), bounded through the layers before (tests/tolerances.py)."""
    loaded = load_model(str(tiny_model_dirs["bert"]), alpha=1.5, device="cpu")
    loaded.model.double()
    config = loaded.model.config
    texts = ["one two", "three four five six seven"]
    together = _captured(loaded, texts)
    alone = _captured(loaded, [texts[0]])
    n = alone[0].probs.shape[-1]
    for layer, (a, b) in enumerate(zip(together, alone, strict=True)):
        terms = transformer_terms(layers=layer, hidden=config.hidden_size,
                                  intermediate=config.intermediate_size,
                                  n=together[0].probs.shape[-1]) + config.hidden_size
        q, k = b.query[0], b.key[0]
        q_err, k_err = tol_for(q, terms=terms)["atol"], tol_for(k, terms=terms)["atol"]
        torch.testing.assert_close(a.query[0, :, :n], q, atol=q_err, rtol=0)
        score_err = score_bound(q, k, b.scaling, q_err=q_err, k_err=k_err)
        torch.testing.assert_close(a.probs[0, :, :n, :n], b.probs[0],
                                   atol=entmax_prob_tol(score_err, 1.5, n, torch.float64),
                                   rtol=0)
        assert_same_support(a.probs[0, :, :n, :n], b.probs[0],
                            slack=support_bound(score_err, 1.5, n, torch.float64))


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
        score_err = matmul_bound(query[:, h], key[:, h // groups].transpose(-1, -2)) * d**-0.5
        prob_err = entmax_prob_tol(score_err, 1.5, n)
        torch.testing.assert_close(probs[:, h], expected, atol=prob_err, rtol=0)
        torch.testing.assert_close(output[:, :, h], expected @ value[:, h // groups],
                                   atol=attention_output_tol(prob_err, expected, value), rtol=0)
    # the same as transformers' own expansion of the key heads
    same, _ = entmax_attention_forward(module, query, repeat_kv(key, groups),
                                       repeat_kv(value, groups), None)
    torch.testing.assert_close(same, output, atol=0, rtol=0)
