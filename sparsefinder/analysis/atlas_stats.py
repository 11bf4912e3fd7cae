"""Per-head statistics of gold attention over a corpus, as sums that reduce exactly.

Every statistic of the head atlas is a sum (float64) or a count over texts or rows, or a
histogram with fixed bins, so adding two :class:`HeadSums` (two shards, two torchrun ranks)
gives exactly what one pass over both would give: ``torch.distributed`` reduces the packed
tensor with one ``all_reduce(SUM)``.

Two kinds of means come out (:meth:`HeadSums.means`):

- per TEXT (each text weighs the same, like the sweeps' macro average): gold sparsity, its
  histogram and length dependence, and the predictor's recall, mass recall, exact rows and
  sparsity;
- per ROW (each query of the corpus weighs the same): support size, entropy, attended
  distance, the shares of mass on the diagonal, previous/next/first/last token and
  punctuation, and the share of rows whose support is contiguous.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from sparsefinder.attention.masks import layer_allowed
from sparsefinder.data.records import AttentionRecord, LayerGraph

#: Bins of a per-text gold sparsity histogram on [0, 1] (quantiles to 1/SPARSITY_BINS).
SPARSITY_BINS = 200
#: Support sizes counted exactly up to this; larger supports share the last bin.
SUPPORT_BINS = 513
#: Text-length bins (tokens) for the dependence of gold sparsity on length.
LENGTH_EDGES: tuple[int, ...] = (0, 32, 64, 128, 256, 512, 1024)
#: Per-row shares of attention mass, in this order (the row features of an example).
SHARES = ("diagonal", "previous", "next", "first", "last", "punctuation")
#: Per-row statistics averaged over rows (support and the shares above, among others).
ROW_STATS = ("support", "support_fraction", "entropy", "distance", *SHARES, "contiguous",
             "not_full")
#: Predictor metrics averaged over texts (as ``Scorer.layer_scores`` names them).
PREDICTOR_STATS = ("recall", "mass_recall", "exact_fraction", "sparsity")


def punctuation_mask(tokens: Sequence[str], special: Sequence[bool]) -> Tensor:
    """bool (n,): tokens made only of punctuation (WordPiece ``##`` and BPE ``Ġ``/``▁``
    markers ignored); special tokens are never punctuation."""
    out = []
    for token, is_special in zip(tokens, special, strict=True):
        core = token.removeprefix("##").lstrip("Ġ▁")
        out.append(bool(core) and not is_special
                   and all(unicodedata.category(c).startswith("P") for c in core))
    return torch.tensor(out, dtype=torch.bool)


def _row_shift(values: Tensor, offset: int) -> Tensor:
    """Diagonal ``offset`` of (heads, n, m) as a (heads, n) row vector (0 where absent)."""
    heads, n, m = values.shape
    out = values.new_zeros(heads, n)
    diag = torch.diagonal(values, offset=offset, dim1=-2, dim2=-1)  # (heads, len)
    start = max(-offset, 0)
    out[:, start:start + diag.shape[-1]] = diag
    return out


def row_features(graph: LayerGraph, causal: bool, punctuation: Tensor) -> dict[str, Tensor]:
    """Every per-row statistic of one layer: float64 (heads, n) each (see :data:`ROW_STATS`)."""
    probs = graph.probs().double()
    gold = graph.gold
    heads, n, m = gold.shape
    allowed = layer_allowed(n, m, causal=causal, sliding_window=graph.sliding_window)
    allowed_count = (allowed.sum(-1) if allowed is not None
                     else torch.full((n,), m)).to(torch.float64)  # (n,)
    support = gold.sum(-1, dtype=torch.int64)
    cols = torch.arange(m, dtype=torch.float64)
    rows = torch.arange(n, dtype=torch.float64)
    first_on = gold.to(torch.uint8).argmax(-1)
    last_on = m - 1 - gold.flip(-1).to(torch.uint8).argmax(-1)
    return {
        "support": support.double(),
        "support_fraction": support.double() / allowed_count.clamp(min=1),
        "entropy": -torch.special.xlogy(probs, probs).sum(-1),
        "distance": (probs * (rows[:, None] - cols[None, :]).abs()).sum(-1),
        "diagonal": _row_shift(probs, 0),
        "previous": _row_shift(probs, -1),
        "next": _row_shift(probs, 1),
        "first": probs[..., 0],
        "last": probs[..., m - 1],
        "punctuation": (probs * punctuation.to(probs.dtype)).sum(-1),
        "contiguous": ((support > 0) & (last_on - first_on + 1 == support)).double(),
        "not_full": (support.double() < allowed_count).double(),
    }


def _length_bin(n_tokens: int) -> int:
    edges = LENGTH_EDGES
    for index in range(len(edges) - 1, -1, -1):
        if n_tokens >= edges[index]:
            return index
    return 0


@dataclass
class HeadSums:
    """Sums of every atlas statistic per (layer, head); add two with ``+``."""

    texts: Tensor  # () number of texts
    rows: Tensor  # () number of rows (queries) over all texts
    sparsity: Tensor  # (L, H) Σ per-text gold sparsity
    sparsity_sq: Tensor  # (L, H) Σ sparsity²
    sparsity_hist: Tensor  # (L, H, SPARSITY_BINS) texts per sparsity bin
    length: Tensor  # () Σ n_tokens
    length_sq: Tensor  # () Σ n_tokens²
    length_sparsity: Tensor  # (L, H) Σ n_tokens · sparsity
    length_bin_texts: Tensor  # (bins,) texts per length bin
    length_bin_sparsity: Tensor  # (L, H, bins) Σ sparsity per length bin
    row_sums: Tensor  # (stats, L, H) Σ over rows of each ROW_STATS
    support_hist: Tensor  # (L, H, SUPPORT_BINS) rows per support size
    predictor: Tensor  # (stats, L, H) Σ over texts of each PREDICTOR_STATS
    predictor_texts: Tensor  # () texts the predictor was scored on

    @classmethod
    def zeros(cls, num_layers: int, num_heads: int) -> HeadSums:
        shape = (num_layers, num_heads)
        zero = torch.zeros((), dtype=torch.float64)
        return cls(
            texts=zero.clone(), rows=zero.clone(),
            sparsity=torch.zeros(shape, dtype=torch.float64),
            sparsity_sq=torch.zeros(shape, dtype=torch.float64),
            sparsity_hist=torch.zeros((*shape, SPARSITY_BINS), dtype=torch.float64),
            length=zero.clone(), length_sq=zero.clone(),
            length_sparsity=torch.zeros(shape, dtype=torch.float64),
            length_bin_texts=torch.zeros(len(LENGTH_EDGES), dtype=torch.float64),
            length_bin_sparsity=torch.zeros((*shape, len(LENGTH_EDGES)), dtype=torch.float64),
            row_sums=torch.zeros((len(ROW_STATS), *shape), dtype=torch.float64),
            support_hist=torch.zeros((*shape, SUPPORT_BINS), dtype=torch.float64),
            predictor=torch.zeros((len(PREDICTOR_STATS), *shape), dtype=torch.float64),
            predictor_texts=zero.clone(),
        )

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.sparsity.shape)  # type: ignore[return-value]

    def add_record(self, record: AttentionRecord, gold_sparsity: Tensor,
                   predictor_scores: dict[str, Tensor] | None = None) -> None:
        """Add one text: ``gold_sparsity`` (L, H) from its ``Scorer``; ``predictor_scores``
        name -> (L, H) tensors of :data:`PREDICTOR_STATS` (None: no predictor)."""
        n = record.n_tokens
        sparsity = gold_sparsity.double()
        self.texts += 1
        self.rows += n
        self.sparsity += sparsity
        self.sparsity_sq += sparsity**2
        bins = (sparsity * SPARSITY_BINS).long().clamp(0, SPARSITY_BINS - 1)
        self.sparsity_hist.scatter_add_(-1, bins[..., None], torch.ones_like(sparsity)[..., None])
        self.length += n
        self.length_sq += n * n
        self.length_sparsity += n * sparsity
        which = _length_bin(n)
        self.length_bin_texts[which] += 1
        self.length_bin_sparsity[..., which] += sparsity
        punctuation = punctuation_mask(record.tokens, record.special)
        for layer, graph in enumerate(record.layers):
            features = row_features(graph, record.causal, punctuation)
            self.row_sums[:, layer] += torch.stack([features[s].sum(-1) for s in ROW_STATS])
            support = features["support"].long().clamp(max=SUPPORT_BINS - 1)
            self.support_hist[layer].scatter_add_(-1, support, torch.ones_like(features["support"]))
        if predictor_scores is not None:
            self.predictor += torch.stack([predictor_scores[s].double()
                                           for s in PREDICTOR_STATS])
            self.predictor_texts += 1

    def __add__(self, other: HeadSums) -> HeadSums:
        return HeadSums(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                           for f in fields(self)})

    def pack(self) -> Tensor:
        """Every sum in one flat float64 tensor (what ``all_reduce`` reduces)."""
        return torch.cat([getattr(self, f.name).reshape(-1) for f in fields(self)])

    def unpack(self, flat: Tensor) -> HeadSums:
        """A :class:`HeadSums` shaped like this one from :meth:`pack`'s layout."""
        out, start = {}, 0
        for f in fields(self):
            like = getattr(self, f.name)
            out[f.name] = flat[start:start + like.numel()].reshape(like.shape).clone()
            start += like.numel()
        return HeadSums(**out)

    def means(self) -> dict[str, Tensor]:
        """Every statistic per (layer, head) (see the module docstring for the weighting)."""
        texts = float(self.texts)
        if texts == 0:
            raise ValueError("the atlas needs at least one text; give a corpus with passages")
        out: dict[str, Tensor] = {}
        mean = self.sparsity / texts
        out["gold_sparsity"] = mean
        out["gold_sparsity_std"] = (self.sparsity_sq / texts - mean**2).clamp(min=0).sqrt()
        for q in (0.1, 0.5, 0.9):
            out[f"gold_sparsity_q{round(q * 100):02d}"] = hist_quantile(
                self.sparsity_hist, q, 1.0 / SPARSITY_BINS)
        var_x = float(self.length_sq) / texts - (float(self.length) / texts) ** 2
        cov = self.length_sparsity / texts - (float(self.length) / texts) * mean
        out["sparsity_per_100_tokens"] = (100 * cov / var_x if var_x > 0
                                          else torch.full_like(mean, float("nan")))
        for index in range(len(LENGTH_EDGES)):
            count = float(self.length_bin_texts[index])
            out[f"gold_sparsity_len{LENGTH_EDGES[index]}"] = (
                self.length_bin_sparsity[..., index] / count if count
                else torch.full_like(mean, float("nan")))
        rows = max(float(self.rows), 1.0)
        for index, name in enumerate(ROW_STATS):
            out[name] = self.row_sums[index] / rows
        out["support_q50"] = hist_quantile(self.support_hist, 0.5, 1.0, offset=0.0)
        out["support_q90"] = hist_quantile(self.support_hist, 0.9, 1.0, offset=0.0)
        scored = float(self.predictor_texts)
        for index, name in enumerate(PREDICTOR_STATS):
            out[f"pred_{name}"] = (self.predictor[index] / scored if scored
                                   else torch.full_like(mean, float("nan")))
        return out


def hist_quantile(hist: Tensor, q: float, width: float, offset: float = 0.5) -> Tensor:
    """The ``q`` quantile of histograms (..., bins): the first bin whose cumulative count
    reaches ``q`` of the total, at ``offset`` of its width (bin centres by default)."""
    cumulative = hist.cumsum(-1)
    total = cumulative[..., -1:]
    index = (cumulative < q * total).sum(-1).clamp(max=hist.shape[-1] - 1)
    return (index.double() + offset) * width
