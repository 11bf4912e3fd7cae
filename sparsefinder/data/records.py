"""Gold attention graphs: what each α-entmax head actually attends to, per text.

An :class:`AttentionRecord` holds one text (or one chunk of a long text): its tokens with
character offsets and, per layer, the exact query and key vectors that entered QKᵀ plus the
gold graph. Probabilities are kept only on the gold edges (``prob_values``, in the row-major
order of ``gold.nonzero()``) and the gold mask is stored bit-packed
(:mod:`~sparsefinder.attention.packed_mask`), read back dense per layer on access: a
2048-token text on a 16-layer, 32-head decoder keeps 256 MiB of gold bits instead of 2 GiB
of bool masks (or 8 GiB of float probabilities).
Padding is stripped, so no metric ever counts it.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from tqdm.auto import tqdm

from sparsefinder.attention.gold_edges import DEFAULT_BUDGET_MIB, DEFAULT_MAX_EDGE_MIB, GoldEdges
from sparsefinder.attention.interface import (
    AttentionCall,
    EdgeCall,
    UnsupportedModelError,
    capture,
    capture_edges,
)
from sparsefinder.attention.masks import layer_allowed
from sparsefinder.attention.packed_mask import PackedMaskField, count_packed, unpack_mask
from sparsefinder.models.loading import LoadedModel


class TextInputError(ValueError):
    """A text cannot be turned into an attention graph; the message says why and what to do."""


class LongTextWarning(UserWarning):
    """A text was longer than the model's maximum length and was truncated or chunked."""


_GOLD = PackedMaskField()  # LayerGraph.gold: stored 8 keys a byte, read dense


@dataclass
class LayerGraph:
    """One layer of one text: vectors entering QKᵀ and the gold graph.

    ``gold`` is given and read as a dense bool (heads, n, m) mask but stored 8 keys a byte:
    each read unpacks a fresh copy (assign ``gold`` to change it). Read it once per layer,
    or one head with :meth:`gold_of`; :attr:`gold_shape` needs no unpacking.
    """

    queries: Tensor  # float32 (heads, n, d)
    keys: Tensor  # float32 (heads, m, d)
    gold: Tensor = _GOLD  # bool (heads, n, m): True where entmax's probability > 0
    prob_values: Tensor  # float32 (edges,): probabilities on gold edges, row-major order
    scaling: float
    #: A local layer's window W: keys ``0 <= i - j < W`` (a decoder's) or ``|i - j| < W`` (a
    #: bidirectional encoder's, ModernBERT) are allowed (gold, predictions and the sparsity
    #: denominator all use ``masks.layer_allowed`` with the record's ``causal``).
    sliding_window: int | None = None
    #: The layer's α (None: not recorded, taken as entmax). α = 1 is a softmax layer: its gold
    #: graph is dense, so predictor training and macro averages leave it out (``is_softmax``).
    alpha: float | None = None

    @property
    def is_softmax(self) -> bool:
        """Whether the layer ran softmax (α = 1): nothing sparse to predict there."""
        return self.alpha is not None and float(self.alpha) == 1.0

    @property
    def gold_shape(self) -> tuple[int, int, int]:
        """(heads, n, m) of the gold mask, without unpacking it."""
        packed, m = _GOLD.packed(self)
        return (*packed.shape[:-1], m)

    def gold_of(self, head: int | slice | Tensor, rows: slice | None = None) -> Tensor:
        """The dense gold mask of ``head`` (an index, a slice or a list of heads) only, and of
        its query ``rows`` only when given (a window of a long text unpacks its rows, not
        the head's n²)."""
        packed, m = _GOLD.packed(self)
        part = packed[head] if rows is None else packed[head][..., rows, :]
        return unpack_mask(part, m)

    def gold_count(self, head: int | slice, rows: slice = slice(None)) -> int:
        """Gold edges of ``head`` (an index or a slice of heads) in its query ``rows``,
        counted on the packed bits."""
        packed, _ = _GOLD.packed(self)
        return int(count_packed(packed[head, rows]).sum())

    def stored_bytes(self) -> int:
        """Bytes of tensor data the layer holds (q, k, packed gold, probabilities)."""
        packed, _ = _GOLD.packed(self)
        return sum(t.numel() * t.element_size()
                   for t in (self.queries, self.keys, packed, self.prob_values))

    def to(self, device: torch.device | str) -> LayerGraph:
        """This layer with its vectors, packed gold bits and probabilities on ``device`` (the
        bits move packed: a GPU-resident record never unpacks on the host)."""
        moved = copy.copy(self)  # shares nothing mutable: every tensor is replaced below
        packed, m = _GOLD.packed(self)
        moved.__dict__[_GOLD.slot] = (packed.to(device), m)
        moved.queries, moved.keys = self.queries.to(device), self.keys.to(device)
        moved.prob_values = self.prob_values.to(device)
        return moved

    @property
    def device(self) -> torch.device:
        """Where the layer's tensors are."""
        return self.queries.device

    def probs(self) -> Tensor:
        """Dense (heads, n, m) probabilities, built on demand."""
        dense = torch.zeros(self.gold_shape, dtype=self.prob_values.dtype,
                            device=self.prob_values.device)
        dense[self.gold] = self.prob_values
        return dense

    def scores(self, causal: bool = False) -> Tensor:
        """The attention scores QKᵀ·scaling that entmax saw (future masked to -inf if causal)."""
        scores = torch.matmul(self.queries, self.keys.transpose(-1, -2)) * self.scaling
        n, m = scores.shape[-2:]
        allowed = layer_allowed(n, m, causal=causal, sliding_window=self.sliding_window)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        return scores


