"""α-entmax attention for Hugging Face models, through ``transformers.AttentionInterface``.

Registering a named attention function (and its mask builder) is the supported way to swap
attention in transformers ≥ 4.48: no model class is patched. Every model whose attention
layers dispatch through ``ALL_ATTENTION_FUNCTIONS`` (BERT, RoBERTa, DistilBERT, ELECTRA, GPT-2,
Llama, …) runs α-entmax once its config says ``_attn_implementation = ENTMAX_ATTENTION``.

The function also feeds an optional *sink* (see :func:`capture`) with the exact query and key
vectors that enter QKᵀ and the resulting probabilities, so gold graphs can be extracted
without a second forward pass or hooks on private modules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from sparsefinder.attention.entmax_ops import entmax_normalize
from sparsefinder.attention.gold_edges import (
    DEFAULT_BUDGET_MIB,
    DEFAULT_MAX_EDGE_MIB,
    GoldEdges,
    entmax_edges,
)
from sparsefinder.attention.masks import shared_causal_mask, sliding_window_mask
from sparsefinder.attention.support_bits import SupportBits

ENTMAX_ATTENTION = "sparsefinder_entmax"
DEFAULT_ALPHA = 1.5


@dataclass(frozen=True)
class AttentionCall:
    """What one attention layer saw in one forward pass (batched, padded)."""

    layer: int
    query: Tensor  # (batch, heads, n, d), as it enters QKᵀ (before scaling)
    key: Tensor  # (batch, heads, m, d)
    probs: Tensor  # (batch, heads, n, m)
    allowed: Tensor  # bool, broadcastable to probs: False for padding / future keys
    scaling: float
    causal: bool
    #: A local layer's window W: key j is visible to query i iff ``0 <= i - j < W`` (causal:
    #: Mistral/Qwen2/Gemma) or ``|i - j| < W`` (bidirectional: ModernBERT), see ``masks``.
    sliding_window: int | None = None
    #: The layer's α (1 = softmax: a dense gold graph, see :func:`use_entmax`).
    alpha: float = DEFAULT_ALPHA


AttentionSink = Callable[[AttentionCall], None]
_sink: ContextVar[tuple[AttentionSink, list[int]] | None] = ContextVar(
    "sparsefinder_sink", default=None
)


@contextmanager
def capture(sink: AttentionSink) -> Iterator[None]:
    """Within this block, every entmax attention call is passed to ``sink`` in layer order.

    The sink should reduce what it keeps (e.g. to sparse edges) right away: holding every
    layer's dense probabilities of a 512-token batch would cost hundreds of MB.
    """
    token = _sink.set((sink, [0]))
    try:
        yield
    finally:
        _sink.reset(token)


@dataclass(frozen=True)
class EdgeCall:
    """One layer of a forward pass under :func:`capture_edges`: gold edges, no dense probs.

    ``edges[b]`` is batch row b's :class:`~sparsefinder.attention.gold_edges.GoldEdges` over the
    padded (n, m); padding keys never get an edge, padding query rows get none either when
    the model masks them completely.
    """

    layer: int
    query: Tensor  # (batch, heads, n, d), as it enters QKᵀ (before scaling)
    key: Tensor  # (batch, heads, m, d)
    edges: list[GoldEdges | SupportBits]  # SupportBits under capture_edges(form="bits")
    scaling: float
    causal: bool
    alpha: float = DEFAULT_ALPHA


EdgeSink = Callable[[EdgeCall], None]


@dataclass(frozen=True)
class _EdgeCapture:
    sink: EdgeSink
    counter: list[int]
    budget_mib: float
    max_edge_mib: float
    form: str = "edges"


_edge_sink: ContextVar[_EdgeCapture | None] = ContextVar("sparsefinder_edge_sink", default=None)


@contextmanager
def capture_edges(
    sink: EdgeSink,
    *,
    budget_mib: float = DEFAULT_BUDGET_MIB,
    max_edge_mib: float = DEFAULT_MAX_EDGE_MIB,
    form: str = "edges",
) -> Iterator[None]:
    """Within this block, entmax attention runs block by block in bounded memory.

    Every entmax layer computes its scores one block of heads/queries at a time
    (:func:`~sparsefinder.attention.gold_edges.entmax_edges`, ~``budget_mib`` each), feeds the
    attention output back to the model exactly as the dense path would, and hands ``sink``
    an :class:`EdgeCall` with the layer's gold edges — never an (n, m) matrix per head. This
    is how to get gold graphs of long inputs (8192 tokens) from a model::

        layers = []
        with torch.inference_mode(), capture_edges(layers.append):
            model(input_ids=ids)
        layers[3].edges[0].row(head, query)   # keys, probabilities

    A layer whose edges would exceed ``max_edge_mib`` raises
    :class:`~sparsefinder.attention.gold_edges.ExtractionMemoryError` naming the token limit.
    Restricted attention (:func:`restrict_keys`) cannot run in this mode. ``form="bits"``
    hands each layer its support bit-packed (a
    :class:`~sparsefinder.attention.support_bits.SupportBits`, left on the model's device)
    instead of CSR edges: for long inputs whose edges would outgrow the bits.
    """
    if form not in ("edges", "bits"):
        raise ValueError(f"form must be 'edges' or 'bits', got {form!r}")
    token = _edge_sink.set(_EdgeCapture(sink, [0], budget_mib, max_edge_mib, form))
    try:
        yield
    finally:
        _edge_sink.reset(token)


#: ``restriction(module, query, key, allowed, causal, scaling) -> allowed``: narrows the keys
#: each query may attend to before entmax (:mod:`sparsefinder.evaluation.restricted` builds one).
KeyRestriction = Callable[[nn.Module, Tensor, Tensor, Tensor, bool, float], Tensor]
_restriction: ContextVar[KeyRestriction | None] = ContextVar(
    "sparsefinder_restriction", default=None
)


@contextmanager
def restrict_keys(restriction: KeyRestriction) -> Iterator[None]:
    """Within this block, every entmax attention call attends only to the keys that
    ``restriction`` leaves allowed (it gets, and returns, the bool allowed-mask)."""
    token = _restriction.set(restriction)
    try:
        yield
    finally:
        _restriction.reset(token)


def allowed_keys(attention_mask: Tensor | None, query: Tensor, key: Tensor, causal: bool) -> Tensor:
    """Bool mask (True = may attend) from whatever mask format the model handed us."""
    n, m = query.shape[-2], key.shape[-2]
    if attention_mask is None:
        if causal:
            return shared_causal_mask(n, m, query.device)[None, None]
        return torch.ones(1, 1, n, m, dtype=torch.bool, device=query.device)
    if attention_mask.dtype == torch.bool:
        return attention_mask[..., -m:]
    # Additive float mask: 0 where allowed, a very negative number where not.
    return attention_mask[..., -m:] > torch.finfo(attention_mask.dtype).min / 2


def entmax_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[Tensor, Tensor]:
    """Drop-in for transformers' eager attention with α-entmax in place of softmax."""
    alpha = layer_alpha(module)
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    if key.shape[1] != query.shape[1]:
        # Grouped-query attention: query head h reads key/value head h // groups (the
        # layout of transformers' ``repeat_kv``), so every query head gets its own copy of
        # its shared key head and heads are counted as query heads everywhere downstream.
        groups = query.shape[1] // key.shape[1]
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    causal = bool(getattr(module, "is_causal", False)) and query.shape[-2] > 1
    restriction = _restriction.get()
    edge_capture = _edge_sink.get()
    if edge_capture is not None:
        # No mask from the model: the causal triangle comes from positions, block by block.
        allowed = None if attention_mask is None else allowed_keys(
            attention_mask, query, key, causal)
        if restriction is not None:
            raise ValueError(
                "capture_edges() and restrict_keys() cannot be combined: bounded extraction "
                "computes the gold graph of full attention; use one of them per forward pass"
            )
        if kwargs.get("softcap"):
            raise ValueError(
                "capture_edges() does not apply attention-logit soft-capping (Gemma 2), so its "
                "gold graph would not be the model's; use graphs.extract() for this model"
            )
        if alpha == 1.0:
            raise ValueError(
                "capture_edges() extracts sparse gold graphs, but this layer runs softmax "
                "(α = 1: every allowed pair is an edge); use graphs.extract() for a model with "
                "softmax layers, or give every layer an α > 1 (--alpha-layers)"
            )
        return _edges_forward(edge_capture, query, key, value, allowed, alpha, float(scaling),
                              causal)
    allowed = allowed_keys(attention_mask, query, key, causal)
    if restriction is not None:
        allowed = restriction(module, query, key, allowed, causal, float(scaling))
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    softcap = kwargs.get("softcap")
    if softcap:  # Gemma 2: scores squashed to (-cap, cap) before the normaliser, as in eager
        scores = torch.tanh(scores / softcap) * softcap
    if restriction is None:
        probs = entmax_normalize(scores, alpha, allowed)
    else:
        probs = _restricted_entmax(scores, alpha, allowed)
    current = _sink.get()
    if current is not None:
        sink, counter = current
        window = int(kwargs["sliding_window"]) if kwargs.get("sliding_window") else None
        if window and not causal:
            _check_bidirectional_window(allowed, window)
        sink(AttentionCall(counter[0], query, key, probs, allowed, float(scaling), causal,
                           window, alpha))
        counter[0] += 1
    weights = nn.functional.dropout(probs, p=dropout, training=module.training)
    output = torch.matmul(weights.to(value.dtype), value).transpose(1, 2).contiguous()
    return output, probs


def _edges_forward(
    capture_: _EdgeCapture, query: Tensor, key: Tensor, value: Tensor, allowed: Tensor | None,
    alpha: float, scaling: float, causal: bool,
) -> tuple[Tensor, None]:
    """The attention output computed block by block, and the layer's edges to the sink.

    The model's causal mask is applied by :func:`entmax_edges` itself (from positions, so
    no (n, m) mask is built); a padding mask is passed down sliced per batch row.
    """
    batch = query.shape[0]
    outputs, edges = [], []
    full = allowed is None or bool(allowed.all())
    for b in range(batch):
        mask = None if full else allowed[b if allowed.shape[0] > 1 else 0]
        row_edges, out = entmax_edges(
            query[b], key[b], scaling, alpha=alpha, causal=causal, allowed=mask, value=value[b],
            budget_mib=capture_.budget_mib, max_edge_mib=capture_.max_edge_mib,
            form=capture_.form,
        )
        outputs.append(out)
        edges.append(row_edges)
    capture_.sink(EdgeCall(capture_.counter[0], query, key, edges, scaling, causal, alpha))
    capture_.counter[0] += 1
    output = torch.stack(outputs).transpose(1, 2).contiguous()
    return output, None


def layer_alpha(module: nn.Module) -> float:
    """The α of the layer ``module`` belongs to: ``config.entmax_alpha_layers[layer_idx]``
    when :func:`use_entmax` got one α per layer, else ``config.entmax_alpha``."""
    config = module.config
    alphas = getattr(config, "entmax_alpha_layers", None)
    if alphas:
        index = getattr(module, "layer_idx", None)
        if not isinstance(index, int) or not 0 <= index < len(alphas):
            raise UnsupportedModelError(
                f"per-layer α needs attention modules that know their layer index; "
                f"{type(module).__name__} has layer_idx={index!r} for {len(alphas)} α values; "
                "give this model one α for every layer (--alpha)"
            )
        return float(alphas[index])
    return float(getattr(config, "entmax_alpha", DEFAULT_ALPHA))


def _check_bidirectional_window(allowed: Tensor, window: int) -> None:
    """Refuse a bidirectional local layer whose mask reaches beyond ``|i - j| < window``.

    Why: records store only the window W, and predictions and metrics rebuild the allowed
    pairs from it (:func:`~sparsefinder.attention.masks.layer_allowed`); a model that passes
    W in another convention would get gold edges outside that band, silently miscounted.
    """
    n, m = allowed.shape[-2:]
    outside = ~sliding_window_mask(n, m, window, allowed.device, causal=False)
    if bool((allowed & outside).any()):
        raise UnsupportedModelError(
            f"this bidirectional local layer attends beyond the window |i - j| < {window} that "
            "transformers passed to the attention function (flash attention's convention); "
            "its gold graph could not be cut to its window, so it is refused"
        )


_OFF_GRAPH = -1e9  # far below every α > 1 support (τ* ≥ max - 2), as entmax_ops' masking


def _restricted_entmax(scores: Tensor, alpha: float, allowed: Tensor) -> Tensor:
    """``entmax_normalize(scores, alpha, allowed)`` for a dense per-head ``allowed``, cheaper.

    Why: ``masked_fill`` with a (batch, heads, n, m) mask costs ~10 ms a call at n=512 on a
    CPU, twice a layer; adding a bool tensor and multiplying by it are plain elementwise
    passes (~2 ms). Off-graph scores become ``score - 1e9`` (exactly -1e9 in float32 for
    |score| < 32) and get probability exactly 0; kept scores are untouched, so the support
    and the probabilities are those of masking with -1e9.
    """
    probs = entmax_normalize(torch.add(scores, ~allowed, alpha=_OFF_GRAPH), alpha)
    return probs * allowed if probs.requires_grad else probs.mul_(allowed)


def _entmax_mask(*args: object, **kwargs: object) -> Tensor | None:
    """A boolean (batch, 1, n, m) mask that is never skipped, so padding is always known."""
    kwargs["allow_is_causal_skip"] = False
    kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kwargs)


