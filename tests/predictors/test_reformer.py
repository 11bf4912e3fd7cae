"""Reformer: angular LSH with a shared random rotation for queries and keys."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsefinder.attention.masks import causal_mask
from sparsefinder.predictors.reformer import Reformer, lsh_buckets

# Cross-check against reformer-pytorch 1.4.4, LSHAttention(n_hashes=2,
# random_rotations_per_head=True).hash_vectors(n_buckets=4, vecs) with torch.randn patched to
# return ROT (run once in a throwaway venv; reformer_pytorch is not a project dependency).
# hash_vectors returns bucket + round * n_buckets, rounds concatenated: (batch, n_hashes * t).
VECS = [  # (batch = heads 2, t 6, f 3)
    [
        [-1.2, 0.6, -1.5],
        [-1.3, -0.5, 0.1],
        [0.3, 0.3, -0.5],
        [1.1, 2.5, 0.3],
        [-0.5, -1.1, 1.5],
        [-1.6, -1.5, -1.1],
    ],
    [
        [0.4, 0.4, -0.5],
        [-0.6, -2.1, 0.3],
        [-2.3, -0.2, -2.6],
        [-1.8, 0.7, 0.4],
        [-0.3, -0.8, -0.6],
        [1.2, 0.3, 0.7],
    ],
]
ROT = [  # (batch, f 3, n_hashes 2, n_buckets / 2 = 2)
    [[[-1.8, 0.7], [-0.6, -0.2]], [[-0.7, -1.2], [0.8, -0.8]], [[2.2, 0.1], [-0.1, -1.8]]],
    [[[-0.2, -0.7], [-0.3, -0.7]], [[-0.5, -0.9], [0.3, 0.3]], [[0.4, 0.7], [-0.9, 0.3]]],
]
BUCKETS = [[3, 0, 2, 2, 0, 0, 5, 5, 5, 7, 7, 5], [3, 1, 2, 1, 1, 3, 4, 6, 4, 5, 4, 6]]


def _qk(heads: int, n: int, m: int | None = None, r: int = 4, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    return torch.randn(heads, n, r, generator=gen), torch.randn(heads, m, r, generator=gen)


def test_buckets_match_reformer_pytorch():
    vecs, rot = torch.tensor(VECS), torch.tensor(ROT)
    ours = lsh_buckets(vecs, rot, 4)  # (heads, n_hashes, t)
    offsets = (torch.arange(2) * 4)[None, :, None]
    assert (ours + offsets).reshape(2, -1).tolist() == BUCKETS
    # The L2 normalisation the predictor applies first changes no bucket.
    normed = torch.nn.functional.normalize(vecs, dim=-1)
    assert torch.equal(lsh_buckets(normed, rot, 4), ours)


def test_edges_are_shared_buckets_in_any_round():
    q, k = _qk(3, 20, 25)
    model = Reformer(n_buckets=4, n_hashes=3, seed=1)
    bq, bk = model.buckets(q, k)
    assert bq.shape == (3, 3, 20) and bk.shape == (3, 3, 25)
    expected = (bq[..., :, None] == bk[..., None, :]).any(1)
    assert torch.equal(model.predict(q, k), expected)


def test_identical_vectors_share_a_bucket():
    q, _ = _qk(4, 30)
    q[:, 5] = q[:, 3]  # a repeated query
    mask = Reformer(n_buckets=12, n_hashes=1, seed=3).predict(q, q.clone())
    assert mask.diagonal(dim1=-2, dim2=-1).all()
    assert mask[:, 5, 3].all() and mask[:, 3, 5].all()
    assert torch.equal(mask, mask.transpose(1, 2))  # shared bucket space: symmetric


def test_scale_invariant():
    q, k = _qk(2, 16)
    model = Reformer(n_buckets=6)
    assert torch.equal(model.predict(q, k), model.predict(q * 3.0, k * 0.25))


def test_one_bucket_is_the_full_graph():
    q, k = _qk(2, 9)
    assert Reformer(n_buckets=1).predict(q, k).all()


def test_hand_checked_two_buckets():
    # B = 2, r = 1, a positive rotation: bucket 0 for x > 0 and 1 for x < 0 (sign hashing).
    model = Reformer(n_buckets=2, seed=0)
    rot = model.rotations(1, 1)
    sign = 1.0 if rot.item() > 0 else -1.0
    q = torch.tensor([[[1.0], [-2.0], [0.5]]]) * sign
    k = torch.tensor([[[3.0], [-1.0]]]) * sign
    expected = torch.tensor([[[1, 0], [0, 1], [1, 0]]], dtype=torch.bool)
    assert torch.equal(model.predict(q, k), expected)


@settings(max_examples=40, deadline=None)
@given(
    n_buckets=st.integers(1, 13),
    n_hashes=st.integers(1, 3),
    seed=st.integers(0, 2**31),
    n=st.integers(1, 40),
)
def test_bucket_ids_in_range(n_buckets, n_hashes, seed, n):
    q, k = _qk(2, n, seed=seed % 1000)
    bq, bk = Reformer(n_buckets, n_hashes, seed).buckets(q, k)
    both = torch.cat([bq, bk], dim=-1)
    assert ((both >= 0) & (both < n_buckets)).all()
    for h in range(2):
        for round_ in range(n_hashes):
            assert len(set(both[h, round_].tolist())) <= n_buckets


def test_odd_bucket_count_uses_all_buckets():
    q, k = _qk(1, 400, r=8)
    bq, bk = Reformer(n_buckets=5, seed=2).buckets(q, k)
    assert set(torch.cat([bq, bk], -1).flatten().tolist()) == set(range(5))


def test_deterministic_under_seed_and_seeds_differ():
    q, k = _qk(4, 64)
    a = Reformer(8, seed=0).predict(q, k)
    assert torch.equal(a, Reformer(8, seed=0).predict(q, k))
    assert not torch.equal(a, Reformer(8, seed=1).predict(q, k))


def test_more_buckets_fewer_edges_on_average():
    q, k = _qk(12, 128)
    dens = [Reformer(b, seed=0).predict(q, k).float().mean().item() for b in (2, 4, 8, 12)]
    assert dens == sorted(dens, reverse=True)


def test_causal():
    q, k = _qk(2, 24)
    model = Reformer(4, n_hashes=2)
    assert torch.equal(model.predict(q, k, causal=True), model.predict(q, k) & causal_mask(24, 24))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"n_buckets": 0}, "n_buckets"),
        ({"n_buckets": 4, "n_hashes": 0}, "n_hashes"),
        ({"n_buckets": 2.0}, "n_buckets"),
        ({"n_buckets": 4, "seed": -3}, "seed"),
    ],
)
def test_bad_hyperparameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Reformer(**kwargs)


def test_more_buckets_than_queries_compares_directly():
    q, k = _qk(3, 40, 50)
    model = Reformer(100, n_hashes=2, seed=1)
    bq, bk = model.buckets(q, k)
    assert torch.equal(model.predict(q, k), (bq[..., :, None] == bk[..., None, :]).any(1))


@pytest.mark.parametrize(("n", "m"), [(0, 0), (0, 3), (3, 0)])
def test_empty_inputs(n, m):
    q, k = _qk(2, n, m)
    for model in (Reformer(4), Reformer(3, n_hashes=2), Reformer(500)):
        assert model.predict(q, k, causal=True).shape == (2, n, m)


def test_messages_name_the_parameter():
    for kwargs, name, low in (({"n_buckets": 0}, "n_buckets", 1),
                              ({"n_buckets": 2, "n_hashes": 0}, "n_hashes", 1),
                              ({"n_buckets": 2, "seed": -1}, "seed", 0)):
        bad = next(iter(kwargs.values())) if name == "n_buckets" else kwargs[name]
        with pytest.raises(ValueError, match=rf"^{name} must be an integer >= {low}, "
                                             rf"got {bad}$"):
            Reformer(**kwargs)


def test_many_buckets_causal_and_half_precision():
    """More buckets than queries (a direct comparison): still no future key when causal."""
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 10, 4, generator=gen), torch.randn(2, 10, 4, generator=gen)
    for n_buckets in (8, 128):
        model = Reformer(n_buckets, n_hashes=2, seed=1)
        plain = model.predict(q, k)
        causal = model.predict(q, k, causal=True)
        assert torch.equal(causal, plain & torch.ones(10, 10, dtype=torch.bool).tril())
        half = model.predict(q.to(torch.bfloat16), k.to(torch.bfloat16))
        assert torch.equal(half, model.predict(q.to(torch.bfloat16).float(),
                                               k.to(torch.bfloat16).float()))
