"""How much does restricting attention to a predicted graph change what the model computes?

Recall says how many gold edges a graph keeps; these measures say what the misses cost, on
the model's own outputs, comparing a forward pass restricted to the graph
(:func:`sparsefinder.evaluation.restricted.restrict`) with the full α-entmax forward pass on the
same
inputs. Every measure is 1 (or the reference perplexity) when the graph has recall 1
(sparse-consistency), and they are averaged over texts with each text weighing the same.

* **Hidden-state cosine** (:func:`hidden_cosine`): per layer ℓ, the mean over real tokens t
  of ``cos(h_ℓ,t, ĥ_ℓ,t)``, the output of block ℓ under full vs restricted attention (the
  embeddings, identical by construction, are skipped). The **output cosine** is the same for
  the model's final output ``last_hidden_state``.
* **Sentence-embedding cosine** (:meth:`EncodedTexts.embeddings`): all-MiniLM-L6-v2 embeds a
  text as the mean of its final token states over real tokens (sentence-transformers "mean
  pooling"); the measure is ``cos(e, ê)`` per text.
* **Retrieval agreement** (:func:`retrieval_agreement`): every text queries all the others
  by embedding cosine, once with full and once with restricted attention (queries and
  documents both embedded by the same system). *Top-1 agreement* is the fraction of queries
  whose nearest neighbour is the same. *nDCG@10* scores the restricted top 10 against the
  full ranking as ground truth: the full system's r-th neighbour (r = 0..9) has graded
  relevance ``10 - r``, everything else 0; ``DCG = Σ_i rel_i / log2(i + 2)`` over the
  restricted top 10, divided by the DCG of the full ranking itself (so 1 = same top 10 in
  the same order; with fewer than 11 texts, k = texts - 1).
* **Perplexity**: causal LMs (:func:`causal_lm_perplexity`): ``exp`` of the mean next-token
  negative log-likelihood over all real tokens of all texts. Masked LMs
  (:func:`pseudo_perplexity`, Salazar et al. 2020): each non-special token is masked in
  turn and scored from the rest; ``exp`` of the mean negative log-likelihood. Compare the
  value with a restriction (``graph_fn=...``) to the value without.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sparsefinder.evaluation.restricted import GraphFn, RestrictionStats, restrict

#: Neighbours scored by nDCG.
NDCG_K = 10


@contextmanager
def _maybe_restrict(
    model: nn.Module, graph_fn: GraphFn | None, **options: object
) -> Iterator[None]:
    with restrict(model, graph_fn, **options) if graph_fn is not None else nullcontext():
        yield


# ==================================================================== elementary measures


def token_cosine(a: Tensor, b: Tensor, mask: Tensor) -> Tensor:
    """Mean over real tokens of ``cos(a_t, b_t)``: (..., n, dim) × 2, bool (..., n) → (...).

    Bit-identical vectors count as exactly 1 (their float cosine may round to 1 - 1e-7)."""
    cos = F.cosine_similarity(a.float(), b.float(), dim=-1, eps=1e-12).clamp(-1.0, 1.0)
    same = (a == b).all(-1)
    cos = torch.where(same, torch.ones_like(cos), cos)
    weights = mask.to(cos.dtype)
    return (cos * weights).sum(-1) / weights.sum(-1).clamp(min=1)


def hidden_cosine(
    reference: Sequence[Tensor], restricted: Sequence[Tensor], mask: Tensor
) -> Tensor:
    """Per-layer token cosine: hidden states of blocks 1..L (index 0, the embeddings, is
    skipped) → (batch, L)."""
    if len(reference) != len(restricted):
        raise ValueError(f"got {len(reference)} reference and {len(restricted)} restricted states")
    return torch.stack(
        [token_cosine(a, b, mask) for a, b in zip(reference[1:], restricted[1:], strict=True)],
        dim=-1,
    )


def _ranking(embeddings: Tensor) -> Tensor:
    """Every text's neighbours, most similar first, itself excluded: (N, N - 1)."""
    sims = embeddings @ embeddings.T
    sims.fill_diagonal_(-math.inf)
    return sims.argsort(dim=-1, descending=True, stable=True)[:, :-1]


