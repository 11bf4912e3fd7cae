"""Gold α-entmax graphs of long inputs in bounded memory: edges, never dense n×n matrices.

Dense extraction materialises every head's (n, m) scores and probabilities at once: at
n = 8192 a 12-head layer is 3 GiB per float32 copy, and the solver and the masking make
several copies. Here the scores are computed one *block* at a time — a group of heads with
all their queries when that fits the working budget, else one head and a block of its
queries — normalised with the same solver as the dense path
(:func:`~sparsefinder.attention.entmax_ops.entmax_normalize`), reduced to their nonzero entries and
dropped. α-entmax normalises each query row on its own, so a block's rows are exactly the
rows of the dense result: **same edges, same probabilities** (up to float rounding of τ).

Edges are kept in CSR form per layer (:class:`GoldEdges`): for every (head, query) row an
offset into int32 key indices and float32 probabilities — 8 bytes an edge, in the row-major
order of ``gold.nonzero()`` (the order :class:`~sparsefinder.data.records.LayerGraph` uses).

How to get gold edges for long inputs:

* **from q/k** (``(heads, n, d)``, ``(heads, m, d)``, as they enter QKᵀ)::

      edges, _ = entmax_edges(q, k, scaling=d ** -0.5, causal=True)
      edges.nnz, edges.row(h, i)            # keys and probabilities of one query row
      edges.to_dense()                      # bool (heads, n, m), for small n only

  pass ``value=v`` to also get the attention output ``probs @ v`` (what a model layer
  needs), ``budget_mib`` for the working memory of one block, ``max_edge_mib`` for the
  edge store.
* **from a model**: :func:`sparsefinder.attention.interface.capture_edges` runs every entmax layer
of
  a forward pass through :func:`entmax_edges` and hands each layer's edges to a sink (see
  there); :func:`sparsefinder.data.records.extract_edges` does it for one text.

Bad input: a budget too small for one query row, or an edge store that would outgrow
``max_edge_mib``, raises :class:`ExtractionMemoryError` naming the limit (the largest n the
budget allows at the density seen) instead of being killed by the kernel for memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from sparsefinder.attention.entmax_ops import entmax_normalize
from sparsefinder.attention.support_bits import BitStore, SupportBits

#: Working memory of one block by default. 256 MiB keeps blocks large enough that the
#: solver's fixed per-call cost is negligible (≥ 2 heads × 512 rows at n = 8192).
DEFAULT_BUDGET_MIB = 256
#: The edge store's default ceiling: 1 GiB = 134M edges, a 12-head layer at n = 8192 with
#: 16% density (real attention is far sparser).
DEFAULT_MAX_EDGE_MIB = 1024
#: Bytes of working memory per score in a block: the scores, the masked copy, the solver's
#: compacted blocks and scratch, the probabilities (float32 each) and bool masks; peak RSS
#: measured at 21-28 bytes a score (n = 4096, 12 heads, CPU).
_BYTES_PER_SCORE = 32
_BYTES_PER_EDGE = 8  # int32 key + float32 probability


class ExtractionMemoryError(MemoryError):
    """Gold extraction would need more memory than allowed; the message says the limit."""


@dataclass
class GoldEdges:
    """The gold graph of one layer as CSR rows: (head, query) row ``r = h·n + i`` owns
    ``indices[indptr[r]:indptr[r+1]]`` (keys, ascending) and the same slice of ``values``."""

    heads: int
    n: int
    m: int
    indptr: Tensor  # int64 (heads·n + 1,)
    indices: Tensor  # int32 (edges,)
    values: Tensor  # float32 (edges,)

    @property
    def nnz(self) -> int:
        return int(self.indices.numel())

    @property
    def density(self) -> float:
        """Edges over all (head, query, key) pairs (causal pairs are not subtracted)."""
        return self.nnz / max(1, self.heads * self.n * self.m)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.indptr, self.indices, self.values))

    def row(self, head: int, query: int) -> tuple[Tensor, Tensor]:
        """(keys int64, probabilities) of one query row."""
        r = head * self.n + query
        lo, hi = int(self.indptr[r]), int(self.indptr[r + 1])
        return self.indices[lo:hi].long(), self.values[lo:hi]

    def row_counts(self) -> Tensor:
        """int64 (heads, n): support size of every query row."""
        return (self.indptr[1:] - self.indptr[:-1]).view(self.heads, self.n)

    def to_dense(self) -> Tensor:
        """Bool (heads, n, m) gold mask (dense: for small n, tests and old code paths)."""
        gold = torch.zeros(self.heads * self.n * self.m, dtype=torch.bool,
                           device=self.indices.device)
        gold[self._flat()] = True
        return gold.view(self.heads, self.n, self.m)

    def probs(self) -> Tensor:
        """Dense float32 (heads, n, m) probabilities (small n only)."""
        dense = torch.zeros(self.heads * self.n * self.m, dtype=self.values.dtype,
                            device=self.values.device)
        dense[self._flat()] = self.values
        return dense.view(self.heads, self.n, self.m)

    def _flat(self) -> Tensor:
        rows = torch.repeat_interleave(
            torch.arange(self.heads * self.n, device=self.indptr.device), self.row_counts().view(-1)
        )
        return rows * self.m + self.indices.long()

    def to(self, device: torch.device | str) -> GoldEdges:
        return GoldEdges(self.heads, self.n, self.m, self.indptr.to(device),
                         self.indices.to(device), self.values.to(device))

    @classmethod
    def from_probs(cls, probs: Tensor) -> GoldEdges:
        """The edges of dense (heads, n, m) probabilities (the dense path, for comparison)."""
        heads, n, m = probs.shape
        mask = probs > 0
        flat = mask.view(-1).nonzero().squeeze(1)
        counts = mask.sum(-1).view(-1)
        indptr = torch.zeros(heads * n + 1, dtype=torch.int64, device=probs.device)
        indptr[1:] = counts.cumsum(0)
        return cls(heads, n, m, indptr, (flat % m).to(torch.int32),
                   probs.reshape(-1)[flat].float())


def plan_blocks(heads: int, n: int, m: int, budget_mib: float) -> tuple[int, int]:
    """(heads per block, queries per block) whose working memory fits ``budget_mib``.

    Whole heads (all n queries) are grouped while they fit; otherwise one head at a time in
    blocks of queries. This keeps the edges in row-major (head, query) order. Raises
    :class:`ExtractionMemoryError` when not even one query row fits.
    """
    budget = budget_mib * 2**20
    per_row = m * _BYTES_PER_SCORE
    if per_row > budget:
        limit = int(budget // _BYTES_PER_SCORE)
        raise ExtractionMemoryError(
            f"one query row over m={m} keys needs {per_row / 2**20:.1f} MiB of working memory, "
            f"more than the budget of {budget_mib} MiB (the limit at this budget is "
            f"m <= {limit} keys); raise budget_mib or shorten the input"
        )
    per_head = n * per_row
    if per_head <= budget:
        return max(1, min(heads, int(budget // per_head))), n
    return 1, max(1, min(n, int(budget // per_row)))


def _available_mib() -> float | None:
    """MemAvailable from /proc/meminfo (Linux), None elsewhere (host memory)."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _check_budget(budget_mib: float, max_edge_mib: float, device: torch.device) -> None:
    if budget_mib <= 0 or max_edge_mib <= 0:
        raise ValueError(
            f"budget_mib and max_edge_mib must be > 0 MiB, got {budget_mib} and {max_edge_mib}"
        )
    if device.type == "cuda":
        available = torch.cuda.mem_get_info(device)[0] / 2**20
    elif device.type == "cpu":
        available = _available_mib()
    else:
        return
    if available is not None and budget_mib > available:
        raise ExtractionMemoryError(
            f"the working budget of {budget_mib} MiB exceeds the {available:.0f} MiB of memory "
            f"available; pass budget_mib below {available:.0f}"
        )


