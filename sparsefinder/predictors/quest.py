"""Quest-style page selection (Tang et al., 2024, "Quest: Query-Aware Sparsity for Efficient
Long-Context LLM Inference"): a training-free long-context baseline.

Keys are cut into pages of ``page_size`` consecutive tokens; each page keeps the per-dimension
minimum and maximum of its keys. For a query q, ``U(q, p) = Σ_d max(q_d·min_pd, q_d·max_pd)``
is an upper bound on q·k for every key k of page p (each term bounds q_d·k_d, since k_d lies
in [min_pd, max_pd]). Each query keeps the ``pages`` pages of highest bound: a page holding a
high-scoring key is never ranked below its bound. Cost: O(n·(m/P)·d) for the bounds, against
O(n·m·d) for QKᵀ — it reads the model's ORIGINAL q/k (``inputs="original"``), like Quest.

Vectorised as ``U = q⁺·maxᵀ + q⁻·minᵀ`` (q⁺ = max(q, 0), q⁻ = min(q, 0)): two matmuls of
(heads, n, d) by (heads, d, m/P), no (n, pages, d) tensor. With ``causal`` a query only ranks
pages that start at or before it (Quest decodes with the whole past in cache; in a prefill
its own page is partly in the future, whose keys are then cut), and the future is cut at the
end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sparsefinder.attention.masks import layer_allowed
from sparsefinder.predictors.base import check_shapes


@dataclass
class QuestPages:
    """Edge iff key j's page is among query i's ``pages`` pages of highest upper bound."""

    pages: int
    page_size: int = 16
    returns_fresh_mask = True
    honours_window = True  # see base.WindowAware

    def __post_init__(self) -> None:
        for name in ("pages", "page_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    def page_bounds(self, k: Tensor) -> tuple[Tensor, Tensor]:
        """Per-page, per-dimension (min, max) of the keys: each (heads, ceil(m/P), d)."""
        heads, m, d = k.shape
        n_pages = -(-m // self.page_size)
        pad = n_pages * self.page_size - m
        if pad:  # the last page is partial: pad with copies of its own last key
            k = torch.cat([k, k[:, -1:].expand(heads, pad, d)], dim=1)
        paged = k.reshape(heads, n_pages, self.page_size, d)
        return paged.amin(2), paged.amax(2)

    def upper_bounds(self, q: Tensor, k: Tensor) -> Tensor:
        """(heads, n, pages): ``Σ_d max(q_d·min_pd, q_d·max_pd)`` ≥ q·k for each key k of p."""
        low, high = self.page_bounds(k)
        return (q.clamp(min=0) @ high.transpose(-1, -2)
                + q.clamp(max=0) @ low.transpose(-1, -2))

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False,
                sliding_window: int | None = None) -> Tensor:
        """q: (heads, n, d), k: (heads, m, d) → bool (heads, n, m); on a local layer the
        pages are chosen among those that overlap the query's window."""
        check_shapes(q, k)
        dtype = torch.promote_types(q.dtype, torch.float32)
        q, k = q.to(dtype), k.to(dtype)
        heads, n, m = q.shape[0], q.shape[1], k.shape[1]
        if n == 0 or m == 0:
            return torch.zeros(heads, n, m, dtype=torch.bool, device=q.device)
        bounds = self.upper_bounds(q, k)
        n_pages = bounds.shape[-1]
        start = torch.arange(n_pages, device=q.device) * self.page_size
        position = torch.arange(n, device=q.device) + (m - n)
        # the last key a query may reach: itself (causal), or W - 1 ahead (a bidirectional
        # local layer); a page starting after it is out of reach
        ahead = 0 if causal else (int(sliding_window) - 1 if sliding_window else None)
        if ahead is not None:
            bounds = bounds.masked_fill(start[None, :] > position[:, None] + ahead,
                                        float("-inf"))
        if sliding_window:  # ... and one ending before the window's first key is out of reach
            end = start + self.page_size - 1
            bounds = bounds.masked_fill(end[None, :] <= position[:, None] - sliding_window,
                                        float("-inf"))
        keep = min(self.pages, n_pages)
        top = bounds.topk(keep, dim=-1)
        chosen = torch.zeros(heads, n, n_pages, dtype=torch.bool, device=q.device)
        chosen.scatter_(-1, top.indices, top.values > float("-inf"))
        mask = chosen.repeat_interleave(self.page_size, dim=-1)[..., :m].contiguous()
        allowed = layer_allowed(n, m, causal=causal, sliding_window=sliding_window,
                                device=q.device)
        return mask if allowed is None else mask & allowed