@dataclass
class AttentionRecord:
    """Tokens and per-layer gold graphs of one text (no padding)."""

    text: str
    tokens: list[str]
    offsets: list[tuple[int, int]]
    special: list[bool]
    causal: bool
    layers: list[LayerGraph] = field(default_factory=list)
    truncated: bool = False

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_heads(self) -> int:
        return int(self.layers[0].gold_shape[0]) if self.layers else 0

    def gold_masks(self) -> list[Tensor]:
        return [layer.gold for layer in self.layers]

    def to(self, device: torch.device | str) -> AttentionRecord:
        """This record with every layer on ``device`` (see :meth:`LayerGraph.to`)."""
        return dataclasses.replace(self, layers=[layer.to(device) for layer in self.layers])


def check_text(text: object) -> str:
    """Reject input that has no tokens to attend over, with a message a user can act on."""
    if not isinstance(text, str):
        raise TextInputError(f"expected a string of text, got {type(text).__name__}")
    if not text.strip():
        raise TextInputError("the text is empty; paste or upload some text (one word or more)")
    return text


def _tokenize(
    loaded: LoadedModel, texts: Sequence[str], long_text: str
) -> tuple[list[dict], list[bool]]:
    """Tokenize each text; long texts become one truncated item or several chunks."""
    tokenizer = loaded.tokenizer
    items: list[dict] = []
    long_flags: list[bool] = []
    for index, text in enumerate(texts):
        encoding = tokenizer(
            text,
            truncation=long_text != "error",
            max_length=loaded.max_length,
            return_overflowing_tokens=long_text == "chunk",
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
        )
        ids = encoding["input_ids"]
        windows = [i for i in range(len(ids))] if ids and isinstance(ids[0], list) else None
        if windows is None:
            encoding = {key: [value] for key, value in encoding.items()}
        n_windows = len(encoding["input_ids"])
        full_length = len(tokenizer(text, add_special_tokens=True, truncation=False)["input_ids"])
        too_long = full_length > loaded.max_length
        if too_long and long_text == "error":
            raise TextInputError(
                f"text {index} has {full_length} tokens, more than the model's maximum of "
                f"{loaded.max_length}; shorten it or use long_text='truncate' or 'chunk'"
            )
        for window in range(n_windows):
            items.append(
                {
                    "text": text,
                    "input_ids": encoding["input_ids"][window],
                    "offsets": [tuple(o) for o in encoding["offset_mapping"][window]],
                    "special": [bool(s) for s in encoding["special_tokens_mask"][window]],
                }
            )
            long_flags.append(too_long)
        if too_long:
            what = (
                f"split into {n_windows} chunks of at most {loaded.max_length} tokens"
                if long_text == "chunk"
                else f"truncated to its first {loaded.max_length} tokens"
            )
            warnings.warn(
                f"text {index} has {full_length} tokens, more than the model's maximum of "
                f"{loaded.max_length}: {what}",
                LongTextWarning,
                stacklevel=4,  # _tokenize < extract < inference_mode wrapper < caller
            )
    return items, long_flags


def _layer_graph(call: AttentionCall, row: int, length: int) -> LayerGraph:
    """Cut one batch row out of a captured call, drop padding, keep only the gold edges."""
    probs = call.probs[row, :, :length, :length]
    gold = probs > 0
    return LayerGraph(
        queries=call.query[row, :, :length].detach().float().cpu().contiguous(),
        keys=call.key[row, :, :length].detach().float().cpu().contiguous(),
        gold=gold.cpu(),
        prob_values=probs[gold].detach().float().cpu(),
        scaling=call.scaling,
        sliding_window=call.sliding_window,
        alpha=call.alpha,
    )


