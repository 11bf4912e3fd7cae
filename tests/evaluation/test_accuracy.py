"""Accuracy measures: hand-checked retrieval scores, and (pseudo-)perplexity with and without
restriction on tiny random BERT-MLM and GPT-2 LM models built here."""

from __future__ import annotations

import math

import pytest
import torch
from tolerances import bound, config_terms, tol_for
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

from sparsefinder.attention.entmax_ops import reference_mode
from sparsefinder.attention.interface import use_entmax
from sparsefinder.evaluation.accuracy import (
    EncodedTexts,
    causal_lm_perplexity,
    compare,
    encode,
    pseudo_perplexity,
    ranking_agreement,
    retrieval_agreement,
    token_cosine,
)
from sparsefinder.evaluation.restricted import per_text
from sparsefinder.models.loading import default_model_path
from sparsefinder.predictors import Window

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

TEXTS = ["Sparse attention keeps a few keys per query.", "Entmax gives exact zeros here."]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(default_model_path())


def _window(size: int):
    return per_text(lambda layer, q, k, causal: Window(size).predict(q, k, causal=causal))


def _everything():
    return per_text(lambda layer, q, k, causal: torch.ones(q.shape[0], q.shape[1], k.shape[1],
                                                           dtype=torch.bool))


def test_token_cosine_and_mean_pool() -> None:
    a = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [5.0, 5.0]]])
    b = torch.tensor([[[2.0, 0.0], [1.0, 0.0], [-1.0, 1.0]]])
    mask = torch.tensor([[True, True, False]])
    assert token_cosine(a, b, mask).tolist() == [0.5]  # (1 + 0) / 2, padding ignored
    assert token_cosine(a, a, mask).tolist() == [1.0]
    pooled = EncodedTexts(output=[a[0, :2]]).embeddings()  # an unpadded text's two tokens
    expected = torch.tensor([[0.5, 1.0]], dtype=torch.float64) / 1.25**0.5  # mean, unit norm
    # a mean of 2, a norm of 2 squares, a square root and a division: a few roundings
    torch.testing.assert_close(pooled.double(), expected,
                               **tol_for(expected, terms=6, dtype=torch.float32))


def test_retrieval_agreement_by_hand() -> None:
    ref = torch.eye(4)[:, :3].clone()  # 4 texts in 3-d
    ref[3] = torch.tensor([0.9, 0.1, 0.0])  # text 3 is closest to text 0
    same = retrieval_agreement(ref, ref)
    assert same == {"retrieval_top1": 1.0, "retrieval_ndcg10": 1.0}
    moved = ref.clone()
    moved[3] = torch.tensor([0.1, 0.9, 0.0])  # now closest to text 1
    scores = retrieval_agreement(ref, moved, k=3)
    # Texts 0 and 1 still find text 3 first (cosine 0.11 beats 0); text 2 is orthogonal to
    # all (ties: lowest id, 0, both times); only text 3 changes, from text 0 to text 1.
    assert scores["retrieval_top1"] == 0.75
    assert 0 < scores["retrieval_ndcg10"] < 1
    with pytest.raises(ValueError, match="at least 2 texts"):
        retrieval_agreement(ref[:1], ref[:1])


def test_ndcg_uses_graded_relevance_of_the_full_ranking() -> None:
    ref = torch.tensor([[1, 2, 3, 4], [0, 2, 3, 4]])
    res = torch.tensor([[2, 1, 3, 4], [0, 2, 4, 3]])  # query 0 swaps its top two
    scores = ranking_agreement(ref, res, k=3)
    d = [1 / math.log2(i + 2) for i in range(3)]
    ideal = 3 * d[0] + 2 * d[1] + 1 * d[2]
    q0 = (2 * d[0] + 3 * d[1] + 1 * d[2]) / ideal
    q1 = (3 * d[0] + 2 * d[1] + 0 * d[2]) / ideal  # its 3rd is outside the reference top 3
    assert scores["retrieval_top1"] == 0.5
    assert scores["retrieval_ndcg10"] == pytest.approx((q0 + q1) / 2, rel=1e-12)


def _nll_rel_tol(model, logits: torch.Tensor, n: int) -> float:
    """Relative tolerance of a perplexity, exp(mean NLL), between two float32 evaluations (the
    batched and the by-hand one, ours and transformers' loss): the NLL's error (the forward,
    the head's transform and vocabulary projection, the log-softmax over the vocabulary, at
    the logits' magnitude) is the perplexity's relative error to first order."""
    config = model.config
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    terms = config_terms(config, n) + 2 * hidden + config.vocab_size
    return bound(float(logits.abs().max()), terms=terms)


