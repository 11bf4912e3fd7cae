"""Top-k selective attention: the k highest scores of the full QKᵀ per query (an oracle)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsefinder.attention.masks import causal_mask
from sparsefinder.predictors.topk import TopK


def _qk(heads: int, n: int, m: int | None = None, d: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    return torch.randn(heads, n, d, generator=gen), torch.randn(heads, m, d, generator=gen)


def test_hand_checked():
    q = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    k = torch.tensor([[[3.0, 0.0], [2.0, 0.0], [0.0, 5.0]]])
    # scores: row 0 = [3, 2, 0], row 1 = [0, 0, 5]
    assert TopK(1).predict(q, k)[0].tolist() == [[True, False, False], [False, False, True]]
    # k=2: row 1 has a tie between keys 0 and 1 for the second place: the lower index wins.
    assert TopK(2).predict(q, k)[0].tolist() == [[True, True, False], [True, False, True]]
    assert TopK(3).predict(q, k).all()


def test_ties_keep_the_lowest_indices():
    q = torch.zeros(2, 3, 4)
    k = torch.zeros(2, 10, 4)  # every score is 0
    mask = TopK(4).predict(q, k)
    expected = torch.zeros(2, 3, 10, dtype=torch.bool)
    expected[..., :4] = True
    assert torch.equal(mask, expected)
    # Ties below strictly larger scores: key 7 is best, then the lowest tied keys.
    k[:, 7, 0] = 1.0
    q[..., 0] = 1.0
    mask = TopK(3).predict(q, k)
    assert mask[0, 0].nonzero().flatten().tolist() == [0, 1, 7]


def test_causal_candidates_are_the_past():
    q, k = _qk(3, 12)
    mask = TopK(4).predict(q, k, causal=True)
    assert not (mask & ~causal_mask(12, 12)).any()
    assert mask.sum(-1).tolist() == [[min(4, i + 1) for i in range(12)]] * 3
    # The causal top-k is the top-k over the past, not the full top-k with the future cut.
    scores = q @ k.transpose(1, 2)
    past = scores.masked_fill(~causal_mask(12, 12), float("-inf"))
    kth = past.topk(4, dim=-1).values[..., -1:]
    assert torch.equal(mask[:, 4:], (past >= kth)[:, 4:])


def test_k_at_least_keys_is_the_full_graph():
    q, k = _qk(2, 5, 7)
    assert TopK(7).predict(q, k).all()
    assert TopK(100).predict(q, k).all()
    assert torch.equal(TopK(100).predict(q, k, causal=True), causal_mask(5, 7).expand(2, -1, -1))


def test_deterministic():
    q, k = _qk(4, 64, d=32)
    assert torch.equal(TopK(8).predict(q, k), TopK(8).predict(q, k))


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(1, 20),
    m=st.integers(1, 20),
    k_=st.integers(1, 25),
    causal=st.booleans(),
    seed=st.integers(0, 10_000),
    levels=st.sampled_from([None, 3]),  # None: continuous scores; 3: many ties
)
def test_keeps_exactly_min_k_allowed_and_the_best(n, m, k_, causal, seed, levels):
    q, k = _qk(2, n, m, d=4, seed=seed)
    if levels is not None:  # integer-valued vectors make tied scores common
        q, k = q.round().clamp(-1, 1), k.round().clamp(-1, 1)
    mask = TopK(k_).predict(q, k, causal=causal)
    allowed = causal_mask(n, m) if causal else torch.ones(n, m, dtype=torch.bool)
    assert not (mask & ~allowed).any()
    assert torch.equal(mask.sum(-1), allowed.sum(-1).clamp(max=k_).expand(2, -1))
    scores = q @ k.transpose(1, 2)
    kept_min = scores.masked_fill(~mask, float("inf")).amin(-1)
    dropped_max = scores.masked_fill(mask | ~allowed, float("-inf")).amax(-1)
    assert (kept_min >= dropped_max).all()
    # Among keys tied with the threshold, no dropped key precedes a kept one.
    for h in range(2):
        for i in range(n):
            tied = (scores[h, i] == kept_min[h, i]) & allowed[i]
            kept_tied = (tied & mask[h, i]).nonzero().flatten().tolist()
            dropped_tied = (tied & ~mask[h, i]).nonzero().flatten().tolist()
            if kept_tied and dropped_tied:
                assert max(kept_tied) < min(dropped_tied)


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "3"])
def test_bad_k(k):
    with pytest.raises(ValueError, match="k must be"):
        TopK(k)


def test_empty_sides_heads_and_device():
    """The meta device stands in for a GPU; shapes hold for empty sides and many heads."""
    assert TopK(2).predict(torch.zeros(3, 0, 4), torch.zeros(3, 5, 4)).shape == (3, 0, 5)
    out = TopK(2).predict(torch.zeros(3, 5, 4), torch.zeros(3, 0, 4))
    assert out.shape == (3, 5, 0) and out.dtype == torch.bool
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, 4, 2, generator=gen), torch.randn(3, 6, 2, generator=gen)
    assert TopK(2).predict(q, k).sum(-1).eq(2).all()
    meta = TopK(2).predict(torch.zeros(3, 0, 4, device="meta"), torch.zeros(3, 5, 4,
                                                                           device="meta"))
    assert meta.device.type == "meta"


def test_ties_at_the_kth_score_keep_exactly_k_lowest_positions():
    q = torch.ones(1, 3, 1)
    k = torch.tensor([[[2.0], [1.0], [1.0], [1.0], [0.0]]])
    mask = TopK(3).predict(q, k)  # key 0, then the first two of the three tied keys
    assert mask[0].tolist() == [[True, True, True, False, False]] * 3
    exact = TopK(4).predict(q, k)  # all three tied keys fit exactly
    assert exact[0, 0].tolist() == [True, True, True, True, False]
    causal = TopK(2).predict(q, k[:, :3], causal=True)
    assert causal[0].tolist() == [[True, False, False], [True, True, False],
                                  [True, True, False]]


def test_half_precision_scores_in_float32():
    gen = torch.Generator().manual_seed(1)
    q = (torch.randn(2, 20, 8, generator=gen) * 10).to(torch.bfloat16)
    k = (torch.randn(2, 30, 8, generator=gen) * 10).to(torch.bfloat16)
    assert torch.equal(TopK(5).predict(q, k), TopK(5).predict(q.float(), k.float()))


def test_a_local_layer_chooses_its_k_keys_inside_the_window():
    """Without the window the k best keys of a long row lie mostly outside it, and the cut
    afterwards leaves far fewer than k; inside the window every row keeps min(k, window)."""
    from sparsefinder.attention.masks import layer_allowed

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 40, 8, generator=g), torch.randn(2, 40, 8, generator=g)
    allowed = layer_allowed(40, 40, causal=True, sliding_window=6)
    inside = TopK(4).predict(q, k, causal=True, sliding_window=6)
    assert not (inside & ~allowed).any()
    assert torch.equal(inside.sum(-1), allowed.sum(-1).clamp(max=4).expand(2, -1))
    cut_after = TopK(4).predict(q, k, causal=True) & allowed
    assert cut_after.sum() < inside.sum()
    scores = (q @ k.transpose(-1, -2)).masked_fill(~allowed, float("-inf"))
    best = scores.topk(4, dim=-1).indices[:, 10:]  # rows with a full window
    assert inside[:, 10:].gather(-1, best).all()
