"""Block-sparse α-entmax attention: compute only the predicted key blocks of each query block.

This is the paper's block Sparsefinder (§6) made concrete. Queries and keys are cut into
blocks of ``block`` consecutive tokens; a *block graph* ``(heads, n/block, m/block)`` says
which key blocks each query block attends to. For every (head, query block) the selected key
blocks are gathered into one padded (K·block) strip, the scores of that strip only are
computed, α-entmax runs over it (the sort-free solver of :mod:`sparsefinder.attention.entmax_ops`)
and
the output is ``probs @ values`` on the same strip. Cost: O(heads · n · K·block · d) instead
of O(heads · n · m · d), and memory O(heads · n · K·block).

Exactness (sparse-consistency, paper Prop. 1): the result equals α-entmax restricted to the
token pairs the block graph covers — the dense path of :mod:`sparsefinder.evaluation.restricted`
with
:func:`expand_blocks` as its graph — and equals full α-entmax on every row whose gold support
lies in the selected blocks (block recall 1 ⇒ exact everywhere).

Query blocks are processed in chunks sorted by how many key blocks they select, each chunk
padded to its own maximum, so one query block that selects many keys does not pad them all.
A query block left with no (non-future) key block keeps its diagonal block, with a
:class:`~sparsefinder.attention.masks.RestrictionWarning` (as the dense restricted path does).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from sparsefinder.attention.entmax_ops import entmax_normalize
from sparsefinder.attention.masks import RestrictionWarning, hidden_offsets

_MASKED = -1e9  # far below every α > 1 support (τ* ≥ max - 2), as in entmax_ops
#: Scores per chunk of query blocks: 16 MiB of float32, under glibc's largest mmap threshold,
#: so a tuned allocator reuses the chunk's buffers (measured at n=4096, 1 thread: 0.18 s
#: against 0.32 s with 64 MiB chunks).
_CHUNK_SCORES = 1 << 22
#: On a GPU every chunk pays its kernels' fixed cost (the gathers' and the solver's ~3 ms here),
#: so one chunk of up to 512 MiB of float32 scores: at n = 32 768 (12 heads, block 32, 544 keys
#: a row) two chunks instead of 52. Every chunked path of the package reads it (chunk_scores).
GPU_CHUNK_SCORES = 1 << 27


def chunk_scores(device: torch.device, cpu_scores: int) -> int:
    """Scores per chunk on ``device``: ``cpu_scores`` (each path's cache-sized chunk, measured
    where it is defined) on a CPU, :data:`GPU_CHUNK_SCORES` on a GPU."""
    return GPU_CHUNK_SCORES if device.type == "cuda" else cpu_scores


def num_blocks(n: int, block: int) -> int:
    return -(-n // block)


def expand_blocks(block_graph: Tensor, block: int, n: int, m: int,
                  extra_keys: Tensor | None = None) -> Tensor:
    """Bool (heads, nb, mb) block graph (∪ ``extra_keys`` (heads, nb, G) per query block)
    → (heads, n, m) token mask (dense; for checks and for scoring predictions)."""
    per_block = block_graph.repeat_interleave(block, -1)[..., :m].contiguous()  # (h, nb, m)
    if extra_keys is not None and extra_keys.shape[-1]:
        per_block = per_block.scatter(-1, extra_keys, True)
    return per_block.repeat_interleave(block, -2)[:, :n]


def check_block_inputs(query: Tensor, key: Tensor, value: Tensor, block_graph: Tensor,
                       block: int, sliding_window: int | None) -> tuple[int, int, int, int]:
    """(heads, n, d, query blocks) of block-sparse self-attention inputs, or an error naming
    the expected shapes (every block-sparse path checks its inputs here)."""
    if query.dim() != 3 or key.shape != query.shape[:2] + key.shape[2:] or key.shape[:2] != (
        value.shape[:2]
    ):
        raise ValueError(
            f"query, key and value must be (heads, n, ·) with the same heads and n, got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    heads, n, d = query.shape
    nb = num_blocks(n, block)
    if block_graph.dtype != torch.bool or tuple(block_graph.shape) != (heads, nb, nb):
        raise ValueError(
            f"block_graph must be bool (heads={heads}, {nb}, {nb}) for n={n} and block={block}, "
            f"got {block_graph.dtype} {tuple(block_graph.shape)}"
        )
    if sliding_window is not None and (isinstance(sliding_window, bool) or int(sliding_window)
                                       != sliding_window or sliding_window < 1):
        raise ValueError(f"sliding_window must be an integer >= 1, got {sliding_window!r}")
    return heads, n, d, nb


def repair_block_graph(block_graph: Tensor, *, causal: bool, warn: bool = True,
                       sliding_window: int | None = None, n: int | None = None,
                       block: int | None = None) -> Tensor:
    """Drop key blocks no query of the block may see (future ones; for a local layer of
    window W, ``sliding_window``, those outside every row's window) and give every query
    block with a row left without a key its diagonal block.

    Without a window a non-empty block row never leaves a query row empty (with n = m every
    row sees a key in any non-future block); with one, a row can see none of the selected
    blocks, so emptiness is checked per row (``n`` tokens in blocks of ``block``). An
    empty row would make entmax undefined; its diagonal block holds the query itself.
    """
    heads, nb, mb = block_graph.shape
    graph = block_graph.clone()
    if sliding_window:
        if n is None or block is None:
            raise ValueError("repair_block_graph needs n and block with a sliding_window")
        lo, hi = _row_reach(n, nb, block, int(sliding_window), causal, graph.device)
        ids = torch.arange(mb, device=graph.device)
        graph &= (ids >= lo[:, :1]) & (ids <= hi.amax(-1, keepdim=True))  # (nb, mb)
        counts = torch.nn.functional.pad(graph.to(torch.int32).cumsum(-1), (1, 0))
        seen = counts.gather(-1, (hi + 1).expand(heads, nb, block)) - counts.gather(
            -1, lo.expand(heads, nb, block))  # selected blocks each row may see
        real = (torch.arange(nb * block, device=graph.device) < n).view(nb, block)
        empty = ((seen == 0) & real).any(-1)
    else:
        if causal:
            graph &= torch.ones(nb, mb, dtype=torch.bool, device=graph.device).tril()
        empty = ~graph.any(-1)
    if bool(empty.any()):
        diag = torch.eye(nb, mb, dtype=torch.bool, device=graph.device)
        graph |= empty.unsqueeze(-1) & diag
        if warn:
            heads_hit = sorted({int(h) for h in empty.nonzero()[:, 0].tolist()})
            warnings.warn(
                f"{int(empty.sum())} query blocks (heads {heads_hit}) had a query with no key "
                "in the predicted graph; kept their diagonal block so entmax stays defined",
                RestrictionWarning, stacklevel=3,
            )
    return graph


def _row_reach(n: int, nb: int, block: int, window: int, causal: bool,
               device: torch.device) -> tuple[Tensor, Tensor]:
    """int64 (nb, block) first and last key block each query row's window touches."""
    position = torch.arange(nb * block, device=device).clamp(max=n - 1)
    first = (position - window + 1).clamp(min=0)
    last = position if causal else (position + window - 1).clamp(max=n - 1)
    return (first // block).view(nb, block), (last // block).view(nb, block)


def block_sparse_entmax(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    block_graph: Tensor,
    block: int,
    *,
    scaling: float | None = None,
    alpha: float = 1.5,
    causal: bool = False,
    warn_empty: bool = True,
    extra_keys: Tensor | None = None,
    sliding_window: int | None = None,
) -> Tensor:
    """α-entmax attention output (heads, n, dv) computed on the selected key blocks only.

    ``query`` (heads, n, d), ``key`` (heads, n, d), ``value`` (heads, n, dv) — self-attention,
    n = m; ``block_graph`` bool (heads, ceil(n/block), ceil(n/block)), True = compute the
    tile. ``extra_keys``: optional int64 (heads, ceil(n/block), G) single keys each query block
    also attends to (global / popular keys, as BigBird's global tokens); a key already in a
    selected block or listed twice counts once. ``scaling`` defaults to d^-1/2. Forward only.
    ``sliding_window`` W: a local layer, whose query i sees only keys ``0 <= i - j < W``
    (causal) or ``|i - j| < W`` (see :mod:`~sparsefinder.attention.masks`); keys of a
    selected block or ``extra_keys`` outside the window get probability 0.
    """
    return block_sparse_rows(query, key, value, block_graph, block, scaling=scaling,
                             alpha=alpha, causal=causal, warn_empty=warn_empty,
                             extra_keys=extra_keys, sliding_window=sliding_window,
                             with_thresholds=False)[0]


def block_sparse_rows(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    block_graph: Tensor,
    block: int,
    *,
    scaling: float | None = None,
    alpha: float = 1.5,
    causal: bool = False,
    warn_empty: bool = True,
    extra_keys: Tensor | None = None,
    sliding_window: int | None = None,
    with_thresholds: bool = True,
    only: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`block_sparse_entmax`'s output, with what a support certificate needs
    (:mod:`~sparsefinder.attention.support_certificate`): the repaired block graph, and each
    row's entmax threshold in score units ``x* = τ/(α−1)`` (heads, n): on its support, a
    key of score ``x > x*`` has probability ``[(α−1)x − τ]^{1/(α−1)} > 0``. From the row's
    most probable key ``j``: ``x* = x_j − p_j^{α−1}/(α−1)``; NaN for α = 1 (no threshold) and
    where ``with_thresholds`` is False (a pass over the probabilities saved).

    ``only`` (int64 ids ``head · nb + query block``): compute just those query blocks; the
    output of the others is left unset and their thresholds NaN. For a caller that fills the
    rest itself (the Triton path, for the launches a GPU cannot hold)."""
    heads, n, d, nb = check_block_inputs(query, key, value, block_graph, block,
                                         sliding_window)
    scaling = d**-0.5 if scaling is None else scaling
    device = query.device
    graph = repair_block_graph(block_graph.to(device), causal=causal, warn=warn_empty,
                               sliding_window=sliding_window, n=n, block=block)
    extra = check_extra_keys(extra_keys, heads, nb, n, device)
    rows = heads * nb
    counts = graph.sum(-1).view(-1)  # key blocks per (head, query block)
    if extra is None:
        single, n_single = None, torch.zeros_like(counts)
    else:  # each row's own single keys first: a chunk is as wide as its widest row
        single, n_single = compact_single_keys(extra.view(rows, -1), graph.view(rows, nb),
                                               block)
    pad = nb * block - n
    if pad:
        query, key, value = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in
                             (query, key, value))
    qb = query.reshape(heads * nb, block, d)
    k_tokens, v_tokens = key.reshape(-1, d), value.reshape(-1, value.shape[-1])
    widths = counts * block + n_single
    if only is None:
        order = torch.argsort(widths, descending=True)
    else:
        only = only.to(device=device, dtype=torch.int64)
        order = only[torch.argsort(widths[only], descending=True)]
    out = query.new_empty(rows, block, value.shape[-1])
    thresholds = torch.full((rows, block), torch.nan, dtype=torch.float64, device=device)
    positions = torch.arange(block, device=device)
    start = 0
    budget = chunk_scores(device, _CHUNK_SCORES)
    while start < order.numel():
        size = max(1, min(order.numel() - start, budget // (block * int(widths[order[start]]))))
        chunk = order[start : start + size]
        start += size
        k_max, n_extra = (int(x) for x in torch.stack([counts[chunk].max(),
                                                       n_single[chunk].max()]).tolist())
        width = k_max * block + n_extra
        # Selected key blocks of each row, padded with block 0 (masked below).
        sel = graph.view(rows, nb)[chunk]  # (c, nb)
        slot_ids, slots = torch.sort(sel.to(torch.int8), dim=-1, descending=True, stable=True)
        slots = slots[:, :k_max]  # key block ids, selected first, in ascending order
        valid = slot_ids[:, :k_max].bool()  # (c, K)
        head = torch.div(chunk, nb, rounding_mode="floor")
        qblock = chunk - head * nb
        key_pos = (slots.unsqueeze(-1) * block + positions).view(size, k_max * block)
        key_ok = valid.repeat_interleave(block, -1)
        if n_extra:
            key_pos = torch.cat([key_pos, single[chunk, :n_extra]], 1)
            key_ok = torch.cat([key_ok, torch.arange(n_extra, device=device)
                                < n_single[chunk].unsqueeze(1)], 1)
        # One gather of every key (and value) of the strip, by token: 8 bytes of index per
        # key instead of copying the blocks and then concatenating the single keys.
        tokens = (head.unsqueeze(1) * (nb * block) + key_pos).view(-1)
        keys = k_tokens.index_select(0, tokens).view(size, width, d)
        vals = v_tokens.index_select(0, tokens).view(size, width, -1)
        scores = torch.baddbmm(
            torch.zeros((), dtype=query.dtype, device=device), qb[chunk],
            keys.transpose(1, 2), beta=0, alpha=scaling,
        )  # (c, block, width)
        if scores.dtype == torch.float16:  # products on the half path, τ in float32 (−1e9
            scores = scores.float()        # overflows float16), as the Triton kernel does
        blocked = ~(key_ok & (key_pos < n)).unsqueeze(1)
        if causal or sliding_window:
            query_pos = (qblock.unsqueeze(-1) * block + positions).unsqueeze(-1)  # (c, block, 1)
            ahead = key_pos.unsqueeze(1) - query_pos  # (c, block, width): j - i
            blocked = blocked | hidden_offsets(ahead, causal=causal,
                                               sliding_window=sliding_window)
        # In place, and no zero-fill after: a key at -1e9 gets probability exactly 0 (τ* ≥
        # max − 2), and every real query row keeps a key (its own, in the diagonal block).
        scores.masked_fill_(blocked, _MASKED)
        probs = entmax_normalize(scores, alpha)
        out[chunk] = torch.bmm(probs.to(vals.dtype), vals)
        if with_thresholds and alpha > 1.0:
            top_p, top = probs.max(-1, keepdim=True)
            top_x = scores.gather(-1, top).double()
            thresholds[chunk] = (top_x - top_p.double() ** (alpha - 1) / (alpha - 1))[..., 0]
    return (out.view(heads, nb * block, -1)[:, :n], graph,
            thresholds.view(heads, nb * block)[:, :n])


def new_single_keys(extra: Tensor, selected: Tensor, block: int) -> Tensor:
    """bool like ``extra`` (rows, G), sorted per row (:func:`check_extra_keys`): the single
    keys a row adds to its selected key blocks (``selected`` bool (rows, nb)), each once — not
    a repeat of its neighbour, not inside a selected block."""
    keep = ~selected.gather(1, torch.div(extra, block, rounding_mode="floor"))
    keep[:, 1:] &= extra[:, 1:] != extra[:, :-1]
    return keep


def compact_single_keys(extra: Tensor, selected: Tensor, block: int) -> tuple[Tensor, Tensor]:
    """Each row's new single keys (:func:`new_single_keys`) moved to its front: int64
    positions like ``extra`` (rows, G; the kept keys first, ascending, then 0s) and int64
    counts (rows,). Rows differ in how many keys they add (a crowded block keeps more), so a
    path can give each row only the width it uses."""
    keep = new_single_keys(extra, selected, block)
    width = extra.shape[-1]
    slot = torch.where(keep, keep.cumsum(-1) - 1, width)  # the dropped ones: a spare column
    compact = extra.new_zeros(extra.shape[0], width + 1).scatter_(1, slot, extra)
    return compact[:, :width], keep.sum(-1)


def check_extra_keys(extra_keys: Tensor | None, heads: int, nb: int, n: int,
                      device: torch.device) -> Tensor | None:
    """``extra_keys`` sorted per row (so repeats are neighbours), or an error naming the
    expected shape and range."""
    if extra_keys is None or extra_keys.shape[-1:] == (0,):
        return None
    if extra_keys.dtype != torch.int64 or extra_keys.dim() != 3 or tuple(
        extra_keys.shape[:2]
    ) != (heads, nb):
        raise ValueError(
            f"extra_keys must be int64 (heads={heads}, query blocks={nb}, G), got "
            f"{extra_keys.dtype} {tuple(extra_keys.shape)}"
        )
    if bool((extra_keys < 0).any()) or bool((extra_keys >= n).any()):
        raise ValueError(f"extra_keys must be key positions in [0, {n}), got "
                         f"[{int(extra_keys.min())}, {int(extra_keys.max())}]")
    return extra_keys.to(device).sort(-1).values