def retrieval_agreement(
    reference: Tensor, restricted: Tensor, k: int = NDCG_K
) -> dict[str, float]:
    """Top-1 agreement and nDCG@k of the restricted neighbour ranking (module docstring).

    ``reference`` and ``restricted``: (N, dim) embeddings of the same N ≥ 2 texts. The key is
    ``retrieval_ndcg10`` whatever ``k`` (k is capped at N - 1).
    """
    if reference.shape != restricted.shape or reference.dim() != 2:
        raise ValueError(
            f"expected two (texts, dim) embeddings of the same shape, got "
            f"{tuple(reference.shape)} and {tuple(restricted.shape)}"
        )
    if reference.shape[0] < 2:
        raise ValueError("retrieval agreement needs at least 2 texts (each queries the others)")
    return ranking_agreement(
        _ranking(F.normalize(reference.float(), dim=-1)),
        _ranking(F.normalize(restricted.float(), dim=-1)),
        k,
    )


def ranking_agreement(ref_rank: Tensor, res_rank: Tensor, k: int = NDCG_K) -> dict[str, float]:
    """Top-1 agreement and graded nDCG@k of rankings (queries, candidates) of candidate ids,
    best first; the reference's r-th candidate has relevance ``k - r`` (r < k), others 0."""
    queries, candidates = ref_rank.shape
    k = min(k, candidates)
    top1 = float((ref_rank[:, 0] == res_rank[:, 0]).double().mean())
    size = int(max(ref_rank.max(), res_rank.max())) + 1
    relevance = torch.zeros(queries, size, dtype=torch.float64)
    gains = torch.arange(k, 0, -1, dtype=torch.float64)  # k, k-1, ..., 1
    relevance.scatter_(1, ref_rank[:, :k], gains.expand(queries, k))
    discount = 1.0 / torch.log2(torch.arange(k, dtype=torch.float64) + 2)
    dcg = (relevance.gather(1, res_rank[:, :k]) * discount).sum(-1)
    ideal = (gains * discount).sum()
    return {"retrieval_top1": top1, "retrieval_ndcg10": float((dcg / ideal).mean())}


# ==================================================================== forward passes


@dataclass
class EncodedTexts:
    """Per text (unpadded): hidden states of every block and the final output."""

    hidden: list[Tensor] = field(default_factory=list)  # (L + 1, n, dim) per text
    output: list[Tensor] = field(default_factory=list)  # (n, dim) per text

    def embeddings(self) -> Tensor:
        """Mean-pooled (:func:`~sparsefinder.models.pooling.mean_pool`), normalised sentence
        embeddings (texts, dim); each text is unpadded, so every token is real."""
        return torch.stack([F.normalize(o.float().mean(0), dim=-1) for o in self.output])


