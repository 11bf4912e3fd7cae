"""sparsefinder.attention.masks: one causal/window convention for every layer of the library."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.attention.masks import (
    allowed_per_row,
    apply_causal,
    causal_mask,
    hidden_offsets,
    layer_allowed,
    n_allowed_pairs,
    shared_causal_mask,
    window_band,
)


@pytest.mark.parametrize(("n", "m"), [(1, 1), (4, 4), (3, 5), (5, 3), (0, 4), (4, 0)])
def test_causal_mask_counts_and_rows_agree(n, m):
    mask = causal_mask(n, m)
    assert mask.shape == (n, m) and mask.dtype == torch.bool
    assert torch.equal(mask.sum(-1), allowed_per_row(n, m, causal=True))
    assert n_allowed_pairs(n, m, causal=True) == int(mask.sum())
    assert n_allowed_pairs(n, m) == n * m
    # query i sees key j iff j <= i + (m - n)
    for i in range(n):
        for j in range(m):
            assert bool(mask[i, j]) == (j <= i + (m - n))


def test_square_causal_has_n_times_n_plus_one_over_two_pairs():
    assert n_allowed_pairs(6, 6, causal=True) == 21
    assert torch.equal(causal_mask(3, 3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool())


def test_fresh_masks_can_be_modified_without_touching_the_cache():
    mask = causal_mask(4, 4)
    mask.fill_(False)
    assert shared_causal_mask(4, 4).sum() == 10
    band = window_band(4, 4, 3)
    band.fill_(False)
    assert window_band(4, 4, 3).sum() == 10


def test_apply_causal_cuts_only_the_future():
    full = torch.ones(2, 3, 3, dtype=torch.bool)
    assert apply_causal(full, False) is full
    cut = apply_causal(full, True)
    assert torch.equal(cut, causal_mask(3, 3).expand(2, -1, -1))
    assert full.all()  # input untouched


@pytest.mark.parametrize(("size", "expected_per_row"), [(0, [0, 0, 0, 0, 0]),
                                                      (1, [1, 1, 1, 1, 1]),
                                                      (2, [2, 3, 3, 3, 2]),
                                                      (3, [2, 3, 3, 3, 2]),
                                                      (5, [3, 4, 5, 4, 3])])
def test_window_band_sizes(size, expected_per_row):
    band = window_band(5, 5, size)
    assert band.sum(-1).tolist() == expected_per_row
    assert torch.equal(band, band.T)  # symmetric for n == m


def test_window_band_aligns_queries_with_the_last_keys():
    band = window_band(2, 4, 1)  # query i aligned with key i + 2
    assert band.nonzero().tolist() == [[0, 2], [1, 3]]


def test_allowed_per_row_without_causality_is_m_everywhere():
    out = allowed_per_row(3, 5, causal=False)
    assert out.dtype == torch.int64 and out.tolist() == [5, 5, 5]
    assert allowed_per_row(0, 5, causal=False).shape == (0,)
    causal = allowed_per_row(3, 5, causal=True)
    assert causal.dtype == torch.int64 and causal.tolist() == [3, 4, 5]
    assert allowed_per_row(5, 3, causal=True).tolist() == [0, 0, 1, 2, 3]


def test_masks_follow_the_requested_device():
    """The meta device stands in for a GPU: every mask is built where it is asked for."""
    for mask in (causal_mask(3, 4, "meta"), shared_causal_mask(3, 4, torch.device("meta")),
                 window_band(3, 4, 3, "meta"),
                 apply_causal(torch.ones(2, 3, 3, dtype=torch.bool, device="meta"), True)):
        assert mask.device.type == "meta" and mask.dtype == torch.bool
    assert causal_mask(2, 2).device.type == "cpu"


def test_window_band_of_negative_size_is_empty_and_cached_bands_are_shared():
    assert not window_band(3, 3, -2).any()
    assert shared_causal_mask(5, 5) is shared_causal_mask(5, 5)
    assert causal_mask(5, 5) is not shared_causal_mask(5, 5)


def test_sliding_window_mask_keeps_the_query_and_its_window_minus_one_predecessors():
    from sparsefinder.attention.masks import sliding_window_mask

    mask = sliding_window_mask(6, 6, 3)
    expected = torch.tensor([[i - 2 <= j <= i for j in range(6)] for i in range(6)])
    assert torch.equal(mask, expected)
    # with a key prefix (m > n) the window is aligned like the causal mask
    assert torch.equal(sliding_window_mask(2, 5, 2),
                       torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]], dtype=torch.bool))
    assert layer_allowed(4, 4, causal=False) is None
    assert torch.equal(layer_allowed(4, 4, causal=True), torch.ones(4, 4, dtype=torch.bool).tril())
    assert torch.equal(layer_allowed(6, 6, causal=True, sliding_window=3), expected)
    with pytest.raises(ValueError, match="sliding window must be an integer >= 1"):
        sliding_window_mask(4, 4, 0)


@pytest.mark.parametrize(("n", "m"), [(7, 7), (3, 7), (7, 3), (1, 5)])
@pytest.mark.parametrize("window", [1, 2, 3, 9])
@pytest.mark.parametrize("causal", [True, False])
def test_sliding_windows_causal_and_bidirectional(n, m, window, causal):
    """Causal: ``0 <= i + (m - n) - j < W``; bidirectional: ``|i + (m - n) - j| < W`` — and
    the contiguous runs of allowed_key_range are exactly those masks' rows."""
    from sparsefinder.attention.masks import allowed_key_range, layer_allowed

    mask = layer_allowed(n, m, causal=causal, sliding_window=window)
    for i in range(n):
        for j in range(m):
            offset = i + (m - n) - j
            expected = 0 <= offset < window if causal else abs(offset) < window
            assert bool(mask[i, j]) == expected
    first, count = allowed_key_range(n, m, causal=causal, sliding_window=window)
    for i in range(n):
        keys = mask[i].nonzero()[:, 0].tolist()
        assert count[i] == len(keys)
        assert keys == list(range(int(first[i]), int(first[i] + count[i])))


