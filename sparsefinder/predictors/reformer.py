"""Reformer baseline (Kitaev et al., 2020; Sparsefinder paper §5 and appendix C).

Angular locality-sensitive hashing (Andoni et al., 2015): a vector x is L2-normalised,
rotated by a random Gaussian matrix R (r × B/2) and put in bucket ``argmax([xR; -xR])``.
Nearby directions tend to share a bucket. Reformer shares one projection for queries and
keys ("shared-QK"), so every vector is hashed once and is both a query and a key; here q and
k come from separate projections, so they are hashed *with the same rotation* R, which puts
them in one shared bucket space — the closest analogue. An edge (i, j) is predicted iff query
i and key j share a bucket in at least one of ``n_hashes`` rounds, each round with its own
rotation, as Reformer's multi-round hashing. Sparsefinder sweeps B ∈ {2, 4, ..., 12}.

Choices made here:

- Rotations are drawn per head and per round, ``R ~ N(0, 1)`` of shape
  (heads, r, n_hashes, ⌈B/2⌉), from a ``torch.Generator`` seeded by ``seed`` (like Hugging
  Face's Reformer, which draws one rotation per head; ``reformer-pytorch`` shares one across
  heads unless ``random_rotations_per_head=True``).
- The normalisation does not change any bucket (argmax is invariant to positive scaling);
  it is kept to follow the description. A zero vector lands in bucket 0.
- Odd B (Reformer requires an even B): R gets ⌈B/2⌉ columns and only the first B of the
  2⌈B/2⌉ entries of ``[xR; -xR]`` compete, i.e. the bucket of the last direction ``-x·R_last``
  is dropped and its vectors go to their runner-up. This gives exactly B buckets (B = 1:
  one bucket, the full graph) at the price of unequal bucket sizes.
- ``causal=True`` cuts the future afterwards (Reformer's causal mask within buckets).

``lsh_buckets`` is the bucket formula of ``reformer_pytorch.LSHAttention.hash_vectors``
(version 1.4.4, ``rehash_each_round=True``) without the per-round offsets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from sparsefinder.attention.masks import apply_causal
from sparsefinder.predictors.base import check_shapes


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def lsh_buckets(x: Tensor, rotations: Tensor, n_buckets: int) -> Tensor:
    """Bucket ids: x (heads, N, r), rotations (heads, r, n_hashes, ⌈B/2⌉) → LongTensor
    (heads, n_hashes, N) with values in [0, n_buckets).

    ``argmax(concat([xR, -xR])[:n_buckets])`` per round (ties: lowest bucket).
    """
    rotated = torch.einsum("htf,hfri->hrti", x, rotations.to(x.dtype))
    rotated = torch.cat([rotated, -rotated], dim=-1)[..., :n_buckets]
    return rotated.argmax(dim=-1)


@dataclass
class Reformer:
    """Edge iff query i and key j share an LSH bucket in any of ``n_hashes`` rounds."""

    n_buckets: int
    n_hashes: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        _check_int("n_buckets", self.n_buckets, 1)
        _check_int("n_hashes", self.n_hashes, 1)
        _check_int("seed", self.seed, 0)

    def rotations(self, heads: int, r: int) -> Tensor:
        """The random rotations (heads, r, n_hashes, ⌈B/2⌉); deterministic given the seed."""
        gen = torch.Generator().manual_seed(self.seed)
        half = -(-self.n_buckets // 2)
        return torch.randn((heads, r, self.n_hashes, half), generator=gen)

    def buckets(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Bucket ids of queries (heads, n_hashes, n) and keys (heads, n_hashes, m)."""
        check_shapes(q, k)
        dtype = torch.promote_types(q.dtype, torch.float32)
        rot = self.rotations(q.shape[0], q.shape[2]).to(q.device, dtype)
        qn = F.normalize(q.to(dtype), dim=-1)
        kn = F.normalize(k.to(dtype), dim=-1)
        return lsh_buckets(qn, rot, self.n_buckets), lsh_buckets(kn, rot, self.n_buckets)

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m)."""
        bq, bk = self.buckets(q, k)
        heads, rounds, n = bq.shape
        m, n_buckets = bk.shape[2], self.n_buckets
        if n_buckets > max(n, 64):  # a table with more rows than queries: compare directly
            mask = (bq[..., :, None] == bk[..., None, :]).any(1)
            return apply_causal(mask, causal)
        # Row b of round t is "which keys are in bucket b"; query i's row is then the row of
        # its bucket. Copying rows is far cheaper on CPU than an (heads, n, m) comparison.
        ids = torch.arange(n_buckets, device=bk.device)
        rows = (bk[:, :, None, :] == ids[:, None]).reshape(heads * rounds * n_buckets, m)
        base = torch.arange(heads * rounds, device=bq.device).view(heads, rounds, 1) * n_buckets
        picked = (bq + base).transpose(0, 1)  # (rounds, heads, n): row ids per round
        mask = rows.index_select(0, picked[0].reshape(-1)).view(heads, n, m)
        for t in range(1, rounds):  # loop over hashing rounds, not tokens
            mask.logical_or_(rows.index_select(0, picked[t].reshape(-1)).view(heads, n, m))
        return apply_causal(mask, causal)