def _batches(
    tokenizer: object, texts: Sequence[str], batch_size: int, max_length: int
) -> Iterator[tuple[list[int], dict[str, Tensor]]]:
    """Texts in batches of similar length (less padding); yields (indices, encoding)."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        encoding = tokenizer(  # type: ignore[operator]
            [texts[i] for i in chunk], padding=True, truncation=True, max_length=max_length,
            return_tensors="pt",
        )
        yield chunk, encoding


@torch.inference_mode()
def encode(
    model: nn.Module,
    tokenizer: object,
    texts: Sequence[str],
    *,
    graph_fn: GraphFn | None = None,
    batch_size: int = 8,
    max_length: int = 512,
    keep_hidden: bool = True,
    warn_empty: bool = True,
    stats: RestrictionStats | None = None,
) -> EncodedTexts:
    """Run ``model`` (a base model with hidden states) on ``texts``, optionally restricted
    (``warn_empty``, ``stats``: see :func:`sparsefinder.evaluation.restricted.restrict`)."""
    device = next(model.parameters()).device
    result = EncodedTexts()
    hidden: list[Tensor | None] = [None] * len(texts)
    output: list[Tensor | None] = [None] * len(texts)
    for chunk, encoding in _batches(tokenizer, texts, batch_size, max_length):
        encoding = {key: value.to(device) for key, value in encoding.items()}
        with _maybe_restrict(model, graph_fn, warn_empty=warn_empty, stats=stats):
            out = model(**encoding, output_hidden_states=keep_hidden)
        lengths = encoding["attention_mask"].sum(1).tolist()
        for row, (i, length) in enumerate(zip(chunk, lengths, strict=True)):
            mask = encoding["attention_mask"][row].bool()
            output[i] = out.last_hidden_state[row][mask].float().cpu()
            if keep_hidden:
                hidden[i] = torch.stack([h[row][mask] for h in out.hidden_states]).float().cpu()
            assert output[i].shape[0] == length
    result.output = [o for o in output if o is not None]
    result.hidden = [h for h in hidden if h is not None]
    return result


def compare(reference: EncodedTexts, restricted: EncodedTexts) -> dict[str, object]:
    """All embedding-model measures of a restricted run against the full one.

    Returns ``output_cosine``, ``embedding_cosine``, ``retrieval_top1``,
    ``retrieval_ndcg10`` (floats; macro over texts) and ``layer_cosine`` (list per block),
    when the reference kept its hidden states.
    """
    if len(reference.output) != len(restricted.output):
        raise ValueError("reference and restricted runs cover different numbers of texts")
    output = [
        float(token_cosine(a, b, torch.ones(a.shape[0], dtype=torch.bool)))
        for a, b in zip(reference.output, restricted.output, strict=True)
    ]
    ref_emb, res_emb = reference.embeddings(), restricted.embeddings()
    result: dict[str, object] = {
        "output_cosine": sum(output) / len(output),
        "embedding_cosine": float(
            token_cosine(ref_emb, res_emb, torch.ones(len(ref_emb), dtype=torch.bool))
        ),
    }
    if len(output) >= 2:
        result.update(retrieval_agreement(ref_emb, res_emb))
    if reference.hidden and restricted.hidden:
        per_text = torch.stack([  # (L + 1, n, dim) per text → (L,): blocks 1..L
            token_cosine(a[1:], b[1:], torch.ones(a.shape[:2], dtype=torch.bool)[1:])
            for a, b in zip(reference.hidden, restricted.hidden, strict=True)
        ])
        result["layer_cosine"] = [round(float(x), 6) for x in per_text.mean(0)]
    return result


# ==================================================================== perplexity


@torch.inference_mode()
def causal_lm_perplexity(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    graph_fn: GraphFn | None = None,
) -> float:
    """``exp`` of the mean next-token NLL over the real tokens of a (right-padded) batch of a
    causal LM (a ``...ForCausalLM``), optionally restricted to ``graph_fn``'s graph."""
    with _maybe_restrict(model, graph_fn):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logprobs = logits[:, :-1].float().log_softmax(-1)
    target = input_ids[:, 1:]
    nll = -logprobs.gather(-1, target[..., None])[..., 0]
    real = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    if not bool(real.any()):
        raise ValueError("perplexity needs texts of at least 2 tokens")
    return math.exp(float(nll[real].double().mean()))


@torch.inference_mode()
def pseudo_perplexity(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    mask_token_id: int,
    special_ids: Sequence[int] = (),
    graph_fn: GraphFn | None = None,
    batch_size: int = 32,
) -> float:
    """Pseudo-perplexity of a masked LM (a ``...ForMaskedLM``): every real, non-special token
    is masked in its own copy of the text and scored from the rest (one forward per token,
    batched), optionally restricted to ``graph_fn``'s graph."""
    special = torch.tensor(sorted(set(special_ids)), dtype=input_ids.dtype)
    rows, cols = (attention_mask.bool() & ~torch.isin(input_ids, special)).nonzero(as_tuple=True)
    if rows.numel() == 0:
        raise ValueError("pseudo-perplexity needs at least one non-special token")
    total = 0.0
    for start in range(0, rows.numel(), batch_size):
        r, c = rows[start : start + batch_size], cols[start : start + batch_size]
        ids = input_ids[r].clone()
        target = ids[torch.arange(len(r)), c].clone()
        ids[torch.arange(len(r)), c] = mask_token_id
        with _maybe_restrict(model, graph_fn):
            logits = model(input_ids=ids, attention_mask=attention_mask[r]).logits
        logprobs = logits[torch.arange(len(r)), c].float().log_softmax(-1)
        total += float(-logprobs.gather(-1, target[:, None]).double().sum())
    return math.exp(total / rows.numel())
