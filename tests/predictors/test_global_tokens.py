"""GlobalTokens: rows and columns of the first/last real token are kept (paper §4.7)."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.predictors import GlobalTokens, Predictor

Q = K = torch.randn(2, 4, 3)


def test_is_a_predictor_with_readable_repr() -> None:
    assert isinstance(GlobalTokens(), Predictor)
    assert repr(GlobalTokens(last=False)) == "GlobalTokens(first=True, last=False)"


def test_first_and_last() -> None:
    expected = torch.tensor(
        [
            [True, True, True, True],
            [True, False, False, True],
            [True, False, False, True],
            [True, True, True, True],
        ]
    )
    assert torch.equal(GlobalTokens().predict(Q, K), expected.expand(2, 4, 4))


def test_first_only_and_last_only() -> None:
    first = GlobalTokens(first=True, last=False).predict(Q, K)[0]
    assert first.nonzero().tolist() == [[0, 0], [0, 1], [0, 2], [0, 3], [1, 0], [2, 0], [3, 0]]
    last = GlobalTokens(first=False, last=True).predict(Q, K)[1]
    assert last.nonzero().tolist() == [[0, 3], [1, 3], [2, 3], [3, 0], [3, 1], [3, 2], [3, 3]]
    assert not GlobalTokens(first=False, last=False).predict(Q, K).any()


def test_more_keys_than_queries_uses_the_last_key() -> None:
    mask = GlobalTokens(first=False).predict(torch.zeros(1, 2, 3), torch.zeros(1, 5, 3))
    assert mask.shape == (1, 2, 5)
    assert mask[0, :, 4].all() and mask[0, 1].all()
    assert not mask[0, 0, :4].any()


def test_causal_has_no_future_edges() -> None:
    mask = GlobalTokens().predict(Q, K, causal=True)
    assert not mask.triu(diagonal=1).any()
    assert mask[:, 0].tolist() == [[True, False, False, False]] * 2  # first query: itself
    assert mask[:, 3].all()  # last query sees the whole past
    assert mask[:, :, 0].all()  # everybody sees the first key


def test_single_token() -> None:
    assert GlobalTokens().predict(torch.zeros(3, 1, 2), torch.zeros(3, 1, 2)).all()


def test_heads_are_independent_copies() -> None:
    mask = GlobalTokens().predict(Q, K)
    mask[0] = False
    assert mask[1].any()


def test_rejects_non_bool_flags() -> None:
    with pytest.raises(ValueError, match="first must be a bool"):
        GlobalTokens(first=1)


def test_device_and_empty_sides():
    """The meta device stands in for a GPU; a side without tokens gives an empty mask."""
    q = torch.zeros(2, 4, 3, device="meta")
    assert GlobalTokens().predict(q, q).device.type == "meta"
    assert GlobalTokens().shared_pattern(0, 5).shape == (0, 5)
    assert GlobalTokens().shared_pattern(5, 0).shape == (5, 0)
    assert GlobalTokens().shared_pattern(3, 3, "meta").device.type == "meta"
