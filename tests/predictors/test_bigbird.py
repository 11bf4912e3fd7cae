"""BigBird: window + first/last global + n_random random keys per head and query."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsefinder.attention.masks import causal_mask
from sparsefinder.predictors.bigbird import BigBird, sample_distinct
from sparsefinder.predictors.window import Window


def _qk(heads: int, n: int, m: int | None = None, r: int = 4):
    gen = torch.Generator().manual_seed(0)
    m = n if m is None else m
    return torch.randn(heads, n, r, generator=gen), torch.randn(heads, m, r, generator=gen)


def _base(n: int, m: int, window: int) -> torch.Tensor:
    """Window + first/last token rows and columns, by definition."""
    out = torch.zeros(n, m, dtype=torch.bool)
    for i in range(n):
        for j in range(m):
            a = i + (m - n)
            in_window = window > 0 and abs(a - j) <= window // 2
            out[i, j] = in_window or i in (0, n - 1) or j in (0, m - 1)
    return out


def test_no_random_keys_hand_checked():
    q, k = _qk(2, 5)
    expected = torch.tensor(
        [
            [1, 1, 1, 1, 1],
            [1, 1, 0, 0, 1],
            [1, 0, 1, 0, 1],
            [1, 0, 0, 1, 1],
            [1, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    mask = BigBird(window=1, n_random=0).predict(q, k)
    assert torch.equal(mask, expected.expand(2, -1, -1))


def test_window_and_global_contained_and_at_most_n_random_more():
    q, k = _qk(3, 48)
    model = BigBird(window=5, n_random=4, seed=2)
    mask = model.predict(q, k)
    base = _base(48, 48, 5)
    assert (mask | base).equal(mask)
    assert (mask | Window(5).predict(q, k)).equal(mask)
    extra = (mask & ~base).sum(-1)
    assert extra.max() <= 4
    # Rows of the global first/last query are already full; others mostly get all 4.
    assert (extra[:, 1:-1] == 4).float().mean() > 0.3  # ≈ C(41,4)/C(48,4) = 0.52


def test_random_keys_exact_count_and_in_mask():
    q, k = _qk(3, 40)
    model = BigBird(window=3, n_random=6, seed=5)
    keys = model.random_keys(3, 40, 40)
    assert keys.shape == (3, 40, 6)
    assert ((keys >= 0) & (keys < 40)).all()
    for row in keys.reshape(-1, 6).tolist():
        assert len(set(row)) == 6  # distinct: exactly n_random random keys
    mask = model.predict(q, k)
    assert mask.gather(2, keys).all()
    rebuilt = _base(40, 40, 3).expand(3, -1, -1).clone()
    rebuilt.scatter_(2, keys, True)
    assert torch.equal(mask, rebuilt)


def test_random_keys_differ_between_heads_and_queries():
    model = BigBird(window=3, n_random=4)
    keys = model.random_keys(2, 64, 64)
    assert not torch.equal(keys[0], keys[1])
    assert len({tuple(sorted(r)) for r in keys[0].tolist()}) > 32


def test_deterministic_under_seed_and_seeds_differ():
    q, k = _qk(4, 64)
    a = BigBird(window=3, n_random=2, seed=11).predict(q, k)
    assert torch.equal(a, BigBird(window=3, n_random=2, seed=11).predict(q, k))
    assert not torch.equal(a, BigBird(window=3, n_random=2, seed=12).predict(q, k))


def test_causal_draws_from_the_past_only():
    q, k = _qk(2, 30)
    model = BigBird(window=3, n_random=5, seed=1)
    keys = model.random_keys(2, 30, 30, causal=True)
    for i in range(30):
        row = keys[:, i]
        valid = row[row >= 0].view(2, -1)
        assert valid.shape[1] == min(5, i + 1)  # min(n_random, allowed) per row
        assert (valid <= i).all()
        assert all(len(set(r)) == len(r) for r in valid.tolist())
    mask = model.predict(q, k, causal=True)
    assert not (mask & ~causal_mask(30, 30)).any()
    assert mask.gather(2, keys.clamp(min=0)).all()


def test_causal_with_fewer_keys_than_queries_stays_causal():
    q, k = _qk(2, 6, 4)  # m < n: the first two queries see no key at all
    mask = BigBird(window=1, n_random=3).predict(q, k, causal=True)
    assert not (mask & ~causal_mask(6, 4)).any()
    assert not mask[:, :2].any()


def test_n_random_at_least_sequence_gives_full_graph():
    q, k = _qk(2, 7)
    assert BigBird(window=0, n_random=7).predict(q, k).all()
    assert BigBird(window=0, n_random=50).predict(q, k).all()


def test_sample_distinct_is_uniform():
    gen = torch.Generator().manual_seed(0)
    draws = sample_distinct(gen, 200, torch.full((50,), 10), 3)  # 10,000 rows of 3 of 10
    counts = torch.bincount(draws.flatten(), minlength=10).double()
    share = counts / counts.sum()
    assert (share - 0.1).abs().max() < 0.01
    # Pairs too: "0 and 1 both drawn" has probability C(8,1)/C(10,3) = 1/15.
    both = ((draws == 0).any(-1) & (draws == 1).any(-1)).double().mean()
    assert abs(both.item() - 1 / 15) < 0.01


@settings(max_examples=60, deadline=None)
@given(
    populations=st.lists(st.integers(0, 20), min_size=1, max_size=8),
    size=st.integers(0, 12),
    heads=st.integers(1, 3),
    seed=st.integers(0, 2**31),
)
def test_sample_distinct_properties(populations, size, heads, seed):
    pop = torch.tensor(populations)
    out = sample_distinct(torch.Generator().manual_seed(seed), heads, pop, size)
    assert out.shape == (heads, len(populations), size)
    for h in range(heads):
        for i, n in enumerate(populations):
            row = [x for x in out[h, i].tolist() if x >= 0]
            assert len(row) == min(size, n) == len(set(row))
            assert all(0 <= x < n for x in row)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 16),
    window=st.integers(0, 5),
    n_random=st.integers(0, 6),
    seed=st.integers(0, 2**31),
    causal=st.booleans(),
)
def test_rows_have_at_most_n_random_beyond_window_and_global(n, window, n_random, seed, causal):
    q, k = _qk(2, n)
    mask = BigBird(window=window, n_random=n_random, seed=seed).predict(q, k, causal=causal)
    base = _base(n, n, window)
    if causal:
        base &= causal_mask(n, n)
        assert not (mask & ~causal_mask(n, n)).any()
    assert (mask | base).equal(mask)
    assert (mask & ~base).sum(-1).max() <= n_random


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"window": 3, "n_random": -1}, "n_random"),
        ({"window": -2, "n_random": 2}, "window"),
        ({"window": 3, "n_random": 1.0}, "n_random"),
        ({"window": 3, "n_random": 2, "seed": "a"}, "seed"),
    ],
)
def test_bad_hyperparameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        BigBird(**kwargs)


def test_messages_name_the_parameter():
    for kwargs, name in (({"window": -1, "n_random": 1}, "window"),
                         ({"window": 1, "n_random": -1}, "n_random"),
                         ({"window": 1, "n_random": 1, "seed": -1}, "seed")):
        with pytest.raises(ValueError, match=rf"^{name} must be an integer >= 0, got -1$"):
            BigBird(**kwargs)


def test_causal_population_with_a_key_prefix_and_with_fewer_keys():
    """Query i of n sees keys 0 .. i + (m - n): random keys come from there only."""
    bb = BigBird(window=0, n_random=8, seed=1)
    keys = bb.random_keys(2, 3, 6, causal=True)  # allowed: 4, 5, 6 keys
    for i, allowed in enumerate((4, 5, 6)):
        row = keys[:, i]
        assert ((row >= 0).sum(-1) == allowed).all()  # fewer candidates than n_random
        assert (row < allowed).all()
    fewer = bb.random_keys(1, 5, 3, causal=True)  # allowed: 0, 0, 1, 2, 3 keys
    assert ((fewer >= 0).sum(-1) == torch.tensor([[0, 0, 1, 2, 3]])).all()
    plain = bb.random_keys(1, 2, 3, causal=False)
    assert ((plain >= 0).sum(-1) == 3).all()
    mask = bb.predict(torch.zeros(1, 5, 2), torch.zeros(1, 3, 2), causal=True)
    assert mask[0, :2].sum() == 0 and torch.equal(mask[0], causal_mask(5, 3))


def test_empty_inputs_and_no_random_keys():
    bb = BigBird(window=1, n_random=2)
    assert bb.predict(torch.zeros(2, 0, 3), torch.zeros(2, 4, 3)).shape == (2, 0, 4)
    assert bb.predict(torch.zeros(2, 4, 3), torch.zeros(2, 0, 3)).shape == (2, 4, 0)
    none = BigBird(window=1, n_random=0).predict(torch.zeros(1, 6, 2), torch.zeros(1, 6, 2))
    expected = Window(1).predict(torch.zeros(1, 6, 2), torch.zeros(1, 6, 2))
    expected[:, [0, -1], :] = True
    expected[:, :, [0, -1]] = True
    assert torch.equal(none, expected)
    assert sample_distinct(torch.Generator(), 2, torch.tensor([3, 3]), 0).shape == (2, 2, 0)
    assert sample_distinct(torch.Generator(), 2, torch.tensor([], dtype=torch.long),
                           2).shape == (2, 0, 2)