def _edge_limit_error(heads: int, n: int, m: int, edges: int, rows_done: int,
                      max_edge_mib: float) -> ExtractionMemoryError:
    density = edges / max(1, rows_done * m)
    max_edges = max_edge_mib * 2**20 / _BYTES_PER_EDGE
    # Square inputs: heads·n²·density edges fit when n <= sqrt(max_edges / (heads·density)).
    limit = int(math.sqrt(max_edges / (heads * max(density, 1e-12))))
    return ExtractionMemoryError(
        f"the gold graph of this {heads}-head layer at n={n}, m={m} needs more than "
        f"max_edge_mib={max_edge_mib} MiB of edges ({edges} edges after {rows_done} of "
        f"{heads * n} rows, density {density:.2%}); at this density the limit is about "
        f"n={limit} tokens: shorten the input or raise max_edge_mib"
    )


def entmax_edges(
    query: Tensor,
    key: Tensor,
    scaling: float,
    *,
    alpha: float = 1.5,
    causal: bool = False,
    allowed: Tensor | None = None,
    value: Tensor | None = None,
    budget_mib: float = DEFAULT_BUDGET_MIB,
    max_edge_mib: float = DEFAULT_MAX_EDGE_MIB,
    form: str = "edges",
) -> tuple[GoldEdges | SupportBits, Tensor | None]:
    """Gold edges of ``entmax_α(scaling · q kᵀ)`` for one text, block by block.

    ``query`` (heads, n, d), ``key`` (heads, m, d); query i is aligned with key
    ``i + (m - n)`` (:mod:`sparsefinder.attention.masks`), so ``causal`` keeps keys ``j <= i + m -
    n``.
    ``allowed``: optional bool mask broadcastable to (heads, n, m) (padding); masked keys get
    probability 0. ``value`` (heads, m, dv): also return the attention output
    ``probs @ value`` (heads, n, dv), else None. α > 1 (α = 1 is softmax: every pair an edge).

    Memory: ~``budget_mib`` for one block plus the edges (8 bytes each, capped by
    ``max_edge_mib``) plus the inputs and output — independent of n² otherwise.
    ``form="bits"``: the support as :class:`~sparsefinder.attention.support_bits.SupportBits`
    (``heads · n · ⌈m/8⌉`` bytes, also capped by ``max_edge_mib``; no probabilities) instead
    of the CSR edges: the form for long inputs of dense-ish models.
    """
    if form not in ("edges", "bits"):
        raise ValueError(f"form must be 'edges' (CSR with probabilities) or 'bits' (the "
                         f"support bit-packed), got {form!r}")
    if query.dim() != 3 or key.dim() != 3 or query.shape[0] != key.shape[0] or (
        query.shape[-1] != key.shape[-1]
    ):
        raise ValueError(
            f"query and key must be (heads, n, d) and (heads, m, d) with the same heads and d, "
            f"got {tuple(query.shape)} and {tuple(key.shape)}"
        )
    if alpha <= 1.0:
        raise ValueError(f"alpha must be > 1 for a sparse gold graph, got {alpha}")
    heads, n, _ = query.shape
    m = key.shape[1]
    _check_budget(budget_mib, max_edge_mib, query.device)
    head_group, rows = plan_blocks(heads, n, m, budget_mib)
    max_edges = int(max_edge_mib * 2**20 / _BYTES_PER_EDGE)
    device = query.device
    counts = torch.zeros(heads * n, dtype=torch.int64, device=device)
    store = _EdgeStore(device)
    bits = None
    if form == "bits":
        if BitStore.nbytes(heads, n, m) > max_edge_mib * 2**20:
            raise _bits_limit_error(heads, n, m, max_edge_mib)
        bits = BitStore(heads, n, m, device)
    stored = 0
    output = None
    if value is not None:
        output = value.new_empty(heads, n, value.shape[-1])
    offset = m - n
    for h0 in range(0, heads, head_group):
        h1 = min(heads, h0 + head_group)
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            # Causal: keys after the block's last query's own key are masked for every row.
            width = min(m, r1 + offset) if causal else m
            if width <= 0:
                if output is not None:
                    output[h0:h1, r0:r1] = 0
                continue
            scores = torch.matmul(query[h0:h1, r0:r1], key[h0:h1, :width].transpose(-1, -2))
            scores.mul_(scaling)
            keep = _block_allowed(allowed, causal, h0, h1, r0, r1, width, offset, device)
            probs = entmax_normalize(scores, alpha, keep)
            del scores
            if output is not None:
                output[h0:h1, r0:r1] = torch.matmul(probs.to(value.dtype), value[h0:h1, :width])
            mask = probs > 0
            if bits is not None:
                bits.add(h0, h1, r0, r1, mask)
                del mask, probs
                continue
            counts_block = mask.sum(-1)  # (hb, rb)
            counts.view(heads, n)[h0:h1, r0:r1] = counts_block
            flat = mask.view(-1).nonzero().squeeze(1)
            del mask
            stored += int(flat.numel())
            if stored > max_edges:
                done = (h0 * n + (h1 - h0) * r1) if head_group > 1 else (h0 * n + r1)
                raise _edge_limit_error(heads, n, m, stored, done, max_edge_mib)
            store.append((flat % width).to(torch.int32), probs.view(-1)[flat].float())
            del flat, probs
    if bits is not None:
        return bits.support, output
    indptr = torch.zeros(heads * n + 1, dtype=torch.int64, device=device)
    indptr[1:] = counts.cumsum(0)
    indices, values = store.finish()
    return GoldEdges(heads, n, m, indptr, indices, values), output


