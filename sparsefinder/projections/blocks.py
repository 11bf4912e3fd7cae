"""Block-level projections (paper §6): Eq. 7 learned on chunked tokens, not on tokens.

The block Sparsefinder picks (query block, key block) tiles. Pooling the TOKEN projections
(:class:`~sparsefinder.predictors.block.BlockSparsefinder`) asks a map trained to place a
query near its attended keys to also place a block's mean near the means of the blocks it
attends to — it never saw a mean. Here the map is trained on the means themselves:

- every ``block`` consecutive queries (keys) of a text are pooled to their mean
  (:func:`~sparsefinder.predictors.block.pool_blocks`, the last block may be partial);
- the block pair ``(I, J)`` is POSITIVE iff some gold edge of the α-entmax graph lies in the
  tile ``I × J`` and NEGATIVE iff none does — exactly the tiles of
  :func:`sparsefinder.metrics.measures.block_graph`, which block recall scores against;
- the pooled blocks with their tile graph form an ordinary record (one "token" per block),
  so :func:`sparsefinder.projections.hinge.train_projections` learns the per-head map ``d → r``
  with the Eq. 7 hinge ``[ω + ‖q̄' − k̄'_P‖² − ‖q̄' − k̄'_N‖²]₊`` unchanged (same negative
  sampling within the query block's row, same init, same batched Adam steps).

Pooling is linear, so projecting a pooled block equals pooling the projected tokens: the
learned map is applied to pooled raw q/k at prediction time
(:class:`~sparsefinder.predictors.block.LearnedBlockSparsefinder`).

Query blocks whose every key block is gold have no negative and are dropped from training
(as token rows without a non-edge are). Short texts make block graphs dense (on the default
corpus' train split 84% of the 32-token tiles hold a gold edge), so a head may have no
negative block pair at all in a small training set: its map is kept at zero
(``train_projections(dense_heads="zero")``, listed in ``metadata["dense_heads"]``) and the
predictor keeps every block for it, which is what its training data showed. Causal records
keep their tile-level causality: query block ``I`` sees key blocks ``0 … I`` (n = m).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sparsefinder.attention.masks import apply_causal
from sparsefinder.bundle import bundle
from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.metrics.measures import block_graph
from sparsefinder.models.loading import DEFAULT_MODEL, DEFAULT_MODEL_ID
from sparsefinder.predictors.block import pool_blocks
from sparsefinder.projections.heads import HeadProjections, ProjectionsError
from sparsefinder.projections.hinge import train_projections

#: Tokens per block of the bundled block projections (the block curves' main size).
DEFAULT_BLOCK = 32
#: Block sizes with bundled projections and a ``block…-learned`` curve (the block curves').
LEARNED_BLOCKS = (16, 32)
#: Chosen on the TRAIN split only (4/5 of its texts to fit, every 5th held out; criterion:
#: held-out block recall averaged over 1 and 2 key blocks per query block) among
#: r ∈ {4, 8} × epochs ∈ {1, 10, 30, 100}, per block size: 32 tokens → r = 8, 1 epoch
#: (0.658 vs 0.645-0.653; the discriminative init does most of the work on so few block
#: pairs), 16 tokens → r = 8, 100 epochs (0.458 vs 0.449-0.455). Differences are ~1 point.
DEFAULT_RANK = 8
EPOCHS_BY_BLOCK = {16: 100, 32: 1}
GRANULARITY = "block"


def block_pair_labels(gold: Tensor, block: int, *, causal: bool = False) -> Tensor:
    """Positive block pairs: bool (heads, n, m) gold → (heads, ceil(n/b), ceil(m/b)).

    ``(I, J)`` is True iff a gold edge lies in the tile (:func:`metrics.block_graph`, the
    tiles block recall counts); False means every pair of the tile is a non-edge.
    """
    return block_graph(apply_causal(gold, causal).contiguous(), block)


def _tile_mass(probs: Tensor, block: int) -> Tensor:
    """The gold probability mass of every tile: (heads, n, m) → (heads, ceil(n/b), ceil(m/b));
    a pooled graph's edge probabilities (the pair sampler reads them for every positive)."""
    heads, n, m = probs.shape
    nb, mb = -(-n // block), -(-m // block)
    padded = torch.nn.functional.pad(probs.float(), (0, mb * block - m, 0, nb * block - n))
    return padded.view(heads, nb, block, mb, block).sum((2, 4))


def block_record(record: AttentionRecord, block: int) -> AttentionRecord:
    """The record at block granularity: per layer, pooled q/k (heads, ceil(n/b), d) and the
    block-pair labels as its gold graph; what :func:`train_projections` learns from."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an integer >= 1, got {block!r}")
    layers = []
    for layer in record.layers:
        gold = block_pair_labels(layer.gold, block, causal=record.causal)
        layers.append(LayerGraph(
            queries=pool_blocks(layer.queries, block), keys=pool_blocks(layer.keys, block),
            gold=gold, prob_values=_tile_mass(layer.probs(), block)[gold],
            scaling=layer.scaling, alpha=layer.alpha))
    n_blocks = -(-record.n_tokens // block)
    return AttentionRecord(text=record.text, tokens=[""] * n_blocks,
                           offsets=[(0, 0)] * n_blocks, special=[False] * n_blocks,
                           causal=record.causal, layers=layers)


def train_block_projections(records: Sequence[AttentionRecord], *, block: int = DEFAULT_BLOCK,
                            rank: int = DEFAULT_RANK, epochs: int | None = None,
                            **kwargs: Any) -> HeadProjections:
    """Eq. 7 projections of pooled query/key blocks of every head (see the module docstring).

    ``rank`` and ``epochs`` (default: :data:`EPOCHS_BY_BLOCK`, else 1) were chosen on the
    TRAIN split. ``kwargs``
    go to :func:`~sparsefinder.projections.hinge.train_projections` (rank, margin, lr,
    epochs, batch_size, seed…); the result's metadata records ``granularity="block"`` and
    ``block``, which :class:`~sparsefinder.predictors.block.LearnedBlockSparsefinder` checks.
    """
    blocks = [block_record(r, block) for r in records]
    epochs = epochs if epochs is not None else EPOCHS_BY_BLOCK.get(block, 1)
    projections = train_projections(blocks, rank=rank, epochs=epochs, dense_heads="zero",
                                    **kwargs)
    tiles = [int(g.gold.sum()) for r in blocks for g in r.layers]
    total = [math.prod(g.gold_shape) for r in blocks for g in r.layers]
    projections.metadata.update({
        "granularity": GRANULARITY, "block": block,
        "positive_tile_share": sum(tiles) / max(sum(total), 1),
    })
    return projections


def check_block_projections(projections: HeadProjections, block: int | None = None) -> None:
    """Refuse token-level projections (or another block size) where block ones are needed."""
    if projections.metadata.get("granularity") != GRANULARITY:
        raise ProjectionsError(
            "these projections were trained on token pairs, not on pooled blocks; train block "
            "projections with `sparsefinder fit-block-projections --model MODEL --out FILE`")
    trained = int(projections.metadata.get("block", 0))
    if block is not None and trained != block:
        raise ProjectionsError(
            f"these block projections were trained on blocks of {trained} tokens, not {block}; "
            f"use block={trained} or retrain with `sparsefinder fit-block-projections "
            f"--block {block}`")


def load_block_projections(path: str | Path, expected_model_id: str | None = None
                           ) -> HeadProjections:
    """Read a block projections file (a :class:`HeadProjections` file with block metadata)."""
    projections = HeadProjections.load(path, expected_model_id=expected_model_id)
    check_block_projections(projections)
    return projections


def train_block_projections_by_size(records: Sequence[AttentionRecord],
                                    blocks: Sequence[int] = LEARNED_BLOCKS, **kwargs: Any
                                    ) -> dict[int, HeadProjections]:
    """:func:`train_block_projections` at every block size: what the ``block-learned`` method
    fits on training graphs (each size its own map; a map is tied to its block size)."""
    return {block: train_block_projections(records, block=block, **kwargs) for block in blocks}


def bundled_block_projections_path(block: int) -> Path | None:
    """The default bundle's block projections file for ``block`` tokens (None: none)."""
    found = [f.path for f in bundle().files("block projections") if f.details.get("block") == block]
    return found[0] if found else None


def bundled_block_projections(model_id: str = DEFAULT_MODEL_ID, block: int = DEFAULT_BLOCK
                              ) -> HeadProjections | None:
    """The bundled block projections of ``block`` tokens when they exist and are for
    ``model_id``; else None."""
    if model_id == DEFAULT_MODEL:
        model_id = DEFAULT_MODEL_ID
    path = bundled_block_projections_path(block)
    if model_id != DEFAULT_MODEL_ID or path is None or not path.is_file():
        return None
    projections = load_block_projections(path, expected_model_id=model_id)
    check_block_projections(projections, block)
    return projections


def bundled_block_projections_by_size(model_id: str = DEFAULT_MODEL_ID
                                      ) -> dict[int, HeadProjections]:
    """Every bundled block size for ``model_id`` (empty for other models): the ``fitted``
    value of the ``block-learned`` method, without training graphs at hand."""
    found = {block: bundled_block_projections(model_id, block) for block in LEARNED_BLOCKS}
    return {block: p for block, p in found.items() if p is not None}
