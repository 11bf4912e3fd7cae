"""Bool masks stored 8 entries per byte, so a record's gold graphs cost 1/8 of a dense mask.

A dense bool gold mask is one byte per (head, query, key): a 2048-token text on a 16-layer,
32-head decoder holds 2 GiB of them. :func:`pack_mask` packs the last axis into bits (bit
``k`` of byte ``j`` is entry ``8j + k``) and :func:`unpack_mask` gives back exactly the
dense mask. The leading axes stay, so one head or one query row unpacks on its own.
:class:`PackedMaskField` makes a dataclass field store packed and read dense.
"""

from __future__ import annotations

import torch
from torch import Tensor

_BITS = 8


#: Multiplying eight 0/1 bytes (read as one little-endian int64) by this sums byte k into
#: bit 56 + k and nowhere else in bits 56-63 (no carries): the top byte is the packed byte.
_GATHER = sum(1 << (56 - 7 * k) for k in range(_BITS))
#: Byte value -> its eight bits spread into eight 0/1 bytes of an int64 (the reverse).
_SPREAD = [sum(((value >> k) & 1) << (8 * k) for k in range(_BITS)) for value in range(256)]


def pack_mask(mask: Tensor) -> Tensor:
    """uint8 ``(..., ceil(m / 8))`` holding the bool ``(..., m)`` mask bit by bit."""
    if mask.dtype != torch.bool:
        raise TypeError(f"a gold mask must be a bool tensor, got {mask.dtype}; pass e.g. "
                        "`probs > 0`")
    if mask.dim() == 0:
        raise ValueError("a gold mask needs at least one axis (keys); got a 0-d tensor")
    m = mask.shape[-1]
    whole_words = m > 0 and m % _BITS == 0 and mask.storage_offset() % _BITS == 0
    if whole_words and mask.is_contiguous():  # eight entries are one int64: one multiply
        words = mask.view(torch.uint8).view(torch.int64) * _GATHER
        return words.bitwise_right_shift_(56).to(torch.uint8)
    packed = torch.zeros((*mask.shape[:-1], -(-m // _BITS)), dtype=torch.uint8,
                         device=mask.device)
    for bit in range(_BITS):  # strided columns: no padded copy, each temporary is 1/8 of the mask
        columns = mask[..., bit::_BITS]
        packed[..., : columns.shape[-1]] |= columns.to(torch.uint8) << bit
    return packed


#: Byte value -> how many of its bits are set.
_POPCOUNT = [bin(value).count("1") for value in range(256)]


def count_packed(packed: Tensor) -> Tensor:
    """int64 ``(...)``: the True entries of each row of a packed mask, without unpacking it
    (padding bits are never set, so whole bytes can be counted)."""
    table = torch.tensor(_POPCOUNT, dtype=torch.int64, device=packed.device)
    return _lookup(table, packed).sum(-1)


def _lookup(table: Tensor, packed: Tensor) -> Tensor:
    """``table[packed]`` for a uint8 ``packed``, shaped like it: ``index_select`` with int32
    indices is ~6× faster on a CPU than indexing with the int64 copy ``packed.long()``."""
    flat = torch.index_select(table, 0, packed.reshape(-1).to(torch.int32))
    return flat.view(packed.shape)


def unpack_mask(packed: Tensor, m: int) -> Tensor:
    """The bool ``(..., m)`` mask that :func:`pack_mask` packed (any leading index of it)."""
    spread = torch.tensor(_SPREAD, dtype=torch.int64, device=packed.device)
    dense = _lookup(spread, packed).view(torch.bool)  # (..., bytes * 8), no further copy
    return dense if dense.shape[-1] == m else dense[..., :m].contiguous()


class PackedMaskField:
    """A dataclass field given and read as a dense bool mask but stored bit-packed.

    Each read unpacks a fresh tensor (writing into it changes nothing stored); assign the
    field to change the mask. The field has no default.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_{name}_packed"  # where an instance keeps (bits, last-axis length)

    def __get__(self, obj: object, owner: type | None = None) -> Tensor:
        if obj is None:  # dataclass asks the class for a default: there is none
            raise AttributeError(self.slot)
        packed, m = obj.__dict__[self.slot]
        return unpack_mask(packed, m)

    def __set__(self, obj: object, mask: Tensor) -> None:
        obj.__dict__[self.slot] = (pack_mask(mask), int(mask.shape[-1]))

    def packed(self, obj: object) -> tuple[Tensor, int]:
        """The stored bits and the unpacked length of the last axis."""
        return obj.__dict__[self.slot]
