"""What do Sparsefinder's k-means clusters hold? POS breakdowns and per-tag recall (paper §6).

The paper's "Cluster analysis" (Fig. 6) tags every token with spaCy and shows, for one head,
the percentage of each POS tag that lands in each cluster. This module computes that table for
queries and keys separately, on one record or pooled over a corpus, plus the recall and
sparsity of a predicted graph restricted to the query rows of each tag (which kinds of words
does the predictor serve worst?).

Counting conventions (relied on by the CLI and the app):

* **Breakdown.** ``ids`` are cluster ids ``(N, K)`` ordered nearest first (as
  :meth:`KMeans.assign` returns them). Only the first ``top_k`` columns are used (default 1,
  the paper's figure). With ``top_k > 1`` a token counts **once in each** of its ``top_k``
  clusters, so a tag's raw counts sum to ``top_k × (tokens with that tag)``; percentages are
  then normalised per tag, so every present tag's row still sums to 100.
* **Aggregation.** Raw counts are summed over records, then normalised (pooled / micro: a long
  text weighs more than a short one). Tags absent everywhere are not rows.
* **Per-tag recall and sparsity** (micro within a tag): over all query rows whose tag is T,
  ``recall = Σ|pred ∧ gold| / Σ|gold|`` (1.0 where the tag has no gold edge, like
  :func:`sparsefinder.metrics.measures.recall`) and ``sparsity = 1 − Σ|pred| / Σ allowed``, where
  ``allowed`` is m per row, or the non-future keys of the row when causal. Over records the
  counts are summed before dividing.

Everything is counted with ``numpy.bincount`` over (tag, cluster) codes: no loop over tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from sparsefinder.attention.masks import allowed_per_row, apply_causal
from sparsefinder.predictors.kmeans import KMeans

if TYPE_CHECKING:
    from sparsefinder.projections.heads import HeadProjections

#: Columns of a per-tag edge-count table, in order.
EDGE_COUNT_COLUMNS: tuple[str, ...] = ("tokens", "gold", "hit", "predicted", "allowed")


def _as_ids(ids: Tensor | np.ndarray, top_k: int | None) -> np.ndarray:
    """Cluster ids as int64 numpy (N, k), keeping the nearest ``top_k`` columns."""
    array = ids.detach().cpu().numpy() if isinstance(ids, Tensor) else np.asarray(ids)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2:
        raise ValueError(f"cluster ids must have shape (N,) or (N, k), got {array.shape}")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}")
        if top_k > array.shape[1]:
            raise ValueError(f"top_k={top_k} but the ids hold only {array.shape[1]} per token")
        array = array[:, :top_k]
    return array.astype(np.int64, copy=False)


def _encode_tags(tags: Sequence[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(unique tags sorted, code per token); checks the lengths agree."""
    if len(tags) != n:
        raise ValueError(f"got {len(tags)} POS tags for {n} tokens; they must align 1:1")
    names, codes = np.unique(np.asarray(tags, dtype=object).astype(str), return_inverse=True)
    return names, codes.reshape(-1)


def tag_cluster_counts(
    tags: Sequence[str],
    ids: Tensor | np.ndarray,
    n_clusters: int,
    *,
    top_k: int | None = 1,
) -> pd.DataFrame:
    """Raw counts (tag × cluster) of one head's queries *or* keys in one text.

    ``ids`` (N,) or (N, K) nearest-first; a token counts once in each of its first ``top_k``
    clusters (``None``: all K). Columns are ``0 … n_clusters-1`` (every cluster, even empty).
    """
    array = _as_ids(ids, top_k)
    if array.size and (array.min() < 0 or array.max() >= n_clusters):
        raise ValueError(
            f"cluster ids must lie in [0, {n_clusters}), got {array.min()}…{array.max()}"
        )
    names, codes = _encode_tags(tags, array.shape[0])
    flat = (codes[:, None] * n_clusters + array).reshape(-1)
    counts = np.bincount(flat, minlength=len(names) * n_clusters)
    table = pd.DataFrame(
        counts.reshape(len(names), n_clusters),
        index=pd.Index(names, name="tag"),
        columns=pd.RangeIndex(n_clusters, name="cluster"),
    )
    return table


