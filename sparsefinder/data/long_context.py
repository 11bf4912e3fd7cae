"""Long-context gold records: bounded-memory extraction, as the records every scorer reads.

:func:`sparsefinder.data.records.extract_edges` computes a long text's gold edges block
by block without an (n, n) score matrix per head; :func:`extract_long` turns them into an
ordinary :class:`~sparsefinder.data.records.AttentionRecord` (bool gold masks: n²/8 bytes a head,
2 MiB at n = 4096, where the dense extraction path needs ~32 bytes a score of working
memory), with the sliding windows of the model's local layers, so predictors, the
:class:`~sparsefinder.metrics.scorer.Scorer`, sweeps and the app use it unchanged.

:func:`long_texts` builds texts of exactly ``n_tokens`` tokens from a corpus split by
concatenating its passages in order (train and validation stay apart).

:func:`extract_supports` keeps only each layer's support, bit-packed and on the model's device
(:class:`~sparsefinder.attention.support_bits.SupportBits`): how a ~1 B decoder's gold graphs
at 16 384 tokens fit in a GPU's memory (16 GiB of bits), where its edge lists would not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sparsefinder.attention.interface import EdgeCall, capture_edges
from sparsefinder.attention.masks import n_allowed_pairs
from sparsefinder.attention.support_bits import SupportBits
from sparsefinder.data.corpus import load_corpus
from sparsefinder.data.records import (
    AttentionRecord,
    LayerGraph,
    check_text,
    extract,
    extract_edges,
    whole_text_ids,
)
from sparsefinder.models.loading import LoadedModel


def _soft_capped(loaded: LoadedModel) -> bool:
    return bool(getattr(loaded.model.config, "attn_logit_softcapping", None))


def extract_long(loaded: LoadedModel, text: str, *, budget_mib: float = 256) -> AttentionRecord:
    """The gold record of ONE text of up to the model's maximum length, in bounded memory.

    Models with attention-logit soft-capping (Gemma 2) go through :func:`extract` instead:
    the bounded path computes plain scaled scores.
    """
    check_text(text)
    if _soft_capped(loaded):
        (record,) = extract(loaded, text, long_text="error")
        return record
    edges = extract_edges(loaded, text, budget_mib=budget_mib)
    encoding = loaded.tokenizer(text, return_offsets_mapping=True,
                                return_special_tokens_mask=True)
    windows = loaded.sliding_window_layers
    layers = []
    for index, layer in enumerate(edges.layers):
        gold = layer.edges.to_dense().cpu()
        layers.append(LayerGraph(
            queries=layer.queries, keys=layer.keys, gold=gold,
            prob_values=layer.edges.values.float().cpu(),  # CSR order = gold.nonzero() order
            scaling=layer.scaling, sliding_window=windows.get(index), alpha=layer.alpha,
        ))
    return AttentionRecord(
        text=text, tokens=edges.tokens,
        offsets=[tuple(o) for o in encoding["offset_mapping"]],
        special=[bool(s) for s in encoding["special_tokens_mask"]],
        causal=edges.causal, layers=layers,
    )


def long_texts(tokenizer: object, n_tokens: int, count: int, split: str = "validation",
               corpus: str = "default") -> list[str]:
    """``count`` texts of ``n_tokens`` tokens each, from consecutive passages of ``split``.

    Fewer texts come back when the split runs out; a split too short for one text is an
    error naming its size.
    """
    if n_tokens < 1 or count < 1:
        raise ValueError(f"n_tokens and count must be >= 1, got {n_tokens} and {count}")
    ids: list[int] = []
    for passage in load_corpus(corpus, split):
        ids += tokenizer(passage + "\n\n", add_special_tokens=False)["input_ids"]
        if len(ids) >= n_tokens * count:
            break
    texts = [tokenizer.decode(ids[i:i + n_tokens])
             for i in range(0, len(ids) - n_tokens + 1, n_tokens)][:count]
    if not texts:
        raise ValueError(f"the {split} split of {corpus!r} has only {len(ids)} tokens, fewer "
                         f"than one text of {n_tokens}")
    return texts


@dataclass
class SupportRecord:
    """Tokens and every layer's bit-packed gold support of one long text."""

    text: str
    tokens: list[str]
    causal: bool
    layers: list[SupportBits]
    #: layer index -> sliding window W of the model's local layers (see ``AttentionCall``)
    sliding_windows: dict[int, int]

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def sparsity(self) -> float:
        """1 − support pairs / pairs each head may attend to (causal triangle, windows), over
        every layer."""
        kept = sum(layer.nnz for layer in self.layers)
        n = self.n_tokens
        allowed = sum(layer.heads * n_allowed_pairs(n, n, causal=self.causal,
                                                    sliding_window=self.sliding_windows.get(i))
                      for i, layer in enumerate(self.layers))
        return 1.0 - kept / max(allowed, 1)


@torch.inference_mode()
def extract_supports(loaded: LoadedModel, text: str, *, budget_mib: float = 256,
                     max_edge_mib: float = 4096) -> SupportRecord:
    """Every layer's gold support of ONE text (up to the model's maximum length), bit-packed
    and left on the model's device, in bounded working memory (``budget_mib`` a block; each
    layer's bits, ``heads · n · ⌈n/8⌉`` bytes, capped by ``max_edge_mib``)."""
    if _soft_capped(loaded):
        raise ValueError("bounded extraction does not apply attention-logit soft-capping "
                         "(Gemma 2); use graphs.extract() for this model")
    ids = whole_text_ids(loaded, text)
    layers: list[SupportBits] = []

    def sink(call: EdgeCall) -> None:
        layers.append(call.edges[0])

    input_ids = torch.tensor([ids], device=loaded.device)
    with capture_edges(sink, budget_mib=budget_mib, max_edge_mib=max_edge_mib, form="bits"):
        loaded.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
    return SupportRecord(text, loaded.tokenizer.convert_ids_to_tokens(ids), loaded.causal,
                         layers, dict(loaded.sliding_window_layers))