def _bits_limit_error(heads: int, n: int, m: int, max_edge_mib: float) -> ExtractionMemoryError:
    # heads · n · m / 8 bytes fit when n <= sqrt(8 · max bytes / heads) (square inputs)
    limit = int(math.sqrt(8 * max_edge_mib * 2**20 / heads))
    return ExtractionMemoryError(
        f"the bit-packed support of this {heads}-head layer at n={n}, m={m} needs "
        f"{BitStore.nbytes(heads, n, m) / 2**20:.0f} MiB, more than max_edge_mib={max_edge_mib}"
        f" MiB; the limit is about n={limit} tokens: shorten the input or raise max_edge_mib"
    )


class _EdgeStore:
    """Edges appended block by block into large slabs.

    Why slabs: small long-lived tensors allocated between a block's large transient ones pin
    the heap under glibc malloc (freed holes cannot be trimmed), and the resident memory
    grew by ~half a block per block in measurements. Slabs of just over 32 MiB — glibc's
    largest mmap threshold — are always mmapped, so they never sit in the heap.
    """

    SLAB = (32 << 20) // 4 + 1024  # elements of 4 bytes

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.slabs: list[tuple[Tensor, Tensor]] = []
        self.used = 0  # elements used in the last slab

    def append(self, indices: Tensor, values: Tensor) -> None:
        start = 0
        while start < indices.numel():
            if not self.slabs or self.used == self.slabs[-1][0].numel():
                size = max(self.SLAB, indices.numel() - start)
                self.slabs.append((torch.empty(size, dtype=torch.int32, device=self.device),
                                   torch.empty(size, dtype=torch.float32, device=self.device)))
                self.used = 0
            slab_i, slab_v = self.slabs[-1]
            take = min(indices.numel() - start, slab_i.numel() - self.used)
            slab_i[self.used : self.used + take] = indices[start : start + take]
            slab_v[self.used : self.used + take] = values[start : start + take]
            self.used += take
            start += take

    def finish(self) -> tuple[Tensor, Tensor]:
        """One contiguous (indices, values) pair, freeing each slab once copied: the peak is
        the total plus one slab, not twice the total."""
        total = sum(i.numel() for i, _ in self.slabs[:-1]) + self.used
        out_i = torch.empty(total, dtype=torch.int32, device=self.device)
        out_v = torch.empty(total, dtype=torch.float32, device=self.device)
        start = 0
        self.slabs.reverse()
        while self.slabs:
            slab_i, slab_v = self.slabs.pop()
            take = self.used if not self.slabs else slab_i.numel()
            out_i[start : start + take] = slab_i[:take]
            out_v[start : start + take] = slab_v[:take]
            start += take
            del slab_i, slab_v
        return out_i, out_v


def _block_allowed(
    allowed: Tensor | None, causal: bool, h0: int, h1: int, r0: int, r1: int, width: int,
    offset: int, device: torch.device,
) -> Tensor | None:
    """Bool (hb or 1, rb, width) allowed keys of one block, or None when all are allowed."""
    keep = None
    if allowed is not None:
        a = allowed
        while a.dim() < 3:
            a = a.unsqueeze(0)
        a = a[h0:h1] if a.shape[0] > 1 else a
        a = a[:, r0:r1] if a.shape[1] > 1 else a
        keep = a[..., :width]
    if causal:
        rows = torch.arange(r0, r1, device=device) + offset
        band = torch.arange(width, device=device)[None, :] <= rows[:, None]
        keep = band[None] if keep is None else keep & band
    return keep
