"""The support check's Triton kernel: each row's best score outside its selection, as the
tensor path computes it. Without a GPU the same kernel runs in Triton's CPU interpreter."""

from __future__ import annotations

import pytest
import torch
from tolerances import score_bound
from triton_runtime import device, require_triton

from sparsefinder.attention.block_sparse import repair_block_graph
from sparsefinder.attention.support_certificate import unselected_max

require_triton()
pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


@pytest.fixture
def check():
    from sparsefinder.attention import triton_support_check

    return triton_support_check


@pytest.mark.parametrize(("n", "block", "causal", "window", "singles", "key_tile"), [
    (100, 16, False, None, 6, 64), (100, 16, True, None, 6, 16), (96, 16, False, 20, 4, 32),
    (64, 16, True, 24, 4, 64), (128, 32, True, None, 12, 16), (70, 32, False, None, 0, 128),
    (150, 32, False, 40, 8, 64)])
def test_the_kernel_finds_the_tensor_paths_best_unselected_score(check, n, block, causal,
                                                                 window, singles, key_tile):
    """Whatever the key tile (smaller than a block, several blocks, past the end)."""
    g = torch.Generator().manual_seed(n + block)
    q, k = (torch.randn(2, n, 24, generator=g) * 2 for _ in range(2))  # d padded to 32
    nb = -(-n // block)
    graph = repair_block_graph(torch.rand(2, nb, nb, generator=g) < 0.3, causal=causal,
                               sliding_window=window, n=n, block=block, warn=False)
    extra = torch.randint(0, n, (2, nb, singles), generator=g) if singles else None
    layer = {"causal": causal, "sliding_window": window}
    on = device()
    got = check.triton_unselected_max(
        q.to(on), k.to(on), graph.to(on), block,
        extra_keys=None if extra is None else extra.to(on), key_tile=key_tile,
        **layer).cpu()
    expected = unselected_max(q.double(), k.double(), graph, block, extra_keys=extra, **layer)
    infinite = torch.isinf(expected)
    assert torch.equal(torch.isinf(got), infinite)  # the same rows have nothing outside
    torch.testing.assert_close(got[~infinite].double(), expected[~infinite].double(), rtol=0,
                               atol=score_bound(q, k, 24 ** -0.5))


def test_the_single_key_bitmap_marks_each_query_blocks_keys(check):
    extra = torch.tensor([[[3, 3, 17, 40], [0, 7, 8, 63]]])  # (1 head, 2 query blocks, 4)
    nothing = torch.zeros(1, 2, 2, dtype=torch.bool)
    bits = check.single_key_bits(extra, nothing, 64, 32)
    assert bits.shape == (2, 64 // 8) and bits.dtype == torch.uint8
    unpacked = ((bits.unsqueeze(-1).int() >> torch.arange(8)) & 1).view(2, 64).bool()
    for block_row, keys in enumerate(([3, 17, 40], [0, 7, 8, 63])):
        assert unpacked[block_row].nonzero().squeeze(1).tolist() == keys  # a repeat once
    second_block = torch.tensor([[[False, True], [False, False]]])  # query block 0 selects 1
    unpacked = ((check.single_key_bits(extra, second_block, 64, 32).unsqueeze(-1).int()
                 >> torch.arange(8)) & 1).view(2, 64).bool()
    assert unpacked[0].nonzero().squeeze(1).tolist() == [3, 17]  # 40 is in its selected block


def test_the_kernel_refuses_blocks_it_cannot_tile(check):
    q = torch.zeros(1, 24, 16)
    with pytest.raises(ValueError, match="power of two >= 16"):
        check.triton_unselected_max(q, q, torch.ones(1, 3, 3, dtype=torch.bool), 8)
    with pytest.raises(ValueError, match=r"graph must be \(heads=1, 1, 1\)"):
        check.triton_unselected_max(q, q, torch.ones(1, 3, 3, dtype=torch.bool), 32)
    with pytest.raises(ValueError, match="key_tile must be"):
        check.triton_unselected_max(q, q, torch.ones(1, 1, 1, dtype=torch.bool), 32,
                                    key_tile=48)