def register() -> str:
    """Register the entmax attention function and its mask builder (idempotent)."""
    AttentionInterface.register(ENTMAX_ATTENTION, entmax_attention_forward)
    AttentionMaskInterface.register(ENTMAX_ATTENTION, _entmax_mask)
    return ENTMAX_ATTENTION


class UnsupportedModelError(ValueError):
    """The model's attention does not dispatch through transformers' AttentionInterface."""


def check_attention_interface(model: nn.Module) -> None:
    """Refuse a model family whose attention layers never call the registered function.

    Why: transformers only warns when such a model is switched to a custom implementation,
    and it then keeps running its own softmax, so every "gold graph" would be empty and
    every entmax claim wrong. The class flag ``_supports_attention_backend`` is how
    transformers marks the families whose layers dispatch through the interface.
    """
    if getattr(type(model), "_supports_attention_backend", False):
        return
    family = getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__
    raise UnsupportedModelError(
        f"the {family!r} model family ({type(model).__name__}) computes attention in its own "
        "code, not through transformers' AttentionInterface, so α-entmax cannot be switched "
        "on (it would silently stay softmax); use a family that supports it (BERT, RoBERTa, "
        "GPT-2, Llama, Mistral, Qwen2, Gemma, …)"
    )


def use_entmax(model: nn.Module, alpha: float,
               layer_alphas: Sequence[float] | None = None) -> None:
    """Switch a loaded model to α-entmax attention (α read from the config at every call).

    ``layer_alphas`` gives every layer its own α (1 = softmax, e.g. ModernBERT's local
    layers under its family recipe); the layers are told apart by their attention modules'
    ``layer_idx``. Raises :class:`UnsupportedModelError` (naming the family) for models that
    would ignore it, or that cannot tell their layers apart when the α values differ.
    """
    check_attention_interface(model)
    register()
    alphas = tuple(float(a) for a in layer_alphas) if layer_alphas else None
    if alphas is not None and len(set(alphas)) == 1:  # one α: no per-layer lookup needed
        alpha, alphas = alphas[0], None
    if alphas is not None:
        indices = {getattr(m, "layer_idx", None) for m in model.modules()}
        missing = [i for i in range(len(alphas)) if i not in indices]
        if missing:
            family = getattr(model.config, "model_type", None) or type(model).__name__
            raise UnsupportedModelError(
                f"the {family!r} model family does not tell its attention layers apart "
                f"(no layer_idx for layers {missing}), so it cannot run a different α per "
                "layer; give one α for every layer (--alpha)"
            )
    for sub in (model, *model.modules()):  # encoder-decoder models keep sub-configs
        config = getattr(sub, "config", None)
        if config is not None:
            config.entmax_alpha = alpha
            config.entmax_alpha_layers = alphas
    model.set_attn_implementation(ENTMAX_ATTENTION)