def _mlm():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=64, initializer_range=0.5)
    model = BertForMaskedLM(config).eval()
    use_entmax(model, 1.5)
    return model


def _lm():
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=30522, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                        initializer_range=0.5)
    model = GPT2LMHeadModel(config).eval()
    use_entmax(model, 1.5)
    return model


def test_pseudo_perplexity_of_a_masked_lm(tokenizer) -> None:
    model = _mlm()
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    kwargs = dict(mask_token_id=tokenizer.mask_token_id, special_ids=tokenizer.all_special_ids,
                  batch_size=7)
    with reference_mode():
        full = pseudo_perplexity(model, batch["input_ids"], batch["attention_mask"], **kwargs)
        everything = pseudo_perplexity(model, batch["input_ids"], batch["attention_mask"],
                                       graph_fn=_everything(), **kwargs)
    window = pseudo_perplexity(model, batch["input_ids"], batch["attention_mask"],
                               graph_fn=_window(1), **kwargs)
    assert math.isfinite(full) and full > 1
    assert everything == full  # a graph with every pair changes nothing
    assert window != pytest.approx(full, rel=1e-3)
    # By hand for one text: mask each non-special token in turn.
    ids = tokenizer(TEXTS[:1], return_tensors="pt")["input_ids"]
    nll = []
    with torch.inference_mode():
        for i in range(1, ids.shape[1] - 1):
            masked = ids.clone()
            masked[0, i] = tokenizer.mask_token_id
            logits = model(input_ids=masked).logits[0, i]
            nll.append(-logits.log_softmax(-1)[ids[0, i]].item())
    ones = torch.ones_like(ids)
    assert pseudo_perplexity(model, ids, ones, **kwargs) == pytest.approx(
        math.exp(sum(nll) / len(nll)), rel=_nll_rel_tol(model, logits, ids.shape[1]))


def test_perplexity_of_a_causal_lm(tokenizer) -> None:
    model = _lm()
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with reference_mode():
        full = causal_lm_perplexity(model, ids, mask)
        everything = causal_lm_perplexity(model, ids, mask, graph_fn=_everything())
    window = causal_lm_perplexity(model, ids, mask, graph_fn=_window(3))
    assert full == everything and math.isfinite(full)
    assert window != pytest.approx(full, rel=1e-3)
    # Against transformers' own loss on one unpadded text.
    one = tokenizer(TEXTS[:1], return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model(input_ids=one, labels=one)
    assert causal_lm_perplexity(model, one, torch.ones_like(one)) == pytest.approx(
        math.exp(float(out.loss)), rel=_nll_rel_tol(model, out.logits, one.shape[1]))
    with pytest.raises(ValueError, match="at least 2 tokens"):
        causal_lm_perplexity(model, one[:, :1], torch.ones_like(one[:, :1]))


@pytest.mark.slow
def test_default_model_measures_on_short_texts(default_model) -> None:
    texts = [
        "The interpreter reads a source file and executes it statement by statement.",
        "A module is a file containing definitions; its name is the file name.",
        "Exceptions propagate up the call stack until a handler catches them.",
    ]
    loaded = default_model
    ref = encode(loaded.model, loaded.tokenizer, texts, batch_size=2)
    with reference_mode():
        again = encode(loaded.model, loaded.tokenizer, texts, batch_size=3,
                       graph_fn=_everything())
    same = compare(ref, again)
    # cosine of (nearly) equal float32 vectors: a dot product and two norms of d terms each
    hidden = loaded.model.config.hidden_size
    assert same["output_cosine"] == pytest.approx(1.0, abs=bound(1.0, terms=2 * hidden + 4))
    assert same["retrieval_top1"] == 1.0 and same["retrieval_ndcg10"] == pytest.approx(1.0)
    assert len(same["layer_cosine"]) == loaded.num_layers
    narrow = compare(ref, encode(loaded.model, loaded.tokenizer, texts, graph_fn=_window(1),
                                 warn_empty=False))
    assert narrow["output_cosine"] < 0.95 and narrow["embedding_cosine"] < 0.99
    assert narrow["layer_cosine"][0] > narrow["layer_cosine"][-1]  # errors grow with depth
