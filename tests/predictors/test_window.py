"""Window(size): edge iff |i - j| <= size // 2 (paper §4.7)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsefinder.predictors import Predictor, Window


def reference(heads: int, n: int, m: int, size: int) -> torch.Tensor:
    i = torch.arange(n)[:, None] + (m - n)
    j = torch.arange(m)[None, :]
    band = ((i - j).abs() <= size // 2) & (size > 0)
    return band.expand(heads, n, m)


def test_is_a_predictor_with_readable_repr() -> None:
    assert isinstance(Window(3), Predictor)
    assert repr(Window(3)) == "Window(size=3)"


def test_hand_computed_sizes() -> None:
    q = k = torch.randn(2, 4, 3)
    assert not Window(0).predict(q, k).any()
    assert torch.equal(Window(1).predict(q, k), torch.eye(4, dtype=torch.bool).expand(2, 4, 4))
    expected = torch.tensor(
        [
            [True, True, False, False],
            [True, True, True, False],
            [False, True, True, True],
            [False, False, True, True],
        ]
    )
    assert torch.equal(Window(3).predict(q, k), expected.expand(2, 4, 4))


def test_keys_with_a_prefix_align_query_i_with_key_i_plus_offset() -> None:
    mask = Window(1).predict(torch.zeros(1, 2, 3), torch.zeros(1, 4, 3))
    assert mask[0].nonzero().tolist() == [[0, 2], [1, 3]]


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 20), m=st.integers(1, 20), size=st.integers(0, 45))
def test_matches_reference(n, m, size) -> None:
    mask = Window(size).predict(torch.zeros(2, n, 1), torch.zeros(2, m, 1))
    assert torch.equal(mask, reference(2, n, m, size))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 20), a=st.integers(0, 30), b=st.integers(0, 30))
def test_larger_window_never_removes_edges(n, a, b) -> None:
    small, large = sorted((a, b))
    q = k = torch.zeros(1, n, 2)
    assert not (Window(small).predict(q, k) & ~Window(large).predict(q, k)).any()


def test_ignores_query_and_key_values() -> None:
    q, k = torch.randn(3, 6, 4), torch.randn(3, 6, 4)
    assert torch.equal(Window(5).predict(q, k), Window(5).predict(q * 100, -k))


def test_causal_keeps_only_the_past_half() -> None:
    q = k = torch.zeros(1, 5, 2)
    expected = torch.ones(5, 5).tril().bool() & ~torch.ones(5, 5).tril(-2).bool()
    assert torch.equal(Window(3).predict(q, k, causal=True)[0], expected)


def test_heads_are_independent_copies() -> None:
    mask = Window(3).predict(torch.zeros(2, 4, 1), torch.zeros(2, 4, 1))
    mask[0] = False
    assert mask[1].any()


@pytest.mark.parametrize("size", [-1, 1.5, None])
def test_rejects_bad_size(size) -> None:
    with pytest.raises(ValueError, match="size must be an integer >= 0"):
        Window(size)


def test_the_band_is_built_on_the_inputs_device():
    """The meta device stands in for a GPU."""
    q = torch.zeros(2, 4, 3, device="meta")
    assert Window(3).predict(q, q).device.type == "meta"
    assert Window(3).shared_pattern(4, 4, "meta").device.type == "meta"
