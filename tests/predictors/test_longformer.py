"""Longformer: window + random global tokens, seeded, the same tokens in every head."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsefinder.attention.masks import causal_mask
from sparsefinder.predictors.longformer import Longformer
from sparsefinder.predictors.window import Window


def _qk(heads: int, n: int, m: int | None = None, r: int = 4):
    gen = torch.Generator().manual_seed(0)
    m = n if m is None else m
    return torch.randn(heads, n, r, generator=gen), torch.randn(heads, m, r, generator=gen)


def _reference(n: int, m: int, window: int, tokens: list[int]) -> torch.Tensor:
    """The pattern by its definition, one pair at a time."""
    out = torch.zeros(n, m, dtype=torch.bool)
    for i in range(n):
        for j in range(m):
            a = i + (m - n)  # query i's own key
            in_window = window > 0 and abs(a - j) <= window // 2
            out[i, j] = in_window or j in tokens or a in tokens
    return out


def test_no_global_tokens_is_the_window():
    q, k = _qk(2, 5)
    expected = torch.tensor(
        [
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [0, 1, 1, 1, 0],
            [0, 0, 1, 1, 1],
            [0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    mask = Longformer(window=3, n_global=0).predict(q, k)
    assert mask.dtype == torch.bool and mask.shape == (2, 5, 5)
    assert torch.equal(mask, expected.expand(2, -1, -1))


def test_global_rows_and_columns_fully_on():
    q, k = _qk(3, 16)
    model = Longformer(window=1, n_global=3, seed=4)
    tokens = model.global_tokens(16)
    assert tokens.tolist() == sorted(set(tokens.tolist())) and len(tokens) == 3
    mask = model.predict(q, k)
    assert mask[:, tokens, :].all() and mask[:, :, tokens].all()
    assert torch.equal(mask[0], _reference(16, 16, 1, tokens.tolist()))
    # Every other row is the diagonal plus the global columns.
    others = [i for i in range(16) if i not in tokens.tolist()]
    assert (mask[:, others, :].sum(-1) == 1 + 3).all()


def test_same_global_tokens_in_every_head():
    q, k = _qk(4, 32)
    mask = Longformer(window=3, n_global=5).predict(q, k)
    assert all(torch.equal(mask[0], mask[h]) for h in range(4))
    mask[0, 0, 0] = not mask[0, 0, 0]  # heads are real copies
    assert not torch.equal(mask[0], mask[1])


def test_window_contained():
    q, k = _qk(2, 40)
    for window in (0, 1, 3, 11):
        lf = Longformer(window=window, n_global=4, seed=1).predict(q, k)
        win = Window(window).predict(q, k)
        assert (lf | win).equal(lf)


def test_deterministic_under_seed_and_seeds_differ():
    q, k = _qk(2, 64)
    a = Longformer(window=3, n_global=4, seed=7).predict(q, k)
    b = Longformer(window=3, n_global=4, seed=7).predict(q, k)
    assert torch.equal(a, b)
    tokens = {tuple(Longformer(3, 4, seed=s).global_tokens(64).tolist()) for s in range(5)}
    assert len(tokens) > 1
    c = Longformer(window=3, n_global=4, seed=8).predict(q, k)
    assert not torch.equal(a, c)


def test_more_global_tokens_than_tokens_gives_full_graph():
    q, k = _qk(2, 6)
    assert Longformer(window=0, n_global=20).predict(q, k).all()


def test_only_shapes_matter():
    q, k = _qk(2, 12)
    model = Longformer(window=3, n_global=2)
    assert torch.equal(model.predict(q, k), model.predict(q * 0 + 5, -k))


def test_causal_masks_the_future():
    q, k = _qk(2, 20)
    model = Longformer(window=5, n_global=4)
    full = model.predict(q, k)
    causal = model.predict(q, k, causal=True)
    assert torch.equal(causal, full & causal_mask(20, 20))


def test_keys_with_prefix_align_queries_with_last_keys():
    q, k = _qk(1, 4, 7)
    model = Longformer(window=1, n_global=2, seed=3)
    tokens = model.global_tokens(7).tolist()
    assert torch.equal(model.predict(q, k)[0], _reference(4, 7, 1, tokens))


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 12),
    extra=st.integers(0, 3),
    window=st.integers(0, 7),
    n_global=st.integers(0, 15),
    seed=st.integers(0, 2**31),
)
def test_matches_definition(n, extra, window, n_global, seed):
    m = n + extra
    q, k = _qk(2, n, m)
    model = Longformer(window=window, n_global=n_global, seed=seed)
    tokens = model.global_tokens(m).tolist()
    assert len(tokens) == min(n_global, m) == len(set(tokens))
    assert all(0 <= t < m for t in tokens)
    mask = model.predict(q, k)
    assert torch.equal(mask[1], _reference(n, m, window, tokens))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"window": 3, "n_global": -1}, "n_global"),
        ({"window": -1, "n_global": 4}, "window"),
        ({"window": 3, "n_global": 2.5}, "n_global"),
        ({"window": 3, "n_global": True}, "n_global"),
        ({"window": 3, "n_global": 4, "seed": -1}, "seed"),
    ],
)
def test_bad_hyperparameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Longformer(**kwargs)


def test_bad_shapes():
    with pytest.raises(ValueError, match="heads"):
        Longformer(3, 2).predict(torch.zeros(5, 4), torch.zeros(5, 4))


def test_messages_name_the_parameter():
    for kwargs, name in (({"window": -1, "n_global": 1}, "window"),
                         ({"window": 1, "n_global": -1}, "n_global"),
                         ({"window": 1, "n_global": 1, "seed": -1}, "seed")):
        with pytest.raises(ValueError, match=rf"^{name} must be an integer >= 0, got -1$"):
            Longformer(**kwargs)