@torch.inference_mode()
def extract(
    loaded: LoadedModel,
    texts: str | Iterable[str],
    *,
    batch_size: int = 8,
    long_text: str = "truncate",
    progress: bool = False,
) -> list[AttentionRecord]:
    """Run the model with entmax attention and return one gold-graph record per text/chunk.

    ``long_text``: ``"truncate"`` (default; warns), ``"chunk"`` (one record per window of
    the model's maximum length; warns) or ``"error"``.
    """
    if long_text not in {"truncate", "chunk", "error"}:
        raise ValueError(f"long_text must be 'truncate', 'chunk' or 'error', got {long_text!r}")
    if isinstance(texts, str):
        texts = [texts]
    texts = [check_text(text) for text in texts]
    if not texts:
        raise TextInputError("no texts given; pass at least one non-empty text")
    items, long_flags = _tokenize(loaded, texts, long_text)
    order = sorted(range(len(items)), key=lambda i: len(items[i]["input_ids"]))
    records: list[AttentionRecord | None] = [None] * len(items)
    pad_id = loaded.tokenizer.pad_token_id
    tokenizer = loaded.tokenizer
    bar = tqdm(total=len(items), desc="gold graphs", unit="text", disable=not progress)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        lengths = [len(items[i]["input_ids"]) for i in batch]
        width = max(lengths)
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (i, length) in enumerate(zip(batch, lengths, strict=True)):
            input_ids[row, :length] = torch.tensor(items[i]["input_ids"])
            attention_mask[row, :length] = 1
        per_row: list[list[LayerGraph]] = [[] for _ in batch]

        def sink(call: AttentionCall, per_row=per_row, lengths=lengths) -> None:
            for row, length in enumerate(lengths):
                per_row[row].append(_layer_graph(call, row, length))

        with capture(sink):
            loaded.model(
                input_ids=input_ids.to(loaded.device),
                attention_mask=attention_mask.to(loaded.device),
            )
        if not per_row[0]:  # a model whose layers never called the entmax function
            raise UnsupportedModelError(
                f"model {loaded.model_id!r} ran without calling α-entmax attention in any layer "
                "(its attention does not go through transformers' AttentionInterface); "
                "load it with sparsefinder.models.loading.load_model"
            )
        for row, i in enumerate(batch):
            item = items[i]
            records[i] = AttentionRecord(
                text=item["text"],
                tokens=tokenizer.convert_ids_to_tokens(item["input_ids"]),
                offsets=item["offsets"],
                special=item["special"],
                causal=loaded.causal,
                layers=per_row[row],
                truncated=long_flags[i] and long_text == "truncate",
            )
        bar.update(len(batch))
    bar.close()
    return [record for record in records if record is not None]


@dataclass
class LayerEdges:
    """One layer of one long text: q/k entering QKᵀ and the gold graph as CSR edges."""

    queries: Tensor  # float32 (heads, n, d)
    keys: Tensor  # float32 (heads, m, d)
    edges: GoldEdges
    scaling: float
    alpha: float | None = None


@dataclass
class EdgeRecord:
    """Tokens and per-layer gold edges of one text, extracted in bounded memory."""

    text: str
    tokens: list[str]
    causal: bool
    layers: list[LayerEdges] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def whole_text_ids(loaded: LoadedModel, text: str) -> list[int]:
    """The token ids of ONE text, whole: a text longer than the model's maximum length is an
    error (the bounded extractions never truncate silently)."""
    check_text(text)
    ids = loaded.tokenizer(text, truncation=False)["input_ids"]
    if len(ids) > loaded.max_length:
        raise TextInputError(
            f"the text has {len(ids)} tokens, more than the model's maximum of "
            f"{loaded.max_length}; shorten it, or use a long-context model"
        )
    return ids


@torch.inference_mode()
def extract_edges(
    loaded: LoadedModel,
    text: str,
    *,
    budget_mib: float = DEFAULT_BUDGET_MIB,
    max_edge_mib: float = DEFAULT_MAX_EDGE_MIB,
) -> EdgeRecord:
    """Gold edges of every layer for ONE text, never holding an (n, n) matrix per head.

    For long inputs (thousands of tokens, on a model whose positions reach that far): memory
    is ~``budget_mib`` per block plus the edges (see :mod:`sparsefinder.attention.gold_edges`). A
    text
    longer than the model's maximum length is an error (no silent truncation here).
    """
    ids = whole_text_ids(loaded, text)
    layers: list[LayerEdges] = []

    def sink(call: EdgeCall) -> None:
        layers.append(LayerEdges(
            queries=call.query[0].detach().float().cpu().contiguous(),
            keys=call.key[0].detach().float().cpu().contiguous(),
            edges=call.edges[0].to("cpu"),
            scaling=call.scaling,
            alpha=call.alpha,
        ))

    input_ids = torch.tensor([ids], device=loaded.device)
    with capture_edges(sink, budget_mib=budget_mib, max_edge_mib=max_edge_mib):
        loaded.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
    return EdgeRecord(text, loaded.tokenizer.convert_ids_to_tokens(ids), loaded.causal, layers)
