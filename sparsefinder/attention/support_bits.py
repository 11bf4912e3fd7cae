"""Gold supports as bits: one bit per (head, query, key) pair, where the edge list would not fit.

The CSR edges of :mod:`~sparsefinder.attention.gold_edges` cost 8 bytes an edge, so their size
grows with the density: a ~1 B decoder (16 layers × 32 heads) at 16 384 tokens with 5 % of its
causal pairs in the support holds 3.4 G edges, 25.6 GiB. The support as bits costs
``heads · n · ⌈m/8⌉`` bytes whatever the density — 1 GiB a layer there, 16 GiB for the
model, which a GPU holds — and keeps what recall and sparsity need (which pairs), not the
probabilities. :func:`~sparsefinder.attention.gold_edges.entmax_edges` fills it block by block
(``form="bits"``), so the working memory stays that of one block: O(n · block) beside the bits.

Bit ``k`` of byte ``j`` of a row is key ``8j + k`` (:mod:`~sparsefinder.attention.packed_mask`'s
layout): a row, a head or the whole layer unpacks on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sparsefinder.attention.packed_mask import count_packed, pack_mask, unpack_mask


@dataclass
class SupportBits:
    """The gold support of one layer: bit-packed bool (heads, n, m), on the device it was
    computed on."""

    heads: int
    n: int
    m: int
    bits: Tensor  # uint8 (heads, n, ceil(m / 8))

    @property
    def nnz(self) -> int:
        """Pairs in the support (a popcount: no unpacking)."""
        return int(self.row_counts().sum())

    @property
    def density(self) -> float:
        """Support pairs over all (head, query, key) pairs (causal pairs are not subtracted)."""
        return self.nnz / max(1, self.heads * self.n * self.m)

    @property
    def nbytes(self) -> int:
        return self.bits.numel() * self.bits.element_size()

    def row_counts(self) -> Tensor:
        """int64 (heads, n): support size of every query row."""
        return count_packed(self.bits)

    def to_dense(self, head: int | None = None) -> Tensor:
        """Bool (heads, n, m), or (n, m) of one ``head``: unpack one head at a time at long n."""
        return unpack_mask(self.bits if head is None else self.bits[head], self.m)

    def to(self, device: torch.device | str) -> SupportBits:
        return SupportBits(self.heads, self.n, self.m, self.bits.to(device))

    @classmethod
    def from_mask(cls, mask: Tensor) -> SupportBits:
        """The bits of a dense bool (heads, n, m) support (for comparison and small inputs)."""
        heads, n, m = mask.shape
        return cls(heads, n, m, pack_mask(mask.contiguous()))


class BitStore:
    """Block-by-block writer of a layer's :class:`SupportBits` (all bits zero to start: keys a
    block never reaches, such as a causal block's future, stay out of the support)."""

    def __init__(self, heads: int, n: int, m: int, device: torch.device) -> None:
        self.support = SupportBits(heads, n, m, torch.zeros(
            (heads, n, -(-m // 8)), dtype=torch.uint8, device=device))

    @staticmethod
    def nbytes(heads: int, n: int, m: int) -> int:
        return heads * n * -(-m // 8)

    def add(self, h0: int, h1: int, r0: int, r1: int, mask: Tensor) -> None:
        """The bool (h1 − h0 or 1, r1 − r0, width) support of keys ``0 … width − 1``."""
        packed = pack_mask(mask.contiguous())
        self.support.bits[h0:h1, r0:r1, : packed.shape[-1]] = packed