def sum_tables(tables: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Add count tables (tag rows may differ between texts; missing ones count 0)."""
    tables = list(tables)
    if not tables:
        raise ValueError("sum_tables needs at least one table")
    total = pd.concat(tables).groupby(level=0, sort=True).sum()
    total.index.name = tables[0].index.name
    total.columns.name = tables[0].columns.name
    return total.astype(np.int64)


def to_percentages(counts: pd.DataFrame) -> pd.DataFrame:
    """Row-normalise a (tag × cluster) count table to percentages; empty rows are dropped."""
    totals = counts.sum(axis=1)
    kept = counts.loc[totals > 0]
    return kept.div(totals[totals > 0], axis=0) * 100.0


def cluster_breakdown(
    tags: Sequence[str], ids: Tensor | np.ndarray, n_clusters: int, *, top_k: int | None = 1
) -> pd.DataFrame:
    """Percentage of each POS tag assigned to each cluster (paper Fig. 6) for one text."""
    return to_percentages(tag_cluster_counts(tags, ids, n_clusters, top_k=top_k))


def corpus_breakdown(
    items: Iterable[tuple[Sequence[str], Tensor | np.ndarray]],
    n_clusters: int,
    *,
    top_k: int | None = 1,
) -> pd.DataFrame:
    """:func:`cluster_breakdown` pooled over ``(tags, ids)`` pairs: counts summed, then %."""
    tables = [tag_cluster_counts(t, i, n_clusters, top_k=top_k) for t, i in items]
    return to_percentages(sum_tables(tables))


def _rows_allowed(n: int, m: int, causal: bool) -> np.ndarray:
    return allowed_per_row(n, m, causal=causal).numpy()


def tag_edge_counts(
    tags: Sequence[str], pred: Tensor, gold: Tensor, *, causal: bool = False
) -> pd.DataFrame:
    """Per query tag of one head: tokens, gold edges, hits, predicted edges, allowed pairs.

    ``pred`` and ``gold`` are bool (n, m) masks of ONE head. With ``causal`` the future is not
    counted in ``predicted`` nor ``allowed`` (as in :func:`sparsefinder.metrics.measures.sparsity`).
    """
    for name, mask in (("pred", pred), ("gold", gold)):
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.dim() != 2:
            raise ValueError(f"{name} must be a bool tensor (n, m) of one head")
    if pred.shape != gold.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and gold {tuple(gold.shape)} must match")
    n, m = pred.shape
    pred = apply_causal(pred, causal)
    names, codes = _encode_tags(tags, n)
    per_row = np.stack(
        [
            np.ones(n, dtype=np.int64),
            gold.sum(-1).cpu().numpy(),
            (pred & gold).sum(-1).cpu().numpy(),
            pred.sum(-1).cpu().numpy(),
            _rows_allowed(n, m, causal),
        ],
        axis=1,
    ).astype(np.int64)
    summed = np.stack(
        [np.bincount(codes, weights=col, minlength=len(names)) for col in per_row.T], axis=1
    )
    return pd.DataFrame(
        np.rint(summed).astype(np.int64),
        index=pd.Index(names, name="tag"),
        columns=list(EDGE_COUNT_COLUMNS),
    )


def tag_scores(counts: pd.DataFrame) -> pd.DataFrame:
    """Recall and sparsity per tag from (possibly summed) :func:`tag_edge_counts` tables.

    Adds ``recall`` (1.0 where the tag has no gold edge) and ``sparsity``; sorted by recall,
    worst first, so the head of the table answers "which words are served worst".
    """
    out = counts.copy()
    gold = out["gold"].to_numpy(dtype=np.float64)
    allowed = out["allowed"].to_numpy(dtype=np.float64)
    out["recall"] = np.where(gold > 0, out["hit"] / np.maximum(gold, 1), 1.0)
    out["sparsity"] = np.where(allowed > 0, 1.0 - out["predicted"] / np.maximum(allowed, 1), 1.0)
    return out.sort_values(["recall", "tokens"], ascending=[True, False])


def cluster_tokens(
    tokens: Sequence[str], ids: Tensor | np.ndarray, *, top_k: int | None = None
) -> dict[int, list[tuple[int, str]]]:
    """Tokens of each cluster, for display: ``{cluster: [(position, token), …]}``.

    A token appears in each of its (first ``top_k``; ``None``: all) clusters, in text order.
    Clusters with no token are absent; keys are sorted.
    """
    array = _as_ids(ids, top_k)
    if array.shape[0] != len(tokens):
        raise ValueError(f"got {len(tokens)} tokens but ids for {array.shape[0]}")
    positions = np.repeat(np.arange(array.shape[0]), array.shape[1])
    clusters = array.reshape(-1)
    order = np.lexsort((positions, clusters))
    clusters, positions = clusters[order], positions[order]
    bounds = np.flatnonzero(np.diff(clusters)) + 1
    out: dict[int, list[tuple[int, str]]] = {}
    for group_c, group_p in zip(
        np.split(clusters, bounds), np.split(positions, bounds), strict=True
    ):
        if len(group_c):
            out[int(group_c[0])] = [(int(p), tokens[p]) for p in group_p]
    return out


def cluster_edges(
    query_ids: Tensor, key_ids: Tensor, cluster: int, mask: Tensor | None = None
) -> Tensor:
    """Bool (n, m): pairs whose query and key both belong to ``cluster``.

    ``query_ids`` (n, k) / ``key_ids`` (m, k) of one head (or (n,) / (m,)). Pass ``mask``
    (e.g. the gold graph) to keep only that cluster's edges inside it, for highlighting.
    """
    q = query_ids if query_ids.dim() == 2 else query_ids[:, None]
    k = key_ids if key_ids.dim() == 2 else key_ids[:, None]
    edges = (q == cluster).any(-1)[:, None] & (k == cluster).any(-1)[None, :]
    return edges if mask is None else edges & mask


def head_assignments(
    q_proj: Tensor, k_proj: Tensor, centroids: Tensor, head: int, top_k: int
) -> tuple[Tensor, Tensor]:
    """Nearest-first cluster ids of one head: q' (heads, n, r), k' (heads, m, r), centroids
    (heads, B, r) → ``(query_ids (n, top_k), key_ids (m, top_k))``."""
    km = KMeans.from_centroids(centroids[head : head + 1], top_k=top_k)
    return km.assign(q_proj[head : head + 1])[0], km.assign(k_proj[head : head + 1])[0]


def head_prediction(
    q_proj: Tensor, k_proj: Tensor, centroids: Tensor, head: int, top_k: int, causal: bool
) -> Tensor:
    """Sparsefinder k-means graph of one head: bool (n, m)."""
    km = KMeans.from_centroids(centroids[head : head + 1], top_k=top_k)
    return km.predict(q_proj[head : head + 1], k_proj[head : head + 1], causal=causal)[0]


class HeadClusterAnalysis:
    """Accumulates, over records, one head's cluster breakdowns and per-tag recall.

    ``add(record, tags)`` projects the record's queries/keys of ``layer``, assigns them to the
    ``n_clusters`` centroids (``top_k`` nearest), and adds raw counts; the properties return
    pooled tables at any time (so a long corpus can be streamed and records dropped).
    The breakdown uses the same ``top_k`` cluster sets the predictor intersects: with
    ``top_k > 1`` each token counts once in each of its k clusters (module docstring).
    """

    def __init__(
        self,
        projections: HeadProjections,
        layer: int,
        head: int,
        n_clusters: int,
        top_k: int = 1,
    ) -> None:
        self.layer, self.head, self.n_clusters, self.top_k = layer, head, n_clusters, top_k
        self._projections = projections
        if not 0 <= layer < projections.num_layers:
            raise ValueError(f"layer must be in [0, {projections.num_layers}), got {layer}")
        # kmeans() names the stored B values when n_clusters is missing, and checks top_k.
        self._centroids = projections.kmeans(layer, n_clusters, top_k).centroids_
        if not 0 <= head < self._centroids.shape[0]:
            raise ValueError(f"head must be in [0, {self._centroids.shape[0]}), got {head}")
        self._queries: list[pd.DataFrame] = []
        self._keys: list[pd.DataFrame] = []
        self._edges: list[pd.DataFrame] = []

    def add(self, record: Any, tags: Sequence[str]) -> None:
        """Count one :class:`~sparsefinder.data.records.AttentionRecord` with its POS tags."""
        self._projections.check_record(record)
        graph = record.layers[self.layer]
        q = self._projections.project_queries(self.layer, graph.queries)
        k = self._projections.project_keys(self.layer, graph.keys)
        q_ids, k_ids = head_assignments(q, k, self._centroids, self.head, self.top_k)
        self._queries.append(tag_cluster_counts(tags, q_ids, self.n_clusters, top_k=None))
        self._keys.append(tag_cluster_counts(tags, k_ids, self.n_clusters, top_k=None))
        pred = head_prediction(q, k, self._centroids, self.head, self.top_k, record.causal)
        self._edges.append(tag_edge_counts(tags, pred, graph.gold_of(self.head),
                                           causal=record.causal))

    @property
    def n_records(self) -> int:
        return len(self._edges)

    def _check(self) -> None:
        if not self._edges:
            raise ValueError("no records were added; nothing to summarise")

    @property
    def query_percentages(self) -> pd.DataFrame:
        self._check()
        return to_percentages(sum_tables(self._queries))

    @property
    def key_percentages(self) -> pd.DataFrame:
        self._check()
        return to_percentages(sum_tables(self._keys))

    @property
    def pos_scores(self) -> pd.DataFrame:
        self._check()
        return tag_scores(sum_tables(self._edges))
