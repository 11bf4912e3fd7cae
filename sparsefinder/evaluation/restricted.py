"""Run a model with every layer's α-entmax restricted to a predicted attention graph.

The paper's model-level simulation: a predictor proposes, per layer and head, which
query–key pairs to compute; entmax runs ONLY over those keys (the others get probability
exactly 0). Layer ℓ's graph is predicted inside the forward pass from its own q/k, so a
missed edge changes every later layer's inputs, as in a sparse implementation. A local
layer never attends outside its window: the model's mask cuts the graph, and predictors
spend per-row budgets inside the window.

Sparse-consistency (paper Prop. 1): a graph containing the gold graph (recall 1) gives the
same support and probabilities as full entmax, so the output is unchanged up to rounding.
Three layers of API, each a thin adapter over the one below:

* :func:`restrict` ``(model, graph_fn)``: ``graph_fn(LayerInputs) -> bool`` mask
  ``(batch, heads, n, m)`` (or ``(heads, n, m)``, or a sequence of per-head ``(n, m)``
  masks), padded batches as the model sees them;
* :func:`per_text` ``(fn)``: lifts ``fn(layer, q, k, causal) -> (heads, n, m)`` on ONE
  unpadded text (as every predictor and :class:`~sparsefinder.data.records.LayerGraph`) to
  padded batches;
* :func:`predictor_graph` ``(build, inputs, projections)``: a predictor per layer reading
  projected q/k (``HeadProjections.project``), the original q/k, or only the shapes;
  :func:`spec_graph` does it for a :class:`~sparsefinder.methods.spec.PredictorSpec`.

Scoped to the ``with`` block and the given model (a context variable; no class is patched).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from sparsefinder.attention.interface import ENTMAX_ATTENTION, restrict_keys
from sparsefinder.attention.masks import RestrictionWarning
from sparsefinder.methods.spec import PredictorSpec, predict_layer
from sparsefinder.metrics.measures import count_true
from sparsefinder.predictors.base import Predictor
from sparsefinder.projections.heads import HeadProjections, ProjectionsError

INPUTS = ("projected", "original", "shape")


@dataclass(frozen=True)
class LayerInputs:
    """What one attention layer hands to a graph function (batched, padded)."""

    layer: int
    query: Tensor  # (batch, heads, n, d), as it enters QKᵀ
    key: Tensor  # (batch, heads, m, d)
    causal: bool
    valid: Tensor  # bool (batch, m): True at real (non-padding) key positions
    scaling: float
    #: A local layer's window W (``masks`` says how it is read), None for a global layer.
    sliding_window: int | None = None

    @property
    def batch(self) -> int:
        return int(self.query.shape[0])

    @property
    def heads(self) -> int:
        return int(self.query.shape[1])


@dataclass
class RestrictionStats:
    """What a restricted run actually computed, over real (non-padding) queries.

    ``rows``: (head, query) rows with an allowed key; ``repaired_rows``: those the graph left
    empty (they kept their diagonal). :meth:`sparsity`: of the graphs entmax ran over
    (predicted ∧ allowed, plus repairs), per (text, head) ``1 - |kept| / |allowed|`` (the
    model's mask: causal, a local layer's window), macro over texts, heads, then layers.
    """

    rows: int = 0
    repaired_rows: int = 0
    per_layer: dict[int, list[Tensor]] = field(default_factory=dict)  # (texts, heads) each

    @property
    def repaired_fraction(self) -> float:
        return self.repaired_rows / self.rows if self.rows else 0.0

    def observe(self, layer: int, kept: Tensor, allowed: Tensor, real_queries: Tensor) -> None:
        """Record one layer call: ``kept`` (batch, heads, n, m), ``allowed`` (batch, 1, n, m)."""
        rows = real_queries[:, None, :, None]
        total = count_true(allowed & rows).to(torch.float64)  # (batch, 1)
        fraction = count_true(kept & rows).to(torch.float64) / total.clamp(min=1)
        self.per_layer.setdefault(layer, []).append(torch.where(total > 0, 1 - fraction, 1.0))

    def sparsity(self) -> tuple[float, list[float]]:
        """(overall, per layer) macro sparsity; NaN when nothing was recorded."""
        if not self.per_layer:
            return math.nan, []
        layers = [torch.cat(self.per_layer[i]).mean(0).mean() for i in sorted(self.per_layer)]
        return float(torch.stack(layers).mean()), [float(x) for x in layers]


GraphFn = Callable[[LayerInputs], "Tensor | Sequence[Tensor]"]
#: ``fn(layer, q (heads, n, d), k (heads, m, d), causal) -> bool (heads, n, m)``, one text.
TextGraphFn = Callable[[int, Tensor, Tensor, bool], Tensor]


# ==================================================================== the context manager
def _check_entmax(model: nn.Module) -> None:
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl != ENTMAX_ATTENTION:
        raise ValueError(
            f"restrict() needs a model running α-entmax attention (attention implementation "
            f"{impl!r}); load it with sparsefinder.models.loading.load_model(...) or call "
            "sparsefinder.attention.interface.use_entmax(model, alpha) first"
        )


def _as_graph(raw: object, layer: int, batch: int, heads: int, n: int, m: int) -> Tensor:
    """A graph function's answer as bool (batch or 1, heads, n, m), or an error naming
    the layer and head whose mask has the wrong shape or type."""
    if isinstance(raw, Sequence) and not isinstance(raw, Tensor):
        if len(raw) != heads:
            raise ValueError(
                f"layer {layer}: the graph function returned {len(raw)} per-head masks, but "
                f"the layer has {heads} heads (0..{heads - 1})"
            )
        for h, mask in enumerate(raw):
            if not isinstance(mask, Tensor) or tuple(mask.shape[-2:]) != (n, m):
                got = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
                raise ValueError(
                    f"layer {layer}, head {h}: graph has shape {got}, but this head's attention "
                    f"is (n={n} queries, m={m} keys); return one bool (n, m) mask per head"
                )
        raw = torch.stack(list(raw), dim=-3)
    if not isinstance(raw, Tensor):
        raise ValueError(
            f"layer {layer}: the graph function must return a bool tensor (batch, heads, n, m) "
            f"or (heads, n, m), got {type(raw).__name__}"
        )
    if raw.dtype != torch.bool:
        raise ValueError(
            f"layer {layer}: graph must be a bool tensor (True = keep the pair), got {raw.dtype};"
            " for probabilities or scores pass `graph > 0`"
        )
    shape = tuple(raw.shape)
    if raw.dim() == 3:
        raw = raw.unsqueeze(0)
    if raw.dim() != 4 or raw.shape[0] not in (1, batch):
        raise ValueError(
            f"layer {layer}: graph has shape {shape}, expected (heads={heads}, n={n}, m={m}) "
            f"or (batch={batch}, heads={heads}, n={n}, m={m})"
        )
    if raw.shape[1] != heads:
        raise ValueError(
            f"layer {layer}: graph has {raw.shape[1]} heads (shape {shape}), but the layer has "
            f"{heads} heads (0..{heads - 1}); predict one mask per head"
        )
    if tuple(raw.shape[2:]) != (n, m):
        raise ValueError(
            f"layer {layer}, head 0 (and every other head): graph is {tuple(raw.shape[2:])} "
            f"per head, but the attention is (n={n} queries, m={m} keys); shape {shape}"
        )
    return raw


def _any(x: Tensor, dim: int) -> Tensor:
    """``x.any(dim)`` for a bool tensor, as a max over its bytes: ~100× faster on a CPU for
    (heads, n, n) masks (``any`` over the last axis costs ~12 ms at n=512, ``amax`` 0.1 ms)."""
    return x.view(torch.uint8).amax(dim) > 0


def _diagonal(n: int, m: int, device: torch.device) -> Tensor:
    """Bool (n, m): query i with its own key ``i + (m - n)`` (keys may include a prefix)."""
    return torch.ones(n, m, dtype=torch.bool, device=device).tril(m - n).triu(m - n)


def _repair(
    combined: Tensor, allowed: Tensor, real_queries: Tensor, layer: int, warn: bool,
    stats: RestrictionStats | None,
) -> Tensor:
    """Give every query row that has an allowed key at least one key (its diagonal).

    An all-masked row would make entmax's threshold undefined (all scores -inf). Rows with no
    allowed key at all (none in practice) are left to the model's own mask. Only rows of real
    (non-padding) queries, ``real_queries`` (batch, n), are counted and warned about.
    """
    empty = ~_any(combined, -1)  # (batch, heads, n)
    has_keys = _any(allowed, -1).expand_as(empty)
    counted = has_keys & real_queries[:, None, :]
    if stats is not None:
        stats.rows += int(counted.sum())
    empty &= has_keys
    if not bool(empty.any()):
        return combined
    n, m = combined.shape[-2:]
    diag = _diagonal(n, m, combined.device) & allowed
    fix = empty.unsqueeze(-1) & diag
    # Where the diagonal itself is masked (e.g. a padding query), fall back to the allowed keys.
    still = empty & ~_any(fix, -1)
    fix = fix | (still.unsqueeze(-1) & allowed)
    empty &= counted
    if stats is not None:
        stats.repaired_rows += int(empty.sum())
    if warn and bool(empty.any()):
        heads = sorted({int(h) for h in empty.nonzero()[:, 1].tolist()})
        warnings.warn(
            f"layer {layer}: {int(empty.sum())} query rows (heads {heads}) had no key in the "
            "predicted graph; kept their diagonal so entmax stays defined",
            RestrictionWarning,
            stacklevel=2,
        )
    return combined | fix


@contextmanager
def restrict(
    model: nn.Module,
    graph_fn: GraphFn,
    *,
    warn_empty: bool = True,
    stats: RestrictionStats | None = None,
) -> Iterator[None]:
    """Within this block, ``model``'s entmax attention runs only over ``graph_fn``'s graph.

    ``graph_fn`` is called once per layer and forward pass with that layer's
    :class:`LayerInputs`; layers are numbered 0, 1, … in the order the model first calls them
    (its layer order). Keys outside the graph — and padding / future keys, as always — get
    probability exactly 0. A query row left without any key keeps its diagonal (with a
    :class:`RestrictionWarning` unless ``warn_empty=False``; ``stats`` counts them). A graph
    of the wrong shape or type is a ``ValueError`` naming the layer and head.
    """
    _check_entmax(model)
    members = {id(module) for module in model.modules()}
    layers: dict[int, int] = {}

    def restriction(
        module: nn.Module, query: Tensor, key: Tensor, allowed: Tensor, causal: bool,
        scaling: float,
    ) -> Tensor:
        if id(module) not in members:
            return allowed
        layer = layers.setdefault(id(module), len(layers))
        batch, heads, n = query.shape[:3]
        m = key.shape[-2]
        allowed = allowed.expand(batch, -1, n, m)
        valid = _any(allowed, -2)[:, 0]  # a real key is allowed for some query
        window = getattr(module, "sliding_window", None)  # a local layer's W (transformers)
        inputs = LayerInputs(layer, query, key, causal, valid, scaling,
                             window if type(window) is int and window > 0 else None)
        graph = _as_graph(graph_fn(inputs), layer, batch, heads, n, m).to(allowed.device)
        real_queries = valid[:, m - n :]  # queries are the last n positions
        kept = _repair(allowed & graph, allowed, real_queries, layer, warn_empty, stats)
        if stats is not None:
            stats.observe(layer, kept, allowed[:, :1], real_queries)
        return kept

    with restrict_keys(restriction):
        yield


# ==================================================================== adapters
def per_text(fn: TextGraphFn) -> GraphFn:
    """Lift a one-text graph function to padded batches.

    Each batch row is cut to its real tokens (any padding side), ``fn`` predicts
    ``(heads, n_real, m_real)`` there, and the answer is written back into a
    ``(batch, heads, n, m)`` mask that is True elsewhere (padding is masked by the model
    anyway, and a padded query row then keeps the model's own keys). A local layer's
    answer is cut to its window by the model's own mask.
    """
    return _per_text(lambda layer, q, k, causal, window: fn(layer, q, k, causal))


def _per_text(fn: Callable[[int, Tensor, Tensor, bool, int | None], Tensor]) -> GraphFn:
    """:func:`per_text` for a function that also takes the layer's sliding window."""

    def graph(inputs: LayerInputs) -> Tensor:
        q, k, valid = inputs.query, inputs.key, inputs.valid
        batch, heads, n = q.shape[:3]
        m = k.shape[-2]
        out = torch.ones(batch, heads, n, m, dtype=torch.bool, device=q.device)
        for b in range(batch):
            kv = valid[b]
            qi, ki = kv[m - n :].nonzero()[:, 0], kv.nonzero()[:, 0]  # queries: last n keys
            full = len(ki) == m
            pred = fn(inputs.layer, q[b] if full else q[b][:, qi], k[b] if full else k[b][:, ki],
                      inputs.causal, inputs.sliding_window)
            pred = _check_text_graph(pred, inputs.layer, (heads, len(qi), len(ki)))
            if full:
                out[b] = pred
            else:
                out[b][:, qi[:, None], ki[None, :]] = pred
        return out

    return graph


def _check_text_graph(pred: object, layer: int, shape: tuple[int, int, int]) -> Tensor:
    if not isinstance(pred, Tensor) or pred.dtype != torch.bool:
        got = pred.dtype if isinstance(pred, Tensor) else type(pred).__name__
        raise ValueError(f"layer {layer}: the predictor must return a bool tensor, got {got}")
    if tuple(pred.shape) != shape:
        heads, n, m = shape
        if pred.dim() == 3 and pred.shape[0] != heads:
            raise ValueError(
                f"layer {layer}: the predictor returned {pred.shape[0]} heads "
                f"(shape {tuple(pred.shape)}), but the layer has {heads} heads (0..{heads - 1})"
            )
        raise ValueError(
            f"layer {layer}, head 0 (and every other head): the predictor returned shape "
            f"{tuple(pred.shape)}, expected (heads={heads}, n={n}, m={m}) for this text"
        )
    return pred


def projections_required(model_name: str, what: str) -> ValueError:
    """The error for a predictor that reads projections on a model that has none."""
    return ValueError(
        f"{what} reads learned per-head projections of q/k, and none were given for model "
        f"{model_name!r}; train them with `sparsefinder train --model {model_name} --out DIR` "
        "and pass DIR/projections.pt"
    )


def predictor_graph(
    build: Callable[[int], Predictor | None],
    inputs: str = "projected",
    projections: HeadProjections | None = None,
    *,
    model_name: str = "MODEL",
    what: str = "this predictor",
) -> GraphFn:
    """A graph function from one predictor per layer (``build(layer)``, built once each).

    ``inputs`` says what ``predict`` reads: ``"projected"`` — the layer's q/k through
    ``projections.project(layer, ·)``, (heads, n, r); ``"original"`` — the model's q/k,
    (heads, n, d); ``"shape"`` — only the sizes (it gets the original q/k). A projected
    predictor without projections is an error naming the command that trains them. A layer
    whose ``build`` gives ``None`` predicts the empty graph (every row then keeps its diagonal).
    A local layer predicts as :func:`~sparsefinder.methods.spec.predict_layer` does: a
    per-row budget (top-k, a keep fraction) is spent inside the layer's window, never on
    keys the model cannot attend to.
    """
    if inputs not in INPUTS:
        raise ValueError(f"inputs must be one of {INPUTS}, got {inputs!r}")
    if inputs == "projected" and projections is None:
        raise projections_required(model_name, what)
    built: dict[int, Predictor | None] = {}

    def fn(layer: int, q: Tensor, k: Tensor, causal: bool, window: int | None) -> Tensor:
        if layer not in built:
            built[layer] = build(layer)
        predictor = built[layer]
        if predictor is None:
            return torch.zeros(q.shape[0], q.shape[1], k.shape[1], dtype=torch.bool,
                               device=q.device)
        if inputs == "projected":
            assert projections is not None
            if layer >= projections.num_layers or q.shape[0] != projections.num_heads or (
                q.shape[-1] != projections.head_dim
            ):
                raise ProjectionsError(
                    f"projections for {projections.model_id} expect (layers, heads, head_dim) = "
                    f"{(projections.num_layers, projections.num_heads, projections.head_dim)}, "
                    f"but layer {layer} of model {model_name!r} has q of shape {tuple(q.shape)};"
                    f" train projections for it with `sparsefinder train --model {model_name} "
                    "--out DIR`"
                )
            q, k = projections.project_queries(layer, q), projections.project_keys(layer, k)
        return predict_layer(predictor, q, k, causal=causal, sliding_window=window)

    return _per_text(fn)


def spec_graph(
    spec: PredictorSpec,
    projections: HeadProjections | None,
    num_layers: int,
    *,
    fitted: Any = None,
    model_name: str = "MODEL",
    predictors: Sequence[Predictor | None] | None = None,
) -> GraphFn:
    """The graph function of a :class:`~sparsefinder.methods.spec.PredictorSpec` (the same setting
    the app, the sweeps and the CLI name): its per-layer predictors, built up front (so a
    missing centroid set fails before any forward), on the inputs its method declares.
    ``fitted`` is ``spec.fit(train_records)`` for methods learned from training graphs;
    ``predictors``, when given, are the spec's per-layer predictors already built (a sweep
    plan's)."""
    if spec.needs_projections and projections is None:
        raise projections_required(model_name, f"method {spec.method_id!r}")
    built = (list(predictors) if predictors is not None
             else spec.build_layers(projections, num_layers, fitted))
    return predictor_graph(built.__getitem__, spec.inputs, projections,
                           model_name=model_name, what=f"method {spec.method_id!r}")
