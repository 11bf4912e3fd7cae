"""The one scoring path: a :class:`Scorer` counts a record's gold side once and scores any
predicted masks against it; :func:`macro_average` averages over texts.

A decoder's sliding-window layer (``LayerGraph.sliding_window``) counts only its window's
pairs in the denominator and in ``|pred|``.

Averaging (``macro_average``) is macro, in this order: for every (layer, head) the mean over
texts (each text weighs the same, whatever its length); then, per layer, the mean over heads;
then the overall value, the mean over layers. With equally many heads in every layer the
overall value equals the plain mean of all (layer, head) values.

Softmax layers (``LayerGraph.is_softmax``: α = 1, e.g. ModernBERT's local layers) have dense
gold graphs: they keep their per-layer values but are left out of the overall value
(``n_softmax_layers`` says how many), so an average means "over the entmax layers".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from sparsefinder.attention.masks import allowed_key_range, layer_allowed, n_allowed_pairs
from sparsefinder.metrics import scan
from sparsefinder.metrics.measures import (
    _DTYPE,
    BLOCK_SIZES,
    EXTRA_METRICS,
    GraphScores,
    _check_mask,
    block_graph,
    count_true,
)

if TYPE_CHECKING:
    from sparsefinder.data.records import AttentionRecord


@dataclass
class _GoldIndex:
    """One layer's gold edges as a flat list (row-major, the order of ``prob_values``), cut
    into rows and heads (CSR offsets), with their probabilities and the gold tiles."""

    flat: Tensor  # int64 (E,): positions in the flattened (heads, n, m) mask
    row_ptr: Tensor  # int64 (heads·n + 1,): edges of row r are flat[row_ptr[r]:row_ptr[r+1]]
    head_ptr: Tensor  # int64 (heads + 1,)
    probs: Tensor  # float64 (E,)
    mass: Tensor  # float64 (heads,): gold probability mass (all of it, future pairs too)
    tiles: dict[int, Tensor]  # block → bool (heads, nb, mb) gold tiles
    tile_counts: dict[int, Tensor]  # block → int64 (heads,)


def _segments(values: Tensor, ptr: Tensor) -> Tensor:
    """Sums of ``values`` over the segments ``ptr[i]:ptr[i+1]`` (one cumulative sum)."""
    running = torch.zeros(values.numel() + 1, dtype=values.dtype, device=values.device)
    torch.cumsum(values, 0, out=running[1:])
    return running[ptr[1:]] - running[ptr[:-1]]


def _ratio(hit: Tensor, total: Tensor) -> Tensor:
    """hit / total as float64, 1.0 where total is 0 (nothing to find)."""
    return torch.where(total > 0, hit.to(_DTYPE) / torch.where(total > 0, total, 1), 1.0)


def _coarser_tiles(tiles: Tensor, factor: int) -> Tensor:
    """Tiles of ``factor``× the block from tiles of one block: a tile of the larger grid is
    set iff one of the ``factor × factor`` small tiles it covers is (the grids align)."""
    nb, mb = tiles.shape[-2:]
    pad_n, pad_m = -nb % factor, -mb % factor
    if pad_n or pad_m:
        tiles = torch.nn.functional.pad(tiles, (0, pad_m, 0, pad_n))
    lead = tiles.shape[:-2]
    grid = tiles.view(torch.uint8).reshape(*lead, (nb + pad_n) // factor, factor,
                                           (mb + pad_m) // factor, factor)
    return grid.amax((-3, -1)).view(torch.bool)


def shared_head(pred: Tensor) -> Tensor | None:
    """The one (n, m) mask of a (heads, n, m) prediction broadcast over its heads (stride
    0, as ``predict_layer(..., shared=True)`` returns a window/global pattern), else None."""
    if pred.dim() == 3 and pred.shape[0] > 1 and pred.stride(0) == 0:
        return pred[0]
    return None


def _tiles(mask: Tensor) -> dict[int, Tensor]:
    """:func:`block_graph` at every size of :data:`BLOCK_SIZES`; the 64-tiles come from the
    16-tiles (a 64 × 64 tile is 4 × 4 tiles of 16), so the mask is read once."""
    return _tiles_from(block_graph(mask, BLOCK_SIZES[0]))


def _tiles_from(small: Tensor) -> dict[int, Tensor]:
    """Tiles at every size of :data:`BLOCK_SIZES` from those of the smallest."""
    return {BLOCK_SIZES[0]: small,
            **{b: _coarser_tiles(small, b // BLOCK_SIZES[0]) for b in BLOCK_SIZES[1:]}}


def _gold_shape(graph) -> tuple[int, ...]:
    """(heads, n, m) of a layer's gold mask, unpacked only for graph objects that keep a
    dense ``gold`` and nothing else."""
    shape = getattr(graph, "gold_shape", None)
    return tuple(int(x) for x in (shape if shape is not None else graph.gold.shape))


def _read_edges(readable: Tensor, cells: Tensor, index: _GoldIndex, heads: int,
                n: int) -> tuple[Tensor, Tensor, Tensor]:
    """(missed edges, rows with a miss, missed mass) per head of a prediction read at the
    gold edges (``cells``: their positions in ``readable``): one compiled pass on a CPU
    (:mod:`.scan`), else a gather and two cumulative sums."""
    if scan.applies(readable):
        return scan.read_edges(readable, cells, index.row_ptr, index.probs, heads)
    missed = ~readable.reshape(-1).index_select(0, cells)  # gold edges not kept
    missed_rows = _segments(missed.to(torch.int32), index.row_ptr)  # (heads·n,)
    if not n:
        zero = torch.zeros(heads, dtype=torch.int64, device=readable.device)
        return zero, zero, torch.zeros(heads, dtype=_DTYPE, device=readable.device)
    missed_heads = missed_rows.view(heads, n).sum(-1, dtype=torch.int64)
    inexact = (missed_rows > 0).view(heads, n).sum(-1, dtype=torch.int64)
    lost = _segments(torch.where(missed, index.probs, 0.0), index.head_ptr)
    return missed_heads, inexact, lost


class _Golds(Sequence[Tensor]):
    """A record's dense gold masks, one layer unpacked per access (records store them
    bit-packed): a scorer never holds every layer's (heads, n, m) bools at once (2 GiB on a
    1 B decoder at 2048 tokens), only the per-layer edge lists it builds from them."""

    def __init__(self, record: AttentionRecord) -> None:
        self._layers = record.layers

    def __len__(self) -> int:
        return len(self._layers)

    def __getitem__(self, layer):  # type: ignore[override]
        if isinstance(layer, slice):
            return [graph.gold for graph in self._layers[layer]]
        return self._layers[layer].gold


class Scorer:
    """Every metric of predictions for ONE record: the one scoring path.

    Built once per record, it caches what does not depend on the prediction — each layer's
    gold mask, |G| per (layer, head), the gold sparsity and the denominator of Eq. 5 — and
    takes ``causal`` from the record, so a decoder is never scored with the n·m denominator
    by mistake. A prediction then costs two popcounts per layer: |Ĝ ∧ G| and |Ĝ|.
    The numbers are exactly those of :func:`recall` and :func:`sparsity`.

    With ``extra`` (the default) it also gives the :data:`EXTRA_METRICS`, from intermediates
    shared by all of them: the gold edges are listed once per layer (row-major, with their
    probabilities, cut into rows and heads). A prediction is then read only AT the gold
    edges (one gather): a cumulative sum of the misses gives, per row, whether the row is
    exact, and per head the recall and the precision's numerator; one of the missed
    probabilities the mass recall; and the prediction's 16-tiles (one pass over the mask,
    the 64-tiles derived from them) the block recalls. Equal to :func:`precision`,
    :func:`exact_fraction`, :func:`mass_recall` and :func:`block_recall` (float sums in
    another order: to ~1e-12).
    """

    def __init__(self, record: AttentionRecord, *, extra: bool = True) -> None:
        if not record.layers:
            raise ValueError("the record has no layers; extract it with graphs.extract()")
        self.record = record
        self.extra = bool(extra)
        self.causal: bool = bool(record.causal)
        #: each layer's dense gold mask, unpacked when read (see :class:`_Golds`)
        self.golds: Sequence[Tensor] = _Golds(record)
        self._gold_shapes = [_gold_shape(graph) for graph in record.layers]
        n, m = self._gold_shapes[0][-2:]
        self.shape: tuple[int, int] = (int(n), int(m))
        self.denominator: int = n_allowed_pairs(int(n), int(m), causal=self.causal)
        # Sliding-window (local) layers of decoders allow fewer pairs: their masks and
        # denominators are per layer (None / the shared denominator everywhere else).
        # on the record's device: a GPU-resident record is scored without host copies
        device = getattr(record.layers[0], "device", torch.device("cpu"))
        self._masks: list[Tensor | None] = [
            layer_allowed(int(n), int(m), causal=self.causal,
                          sliding_window=getattr(graph, "sliding_window", None), device=device)
            for graph in record.layers
        ]
        self._denominators: list[int] = [
            self.denominator if not getattr(graph, "sliding_window", None)
            else int(count_true(mask[None])[0])
            for graph, mask in zip(record.layers, self._masks, strict=True)
        ]
        self._index: dict[int, _GoldIndex] = {}
        self._cells: dict[int, Tensor] = {}
        self._runs: dict[int, tuple[Tensor, Tensor]] = {}  # each row's allowed keys
        # |G| per (layer, head). With the extras, from each layer's edge list, built here
        # from ONE unpacking of the packed gold (the list is what scoring reads anyway):
        # unpacking is ~0.2 s a layer on a 1 B decoder at 2048 tokens.
        self.gold_counts: Tensor = torch.stack(
            [self._gold_index(i).head_ptr.diff() for i in range(len(record.layers))]
            if self.extra else
            [count_true(self._allowed(g, i)) for i, g in enumerate(self.golds)])
        self.gold_sparsity: Tensor = torch.stack(
            [self._sparsity(c, i) for i, c in enumerate(self.gold_counts)])
        #: bool (layers,): the layers overall averages count (not softmax ones)
        self.counted: Tensor = torch.tensor(
            [not getattr(graph, "is_softmax", False) for graph in record.layers],
            device=self.gold_sparsity.device)

    def _allowed(self, mask: Tensor, layer: int) -> Tensor:
        allowed = self._masks[layer]
        if allowed is None:
            return mask
        return mask & allowed.to(mask.device)

    def _sparsity(self, kept: Tensor, layer: int) -> Tensor:
        denominator = self._denominators[layer]
        if denominator == 0:
            return torch.ones(kept.shape, dtype=_DTYPE, device=kept.device)
        return 1.0 - kept.to(_DTYPE) / denominator

    def _check(self, layer: int, pred: Tensor) -> None:
        _check_mask("pred", pred)
        shape = self._gold_shapes[layer]
        if tuple(pred.shape) != shape:
            raise ValueError(
                f"layer {layer}: pred {tuple(pred.shape)} and gold {shape} must match"
            )

    def layer(self, layer: int, pred: Tensor) -> tuple[Tensor, Tensor]:
        """(recall, sparsity) per head of one layer's prediction bool (heads, n, m)."""
        self._check(layer, pred)
        gold = self.golds[layer]
        pred = self._allowed(pred, layer)
        total = self.gold_counts[layer]
        hit = count_true(pred & gold)
        recall_ = torch.where(total > 0, hit.to(_DTYPE) / total.clamp(min=1), 1.0)
        return recall_, self._sparsity(count_true(pred), layer)

    def _gold_index(self, layer: int) -> _GoldIndex:
        if layer not in self._index:
            graph = self.record.layers[layer]
            gold = graph.gold
            heads, n, _ = gold.shape
            flat = gold.reshape(-1).nonzero()[:, 0]
            probs = graph.prob_values.to(gold.device, _DTYPE)
            mass = torch.zeros(heads, dtype=_DTYPE, device=gold.device).index_add_(
                0, flat // (n * self.shape[1]), probs)
            if self._masks[layer] is not None:  # gold has no disallowed pair by construction;
                keep = self._allowed(gold, layer).reshape(-1)[flat]  # never count one
                flat, probs = flat[keep], probs[keep]
            rows = flat // self.shape[1]  # global row id: head·n + i
            row_ptr = torch.searchsorted(rows, torch.arange(heads * n + 1, device=gold.device))
            allowed_gold = self._allowed(gold, layer)
            tiles = _tiles(allowed_gold.contiguous())
            self._index[layer] = _GoldIndex(
                flat=flat, row_ptr=row_ptr, head_ptr=row_ptr[::n] if n else row_ptr[:1].repeat(
                    heads + 1), probs=probs, mass=mass, tiles=tiles,
                tile_counts={b: t.sum((-2, -1), dtype=torch.int64) for b, t in tiles.items()})
        return self._index[layer]

    def _kept_and_tiles(self, pred: Tensor, layer: int) -> tuple[Tensor, Tensor, dict]:
        """(the mask to read at the gold edges, kept allowed pairs per head, tiles by block)
        of a (heads, n, m) prediction. On a CPU one compiled scan of each row's allowed run
        (:func:`.scan.count_kept`): no copy of the mask ANDed with the allowed pairs (gold
        edges are allowed, so the prediction itself is read at them)."""
        if scan.applies(pred) and BLOCK_SIZES[0] == scan.TILE:
            if layer not in self._runs:
                graph = self.record.layers[layer]
                self._runs[layer] = allowed_key_range(
                    *self.shape, causal=self.causal,
                    sliding_window=getattr(graph, "sliding_window", None))
            readable = pred.contiguous()
            kept, small = scan.count_kept(readable, *self._runs[layer])
            return readable, kept, _tiles_from(small)
        readable = self._allowed(pred, layer).contiguous()
        return readable, count_true(readable), _tiles(readable)

    def layer_scores(self, layer: int, pred: Tensor,
                     memo: dict | None = None) -> dict[str, Tensor]:
        """Every metric (recall, sparsity and the :data:`EXTRA_METRICS`) per head of one
        layer's prediction bool (heads, n, m): float64 (heads,) each. ``memo`` (one
        :meth:`score` call's) lets layers given the same shared mask count it once."""
        self._check(layer, pred)
        heads, n = pred.shape[0], self.shape[0]
        index = self._gold_index(layer)
        base = shared_head(pred)
        if base is not None:  # one mask for every head: read it once, not once per head
            # the view, not only its memory: a mask and its transpose share a data pointer
            key = (base.data_ptr(), tuple(base.shape), base.stride(), id(self._masks[layer]))
            computed = memo.get(key) if memo is not None else None
            if computed is None:  # layers given the same mask share these
                readable, kept, tiles = self._kept_and_tiles(base[None], layer)
                computed = (readable[0], kept.repeat(heads), tiles)
                if memo is not None:
                    memo[key] = computed
            readable, kept, tiles = computed
            if layer not in self._cells:  # each edge's (i, j), whatever its head
                self._cells[layer] = index.flat % (n * self.shape[1])
            cells = self._cells[layer]
        else:
            readable, kept, tiles = self._kept_and_tiles(pred, layer)
            cells = index.flat
        missed_heads, inexact, lost = _read_edges(readable, cells, index, heads, n)
        total = self.gold_counts[layer]
        hit = total - missed_heads
        out = {
            "recall": _ratio(hit, total),
            "sparsity": self._sparsity(kept, layer),
            "precision": _ratio(hit, kept),
            "exact_fraction": (1.0 - torch.as_tensor(inexact, dtype=_DTYPE) / n if n
                               else torch.ones(heads, dtype=_DTYPE)),
            "mass_recall": torch.where(index.mass > 0, 1.0 - lost / torch.where(
                index.mass > 0, index.mass, 1.0), 1.0),
        }
        for block in BLOCK_SIZES:
            both = (tiles[block] & index.tiles[block]).sum((-2, -1), dtype=torch.int64)
            out[f"block_recall{block}"] = _ratio(both, index.tile_counts[block])
        return out

    def score(self, preds: Sequence[Tensor]) -> GraphScores:
        """Scores of every (layer, head) from per-layer predictions bool (heads, n, m)."""
        if len(preds) != len(self._gold_shapes):
            raise ValueError(f"got {len(preds)} predicted layers but {len(self._gold_shapes)} "
                             "gold layers")
        if not self.extra:
            pairs = [self.layer(index, pred) for index, pred in enumerate(preds)]
            return GraphScores(
                recall=torch.stack([r for r, _ in pairs]),
                sparsity=torch.stack([s for _, s in pairs]),
                gold_sparsity=self.gold_sparsity, counted=self.counted,
            )
        memo: dict = {}
        per_layer = [self.layer_scores(index, pred, memo) for index, pred in enumerate(preds)]
        stacked = {name: torch.stack([scores[name] for scores in per_layer])
                   for name in per_layer[0]}
        return GraphScores(gold_sparsity=self.gold_sparsity, counted=self.counted, **stacked)


def macro_average(scores: list[GraphScores]) -> dict[str, Tensor | float | int]:
    """Macro-average over texts, then heads, then layers (see module docstring).

    Returns ``{metric}_per_head`` (layers, heads) = mean over texts, ``{metric}_per_layer``
    (layers,) = mean over heads of that, and ``{metric}`` (a float) = mean over layers, for
    ``metric`` in recall, sparsity and (when every text has them) gold_sparsity and the
    :data:`EXTRA_METRICS`; plus ``n_texts`` and ``n_softmax_layers`` (layers left out of
    the overall value: see the module docstring; all are kept when no layer is entmax).
    """
    if not scores:
        raise ValueError("macro_average needs the scores of at least one text")
    metrics = ["recall", "sparsity"]
    for name in ("gold_sparsity", *EXTRA_METRICS):
        if all(getattr(s, name) is not None for s in scores):
            metrics.append(name)
    shapes = {tuple(s.recall.shape) for s in scores}
    if len(shapes) != 1:
        raise ValueError(f"all texts must have the same (layers, heads), got {sorted(shapes)}")
    counted = counted_layers(scores)
    out: dict[str, Tensor | float | int] = {"n_texts": len(scores),
                                            "n_softmax_layers": int((~counted).sum())}
    if not bool(counted.any()):
        counted = torch.ones_like(counted)
    for name in metrics:
        per_head = torch.stack([getattr(s, name).to(_DTYPE) for s in scores]).mean(0)
        per_layer = per_head.mean(-1)
        out[f"{name}_per_head"] = per_head
        out[f"{name}_per_layer"] = per_layer
        out[name] = float(per_layer[counted].mean())
    return out


def counted_layers(scores: Sequence[GraphScores]) -> Tensor:
    """bool (layers,): the layers every text counts (see :attr:`GraphScores.counted`)."""
    layers = int(scores[0].recall.shape[0])
    flags = {tuple(s.counted.tolist()) for s in scores if s.counted is not None}
    if len(flags) > 1:
        raise ValueError("texts disagree on which layers are softmax; extract every record "
                         "with the same α per layer")
    return torch.tensor(flags.pop()) if flags else torch.ones(layers, dtype=torch.bool)
