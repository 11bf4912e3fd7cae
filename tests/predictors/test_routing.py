"""Routing Transformer: balanced clusters, each centroid picks its nearest tokens."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerances import bound, tol_for

from sparsefinder.attention.masks import causal_mask
from sparsefinder.predictors.routing import (
    Routing,
    kmeans_step,
    routing_membership,
    spherical_kmeans,
)

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

# Cross-check against routing-transformer 1.6.1 (run once in a throwaway venv; not a project
# dependency): Kmeans(h=2, d=3, c=3) with means = normalize(MEANS) and initted, then
# dists = Kmeans.forward(cat(q, k)), split into queries/keys, distribution(q_dists, ⌈5/3⌉)
# and distribution(k_dists, ⌈7/3⌉) (the picks of KmeansAttention.forward, shared_qk=False),
# and kmeans_iter(normalize(cat(q, k)), normalize(MEANS)) for STEP.
Q = [  # (heads 2, t 5, d 3)
    [[-0.1, 0.4, -0.8], [0.1, 0.7, -0.3], [1.6, -1.6, -0.1], [-0.3, 0.2, -0.2], [0.9, 0.2, -0.1]],
    [[-1.8, -0.5, -0.3], [-0.3, 0.3, 0.0], [-0.1, 0.8, -0.1], [-0.3, 0.1, 0.1], [0.7, -1.0, 0.1]],
]
K = [  # (heads 2, kv_t 7, d 3)
    [
        [0.3, -0.7, -0.5],
        [2.2, -0.4, -0.1],
        [0.6, -2.3, -0.5],
        [-0.7, 1.0, -1.3],
        [-1.6, 0.8, -0.8],
        [-0.5, -0.4, 0.7],
        [-0.1, -0.4, 0.4],
    ],
    [
        [-0.3, -1.6, 1.4],
        [-0.3, -0.4, 0.3],
        [0.1, -0.6, -0.0],
        [-0.4, -0.8, -1.2],
        [-0.7, 0.5, -0.9],
        [0.6, 1.4, -0.2],
        [-3.1, -0.4, 1.3],
    ],
]
MEANS = [  # (heads 2, c 3, d 3), not normalised
    [[0.7, 0.6, 0.3], [-0.8, 0.0, -0.6], [1.0, -0.9, -0.1]],
    [[0.3, -0.1, -0.0], [-0.1, 0.5, 1.0], [-0.7, -1.0, -1.2]],
]
Q_PICKS = [[[1, 4], [0, 3], [2, 4]], [[2, 4], [1, 3], [0, 4]]]  # (heads, c, picks) sorted
K_PICKS = [[[1, 3, 6], [0, 3, 4], [0, 1, 2]], [[0, 2, 5], [0, 5, 6], [2, 3, 4]]]
STEP = [
    [[0.6662, 0.6821, -0.3016], [-0.7447, 0.4271, -0.5129], [0.5353, -0.8438, -0.0377]],
    [[0.5715, -0.8165, 0.0816], [-0.7202, 0.6127, 0.3254], [-0.6676, -0.6483, -0.3661]],
]


def _qk(heads: int, n: int, m: int | None = None, r: int = 4, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    return torch.randn(heads, n, r, generator=gen), torch.randn(heads, m, r, generator=gen)


def _picks(member: torch.Tensor) -> list:
    """bool (heads, N, c) → per head and cluster, the sorted token ids."""
    return [[col.nonzero().flatten().tolist() for col in head.T] for head in member]


def test_membership_matches_routing_transformer():
    q, k, means = torch.tensor(Q), torch.tensor(K), torch.tensor(MEANS)
    model = Routing(n_clusters=3, centroids=means)
    mq, mk = model.membership(q, k)
    assert _picks(mq) == Q_PICKS
    assert _picks(mk) == K_PICKS
    # And the mask: query i, key j share a centroid.
    mask = model.predict(q, k)
    for h in range(2):
        for i in range(5):
            for j in range(7):
                shared = any(i in Q_PICKS[h][c] and j in K_PICKS[h][c] for c in range(3))
                assert mask[h, i, j].item() == shared


def test_kmeans_step_matches_routing_transformer():
    x = F.normalize(torch.cat([torch.tensor(Q), torch.tensor(K)], dim=1), dim=-1)
    new = kmeans_step(x, F.normalize(torch.tensor(MEANS), dim=-1))
    # STEP is printed to 4 decimals (±5e-5); our step sums and normalises a few vectors
    torch.testing.assert_close(new, torch.tensor(STEP), rtol=0,
                               atol=0.5e-4 + bound(1.0, terms=x.shape[1] + x.shape[-1] + 2))


def test_each_cluster_holds_ceil_n_over_c_tokens():
    q, k = _qk(3, 50, 37)
    for c in (1, 2, 4, 6, 8, 10, 13):
        mq, mk = Routing(c, seed=1).membership(q, k)
        assert mq.shape == (3, 50, c) and mk.shape == (3, 37, c)
        assert (mq.sum(1) == math.ceil(50 / c)).all()
        assert (mk.sum(1) == math.ceil(37 / c)).all()


def test_mask_is_shared_membership():
    q, k = _qk(2, 30, 20)
    model = Routing(4, seed=3)
    mq, mk = model.membership(q, k)
    expected = (mq[:, :, None, :] & mk[:, None, :, :]).any(-1)
    assert torch.equal(model.predict(q, k), expected)


def test_hand_checked_left_out_and_overlapping_queries():
    # Two nearby centroids both take the two queries nearest to them (2 = ⌈4/2⌉ each):
    # queries 0 and 1 are in both clusters, queries 2 and 3 in none (empty rows).
    cents = torch.tensor([[[1.0, 0.0], [0.8, 0.6]]])
    q = torch.tensor([[[1.0, 0.0], [0.95, 0.31], [-1.0, 0.0], [0.0, -1.0]]])
    k = q.clone()
    model = Routing(2, centroids=cents)
    mq, _ = model.membership(q, k)
    assert mq[0].tolist() == [[True, True], [True, True], [False, False], [False, False]]
    mask = model.predict(q, k)[0]
    expected = torch.zeros(4, 4, dtype=torch.bool)
    expected[:2, :2] = True
    assert torch.equal(mask, expected)


def test_one_cluster_is_the_full_graph():
    q, k = _qk(2, 11)
    assert Routing(1).predict(q, k).all()


def test_deterministic_under_seed_and_seeds_differ():
    q, k = _qk(4, 64)
    a = Routing(6, seed=0).predict(q, k)
    assert torch.equal(a, Routing(6, seed=0).predict(q, k))
    others = [Routing(6, seed=s).predict(q, k) for s in range(1, 5)]
    assert any(not torch.equal(a, o) for o in others)


def test_fit_learns_unit_centroids_used_by_predict():
    q_train, k_train = _qk(3, 200, seed=1)
    model = Routing(5, seed=0).fit(q_train, k_train)
    assert model.centroids_.shape == (3, 5, 4)
    norms = model.centroids_.norm(dim=-1)  # unit vectors up to the rounding of their norm
    torch.testing.assert_close(norms, torch.ones(3, 5), **tol_for(norms, terms=4 + 2))
    q, k = _qk(3, 20, seed=2)
    given_ = Routing(5, centroids=model.centroids_)
    assert torch.equal(model.predict(q, k), given_.predict(q, k))


def test_kmeans_improves_cohesion():
    x = F.normalize(torch.randn(2, 300, 4, generator=torch.Generator().manual_seed(0)), dim=-1)
    c0 = spherical_kmeans(x, 6, n_iter=0, seed=0)
    c10 = spherical_kmeans(x, 6, n_iter=10, seed=0)

    def cohesion(c):
        return torch.bmm(x, c.transpose(1, 2)).amax(-1).mean()

    assert cohesion(c10) > cohesion(c0)
    # n_iter=0: the initial centroids are c distinct data points.
    for h in range(2):
        for j in range(6):
            assert (x[h] - c0[h, j]).abs().amax(-1).min() <= bound(1.0, terms=4 + 2)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 30),
    m=st.integers(1, 30),
    c=st.integers(1, 10),
    size=st.integers(0, 35),
    seed=st.integers(0, 1000),
)
def test_membership_properties(n, m, c, size, seed):
    x = F.normalize(torch.randn(2, n, 3, generator=torch.Generator().manual_seed(seed)), dim=-1)
    cents = F.normalize(torch.randn(2, c, 3, generator=torch.Generator().manual_seed(seed + 1)), -1)
    member = routing_membership(x, cents, size)
    assert (member.sum(1) == min(size, n)).all()
    # The picked tokens are the most similar ones to their centroid.
    sim = torch.bmm(x, cents.transpose(1, 2))
    if 0 < size < n:
        picked_min = sim.masked_fill(~member, float("inf")).amin(1)
        other_max = sim.masked_fill(member, float("-inf")).amax(1)
        assert (picked_min >= other_max).all()
    q, k = _qk(2, n, m, r=3, seed=seed)
    mask = Routing(c, seed=seed).predict(q, k, causal=True)
    assert not (mask & ~causal_mask(n, m)).any()


def test_causal():
    q, k = _qk(2, 24)
    model = Routing(3)
    assert torch.equal(model.predict(q, k, causal=True), model.predict(q, k) & causal_mask(24, 24))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"n_clusters": 0}, "n_clusters"),
        ({"n_clusters": 2.5}, "n_clusters"),
        ({"n_clusters": 2, "seed": -1}, "seed"),
        ({"n_clusters": 2, "n_iter": -1}, "n_iter"),
        ({"n_clusters": 2, "fit_iter": 1.5}, "fit_iter"),
        ({"n_clusters": 3, "centroids": torch.zeros(2, 4, 3)}, "centroids"),
        ({"n_clusters": 3, "centroids": torch.zeros(4, 3)}, "centroids"),
    ],
)
def test_bad_hyperparameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Routing(**kwargs)


def test_centroids_must_fit_the_input():
    q, k = _qk(2, 8)
    with pytest.raises(ValueError, match="centroids"):
        Routing(3, centroids=torch.randn(3, 3, 4)).predict(q, k)
    with pytest.raises(ValueError, match="n_clusters"):
        Routing(20).fit(*_qk(2, 5))


@pytest.mark.parametrize(("n", "m"), [(0, 0), (0, 3), (3, 0), (1, 1)])
def test_tiny_and_empty_inputs(n, m):
    q, k = _qk(2, n, m)
    for model in (Routing(3), Routing(12)):
        mask = model.predict(q, k)
        assert mask.shape == (2, n, m)
        if n and m:
            assert mask.all()  # one query and one key: every centroid takes both


@pytest.mark.parametrize("n_clusters", [3, 9, 17])
def test_predict_is_shared_membership_beyond_eight_clusters(n_clusters):
    """Memberships are packed 8 clusters to a byte: 9 and 17 use 2 and 3 bytes."""
    gen = torch.Generator().manual_seed(n_clusters)
    q, k = torch.randn(2, 40, 4, generator=gen), torch.randn(2, 30, 4, generator=gen)
    model = Routing(n_clusters, seed=3)
    mq, mk = model.membership(q, k)
    expected = (mq.float() @ mk.float().transpose(1, 2)) > 0
    assert torch.equal(model.predict(q, k), expected)
    assert mq.shape == (2, 40, n_clusters) and mk.shape == (2, 30, n_clusters)
    # every cluster picks ⌈N / c⌉ tokens of each side
    assert (mq.sum(1) == -(-40 // n_clusters)).all() and (mk.sum(1) == -(-30 // n_clusters)).all()
    half = model.predict(q.to(torch.bfloat16), k.to(torch.bfloat16))
    assert torch.equal(half, model.predict(q.to(torch.bfloat16).float(),
                                           k.to(torch.bfloat16).float()))


def test_messages_and_zero_iterations():
    for kwargs, name, low in (({"n_clusters": 0}, "n_clusters", 1),
                              ({"n_clusters": 2, "seed": -1}, "seed", 0),
                              ({"n_clusters": 2, "n_iter": -1}, "n_iter", 0),
                              ({"n_clusters": 2, "fit_iter": -1}, "fit_iter", 0)):
        bad = kwargs[name]
        with pytest.raises(ValueError, match=rf"^{name} must be an integer >= {low}, "
                                             rf"got {bad}$"):
            Routing(**kwargs)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 6, 3, generator=gen)
    assert Routing(2, n_iter=0, fit_iter=0).predict(q, q).shape == (1, 6, 6)
    with pytest.raises(ValueError, match=r"^centroids \(2, 2, 3\) do not fit q \(1, 6, 3\): "
                                         r"expected \(heads=1, c, r=3\)$"):
        Routing(2, centroids=torch.randn(2, 2, 3)).predict(q, q)