def test_modernbert_local_window_is_plus_minus_half_of_local_attention():
    """ModernBERT with local_attention=128 hands W = 65 to the attention function: ±64."""
    from sparsefinder.attention.masks import layer_allowed

    mask = layer_allowed(300, 300, causal=False, sliding_window=65)
    assert mask[150].nonzero()[:, 0].tolist() == list(range(86, 215))  # 150 ± 64
    assert int(mask[0].sum()) == 65 and torch.equal(mask, mask.T)


@pytest.mark.parametrize(("n", "m"), [(4, 4), (2, 5)])
def test_allowed_key_range_without_a_window_is_every_key_or_the_past(n, m):
    from sparsefinder.attention.masks import allowed_key_range

    first, count = allowed_key_range(n, m, causal=False)
    assert first.tolist() == [0] * n and count.tolist() == [m] * n
    first, count = allowed_key_range(n, m, causal=True)
    assert first.tolist() == [0] * n
    assert count.tolist() == [i + (m - n) + 1 for i in range(n)]
    assert first.dtype == count.dtype == torch.int64


def test_window_masks_and_ranges_follow_the_requested_device():
    from sparsefinder.attention.masks import allowed_key_range, layer_allowed, sliding_window_mask

    built = [sliding_window_mask(3, 4, 2, "meta"), layer_allowed(3, 4, causal=True, device="meta"),
             layer_allowed(3, 4, causal=False, sliding_window=2, device="meta"),
             allowed_per_row(3, 4, causal=True, device="meta"),
             allowed_per_row(3, 4, causal=False, device="meta"),
             *allowed_key_range(3, 4, causal=True, device="meta"),
             *allowed_key_range(3, 4, causal=False, sliding_window=2, device="meta")]
    assert all(t.device.type == "meta" for t in built)


@pytest.mark.parametrize("bad", [2.5, "3", None, True, -1])
def test_a_sliding_window_that_is_not_a_positive_integer_is_refused(bad):
    from sparsefinder.attention.masks import sliding_window_mask

    with pytest.raises(ValueError, match=r"sliding window must be an integer >= 1, got"):
        sliding_window_mask(4, 4, bad)


@pytest.mark.parametrize("window", [None, 1, 3, 40])
@pytest.mark.parametrize("causal", [False, True])
def test_allowed_pairs_count_the_layers_mask_windows_included(causal, window):
    for n in (1, 5, 17):
        mask = layer_allowed(n, n, causal=causal, sliding_window=window)
        assert n_allowed_pairs(n, n, causal=causal, sliding_window=window) == (
            n * n if mask is None else int(mask.sum()))


@pytest.mark.parametrize(("n", "m", "causal", "window"),
                         [(7, 7, True, None), (5, 9, True, 3), (6, 6, False, 2), (4, 8, False, 3)])
def test_hidden_offsets_hide_what_the_layer_mask_disallows(n, m, causal, window):
    ahead = torch.arange(m)[None, :] - (torch.arange(n)[:, None] + (m - n))  # j − (i + m − n)
    hidden = hidden_offsets(ahead, causal=causal, sliding_window=window)
    assert torch.equal(~hidden, layer_allowed(n, m, causal=causal, sliding_window=window))
