"""How good is a predicted attention graph? Recall (paper Eq. 4), sparsity (Eq. 5) and the
extra measures, per head of ONE text.

All inputs are bool masks ``(heads, n, m)`` of one text, without padding (a record is one
text), so padding never enters a numerator or a denominator.

- ``recall = |pred ∧ gold| / |gold|`` per head. By sparse-consistency of α-entmax, recall 1
  means the predicted graph gives exactly the original attention. A head with no gold edge
  has recall 1.0 by convention: there is nothing to miss.
- ``sparsity = 1 - |pred| / D`` per head, with ``D = n·m``, or in the causal (decoder) case
  the number of non-future pairs, ``n(n+1)/2`` when ``n == m``; future pairs are then not
  counted in ``|pred|`` either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from sparsefinder.attention.masks import n_allowed_pairs, shared_causal_mask

if TYPE_CHECKING:
    pass


_DTYPE = torch.float64  # averages over many texts; counts stay exact


def count_true(x: Tensor) -> Tensor:
    """Number of True entries over the last two axes: bool (..., n, m) → int64 (...).

    ``x.sum()`` on bool widens every element to int64 first, which dominates the cost of
    scoring a (heads, 512, 512) mask on CPU; numpy's ``count_nonzero`` on a bool array is a
    vectorised popcount (~50× faster). On CUDA the plain sum is already fast.
    """
    lead = x.shape[:-2]
    if x.device.type != "cpu" or x.numel() == 0:
        return x.sum((-2, -1), dtype=torch.int64)
    rows = x.detach().reshape(-1, x.shape[-2] * x.shape[-1]).numpy()
    counts = [np.count_nonzero(row) for row in rows]
    return torch.tensor(counts, dtype=torch.int64).reshape(lead)


def _words(x: Tensor) -> bool:
    """Whether bool ``x`` (..., m) can be read as int64 words of 8 keys: contiguous, a whole,
    non-zero number of words per row and a word-aligned start."""
    return (x.shape[-1] > 0 and x.shape[-1] % 8 == 0 and x.is_contiguous()
            and x.storage_offset() % 8 == 0)


def _check_mask(name: str, x: Tensor) -> None:
    if not isinstance(x, Tensor) or x.dtype != torch.bool:
        got = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(
            f"{name} must be a bool tensor (heads, n, m), got {got}; "
            f"for probabilities pass `{name} > 0`"
        )
    if x.dim() < 2:
        raise ValueError(f"{name} must have shape (heads, n, m), got {tuple(x.shape)}")


def recall(pred: Tensor, gold: Tensor) -> Tensor:
    """Per-head recall |pred ∧ gold| / |gold| → float64 (heads,); 1.0 where gold is empty."""
    _check_mask("pred", pred)
    _check_mask("gold", gold)
    if pred.shape != gold.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and gold {tuple(gold.shape)} must match")
    hit = count_true(pred & gold)
    total = count_true(gold)
    return torch.where(total > 0, hit.to(_DTYPE) / total.clamp(min=1), 1.0)


def _check_pair(pred: Tensor, gold: Tensor) -> None:
    _check_mask("pred", pred)
    _check_mask("gold", gold)
    if pred.shape != gold.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and gold {tuple(gold.shape)} must match")


def precision(pred: Tensor, gold: Tensor, *, causal: bool = False) -> Tensor:
    """Per-head precision |pred ∧ gold| / |pred| → float64 (heads,).

    The share of predicted pairs that are gold edges: how much attention computation a
    predictor wastes. An empty prediction has precision 1.0 by convention (it predicts no
    wrong pair; its recall says what it misses). With ``causal`` future predicted pairs are
    not counted, as in :func:`sparsity`.
    """
    _check_pair(pred, gold)
    if causal:
        pred = pred & shared_causal_mask(*pred.shape[-2:], pred.device)
    hit = count_true(pred & gold)
    total = count_true(pred)
    return torch.where(total > 0, hit.to(_DTYPE) / total.clamp(min=1), 1.0)


def exact_fraction(pred: Tensor, gold: Tensor) -> Tensor:
    """Per-head share of query rows whose whole gold support is predicted → float64 (heads,).

    By sparse-consistency of α-entmax, attention restricted to a predicted set that contains
    a row's gold support gives that row EXACTLY its original attention output; this is the
    share of such rows. 1.0 iff recall is 1.0. A row without gold edges counts as exact; a
    text with no query (n = 0) has 1.0.
    """
    _check_pair(pred, gold)
    n = gold.shape[-2]
    if n == 0:
        return torch.ones(gold.shape[:-2], dtype=_DTYPE, device=gold.device)
    if _words(gold) and _words(pred):
        # 8 keys per int64 word: one AND-NOT per word instead of a bool kernel per key
        g, p = gold.view(torch.int64), pred.view(torch.int64)
        missed_row = (g & ~p).ne_(0).any(-1)
    else:
        missed_row = (gold & ~pred).any(-1)
    return 1.0 - missed_row.sum(-1, dtype=torch.int64).to(_DTYPE) / n


def mass_recall(pred: Tensor, probs: Tensor) -> Tensor:
    """Per-head share of the gold attention probability mass on predicted pairs → (heads,).

    ``Σ_{(i,j) ∈ pred} P_ij / Σ_{i,j} P_ij`` with ``probs`` the dense α-entmax
    probabilities (heads, n, m) of the text (``record.layers[l].probs()``); since each row
    sums to 1 this is the mean over rows of the mass each row keeps. Unlike recall it
    weighs a missed edge by its probability: missing a 0.001 tail edge costs little. 1.0
    where there is no mass (no row).
    """
    _check_mask("pred", pred)
    if not isinstance(probs, Tensor) or not probs.is_floating_point():
        raise ValueError("probs must be a float tensor (heads, n, m) of attention probabilities; "
                         "records give them via record.layers[l].probs()")
    if pred.shape != probs.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and probs {tuple(probs.shape)} must match")
    lead, (n, m) = pred.shape[:-2], pred.shape[-2:]
    # One head at a time, so the product stays in cache; sums in the probabilities' dtype
    # (torch's cascaded float32 sum: relative error ~1e-6), widened only for the ratio.
    heads = math.prod(lead)
    flat_probs, flat_pred = probs.reshape(heads, n, m), pred.reshape(heads, n, m)
    kept = torch.zeros(heads, dtype=_DTYPE, device=pred.device)
    for h in range(heads):  # a loop over heads, not tokens
        kept[h] = (flat_probs[h] * flat_pred[h]).sum()
    kept = kept.reshape(lead)
    total = probs.sum((-2, -1)).to(_DTYPE)
    return torch.where(total > 0, kept / torch.where(total > 0, total, 1.0), 1.0)


def block_graph(mask: Tensor, block: int) -> Tensor:
    """Tile graph of a mask: bool (..., n, m) → (..., ceil(n/b), ceil(m/b)).

    Tile (I, J) covers queries ``I·b … I·b + b − 1`` and keys ``J·b … J·b + b − 1`` (the
    last tiles may be smaller) and is True iff the mask has at least one pair in it.
    """
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an integer >= 1, got {block!r}")
    n, m = mask.shape[-2:]
    nb, mb = -(-n // block), -(-m // block)
    if nb * block != n or mb * block != m:  # pad with False to whole tiles
        mask = torch.nn.functional.pad(mask, (0, mb * block - m, 0, nb * block - n))
    lead = mask.shape[:-2]
    if mask.numel() == 0:
        return torch.zeros(*lead, nb, mb, dtype=torch.bool, device=mask.device)
    if block % 8 == 0 and mask.is_contiguous() and mask.storage_offset() % 8 == 0:
        # 8 keys per int64 word (bool bytes are 0/1, so a word is >= 0 and > 0 iff one of its
        # keys is set): max over the block's rows first (a contiguous reduction), then over
        # the block's words
        words = mask.view(torch.int64).reshape(*lead, nb, block, mb * (block // 8))
        return words.amax(-2).reshape(*lead, nb, mb, block // 8).amax(-1) > 0
    cols = mask.reshape(*lead, nb * block, mb, block).any(-1)
    # the query axis: max over the block's rows of 0/1 bytes
    rows = cols.view(torch.uint8).reshape(*lead, nb, block, mb).amax(-2)
    return rows.view(torch.bool)


def block_recall(pred: Tensor, gold: Tensor, block: int, *, causal: bool = False) -> Tensor:
    """Per-head tile recall at tile size ``block`` (e.g. 16, 64) → float64 (heads,).

    ``|T(pred) ∧ T(gold)| / |T(gold)|`` with ``T`` = :func:`block_graph`: the share of the
    gold (query-block, key-block) tiles in which the prediction has at least one pair. This
    is what a block-sparse kernel that computes every tile the prediction touches needs:
    every gold edge lies in a computed tile iff block recall is 1. With ``causal`` future
    predicted pairs are dropped first (gold has none), so tiles wholly in the future are
    neither gold nor predicted. 1.0 where gold is empty.
    """
    _check_pair(pred, gold)
    if causal:
        pred = pred & shared_causal_mask(*pred.shape[-2:], pred.device)
    tp, tg = block_graph(pred, block), block_graph(gold, block)
    hit = (tp & tg).sum((-2, -1), dtype=torch.int64)
    total = tg.sum((-2, -1), dtype=torch.int64)
    return torch.where(total > 0, hit.to(_DTYPE) / total.clamp(min=1), 1.0)


def sparsity(pred: Tensor, *, causal: bool = False) -> Tensor:
    """Per-head sparsity 1 - |pred| / D → float64 (heads,); see module docstring for D.

    With ``causal`` only non-future predicted pairs are counted. An empty graph (D = 0) has
    sparsity 1.0.
    """
    _check_mask("pred", pred)
    n, m = pred.shape[-2:]
    if causal:
        pred = pred & shared_causal_mask(n, m, pred.device)
    denom = n_allowed_pairs(n, m, causal=causal)
    if denom == 0:
        return torch.ones(pred.shape[:-2], dtype=_DTYPE, device=pred.device)
    return 1.0 - count_true(pred).to(_DTYPE) / denom


def gold_sparsity(gold: Tensor, *, causal: bool = False) -> Tensor:
    """Sparsity of the gold (α-entmax) graph: the level a predictor would ideally reach."""
    return sparsity(gold, causal=causal)


#: Metrics a :class:`Scorer` adds to recall and sparsity, as named in the sweep's
#: columns: ``block_recall16``/``block_recall64`` are :func:`block_recall` at 16 and 64.
EXTRA_METRICS: tuple[str, ...] = (
    "precision", "exact_fraction", "mass_recall", "block_recall16", "block_recall64",
)


BLOCK_SIZES: tuple[int, ...] = (16, 64)


@dataclass
class GraphScores:
    """Scores of one text: ``recall``, ``sparsity`` (and optionally ``gold_sparsity`` and the
    :data:`EXTRA_METRICS`) as float64 tensors of shape (layers, heads)."""

    recall: Tensor
    sparsity: Tensor
    gold_sparsity: Tensor | None = None
    precision: Tensor | None = None
    exact_fraction: Tensor | None = None
    mass_recall: Tensor | None = None
    block_recall16: Tensor | None = None
    block_recall64: Tensor | None = None
    #: bool (layers,): the layers the overall macro average counts; False for softmax layers
    #: (α = 1: a dense gold graph, nothing sparse to predict). None: every layer.
    counted: Tensor | None = None

    def to(self, device: torch.device | str) -> GraphScores:
        """The same scores on ``device`` (a GPU-resident scorer's (layers, heads) numbers come
        to the host this way: a few KB, never a mask)."""
        return GraphScores(**{name: None if value is None else value.to(device)
                              for name, value in vars(self).items()})

    def metrics(self) -> dict[str, Tensor]:
        """Every metric present, by name (recall, sparsity, then the extras)."""
        names = ("recall", "sparsity", *EXTRA_METRICS)
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


def score_layers(preds: list[Tensor], golds: list[Tensor], causal: bool = False) -> GraphScores:
    """Scores one text, given per-layer predicted and gold masks (heads, n, m)."""
    if len(preds) != len(golds):
        raise ValueError(f"got {len(preds)} predicted layers but {len(golds)} gold layers")
    if not preds:
        raise ValueError("score_layers needs at least one layer")
    return GraphScores(
        recall=torch.stack([recall(p, g) for p, g in zip(preds, golds, strict=True)]),
        sparsity=torch.stack([sparsity(p, causal=causal) for p in preds]),
        gold_sparsity=torch.stack([gold_sparsity(g, causal=causal) for g in golds]),
    )
