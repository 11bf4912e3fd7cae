"""KMeans(B, top_k): offline k-means centroids, edge iff top-k cluster sets meet (§4.5)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.cluster import KMeans as SkKMeans
from tolerances import bound, tol_for

from sparsefinder.predictors import KMeans, Predictor

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

# Head 0: three well-separated centroids; head 1: the same, mirrored.
CENTROIDS = torch.tensor(
    [
        [[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]],
        [[0.0, 0.0], [-10.0, 0.0], [0.0, -10.0]],
    ]
)


def reference_mask(centroids: torch.Tensor, q, k, top_k: int) -> torch.Tensor:
    """Exact distances, explicit cluster sets, float one-hot matmul: the textbook version."""

    def onehot(x):
        dist = torch.cdist(x.double(), centroids.double())
        ids = dist.topk(top_k, dim=-1, largest=False).indices
        return torch.zeros(*x.shape[:2], centroids.shape[1]).scatter_(-1, ids, 1.0)

    return torch.bmm(onehot(q), onehot(k).transpose(1, 2)) > 0


def test_is_a_predictor_with_readable_repr() -> None:
    model = KMeans.from_centroids(CENTROIDS, top_k=2)
    assert isinstance(model, Predictor)
    text = repr(model)
    assert "n_clusters=3" in text and "top_k=2" in text
    assert "centroids_" not in text  # learned state is not a hyperparameter


def test_hand_computed_assignment_and_edges() -> None:
    q = torch.tensor(
        [
            [[1.0, 0.0], [9.0, 1.0], [0.0, 8.0]],  # nearest: 0, 1, 2
            [[1.0, 0.0], [9.0, 1.0], [0.0, 8.0]],  # nearest: 0, 0, 0 (mirrored centroids)
        ]
    )
    k = torch.tensor(
        [
            [[11.0, 0.0], [0.0, 0.5], [0.0, 12.0]],  # nearest: 1, 0, 2
            [[-9.0, 0.0], [0.0, -9.0], [1.0, 1.0]],  # nearest: 1, 2, 0
        ]
    )
    model = KMeans.from_centroids(CENTROIDS, top_k=1)
    assert model.assign(q)[..., 0].tolist() == [[0, 1, 2], [0, 0, 0]]
    assert model.assign(k)[..., 0].tolist() == [[1, 0, 2], [1, 2, 0]]
    expected = torch.tensor(
        [
            [[False, True, False], [True, False, False], [False, False, True]],
            [[False, False, True], [False, False, True], [False, False, True]],
        ]
    )
    assert torch.equal(model.predict(q, k), expected)


def test_assign_returns_top_k_ids_nearest_first() -> None:
    x = torch.tensor([[[6.0, 0.0], [0.0, 4.0]], [[0.0, 0.0], [0.0, -7.0]]])
    ids = KMeans.from_centroids(CENTROIDS, top_k=2).assign(x)
    assert ids.dtype == torch.long
    assert ids.shape == (2, 2, 2)
    assert ids.tolist() == [[[1, 0], [0, 2]], [[0, 1], [2, 0]]]


def test_top_k_equal_to_n_clusters_connects_everything() -> None:
    q, k = torch.randn(2, 5, 2), torch.randn(2, 4, 2)
    assert KMeans.from_centroids(CENTROIDS, top_k=3).predict(q, k).all()


@settings(max_examples=40, deadline=None)
@given(
    n_clusters=st.sampled_from([1, 2, 5, 8, 9, 16, 23, 70]),
    heads=st.integers(1, 3),
    n=st.integers(1, 15),
    m=st.integers(1, 15),
    data=st.data(),
)
def test_matches_reference_and_more_top_k_never_removes_edges(
    n_clusters, heads, n, m, data
) -> None:
    seed = data.draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    centroids = torch.randn(heads, n_clusters, 3, generator=gen)
    q, k = torch.randn(heads, n, 3, generator=gen), torch.randn(heads, m, 3, generator=gen)
    model = KMeans.from_centroids(centroids)
    previous = torch.zeros(heads, n, m, dtype=torch.bool)
    for top_k in range(1, min(n_clusters, 4) + 1):
        model.top_k = top_k  # allowed: the centroids do not depend on top_k
        mask = model.predict(q, k)
        assert torch.equal(mask, reference_mask(centroids, q, k, top_k))
        assert not (previous & ~mask).any()
        previous = mask


def test_causal_has_no_future_edges() -> None:
    model = KMeans.from_centroids(CENTROIDS, top_k=1)
    q = k = torch.zeros(2, 5, 2)  # everything in the same cluster
    assert torch.equal(model.predict(q, k, causal=True), torch.ones(2, 5, 5).tril().bool())


def _training_data(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    centres = torch.tensor([[0.0, 0.0, 0.0, 0.0], [5.0, 5.0, 0.0, 0.0], [0.0, 5.0, 5.0, 5.0]])
    q = centres[torch.randint(0, 3, (2, 60), generator=gen)] + 0.3 * torch.randn(2, 60, 4)
    k = centres[torch.randint(0, 3, (2, 40), generator=gen)] + 0.3 * torch.randn(2, 40, 4)
    return q, k


def test_fit_uses_sklearn_kmeans_per_head_on_queries_and_keys() -> None:
    q, k = _training_data()
    model = KMeans(n_clusters=3, random_state=7, n_init=4, max_iter=50)
    assert model.fit(q, k) is model
    assert model.centroids_.shape == (2, 3, 4)
    assert model.inertia_.shape == (2,)
    for head in range(2):
        x = torch.cat([q[head], k[head]]).numpy()
        sk = SkKMeans(n_clusters=3, init="k-means++", n_init=4, max_iter=50, random_state=7)
        sk.fit(x)
        # the same algorithm on the same points: a centre is a mean of ≤ N points, the
        # inertia a sum of N squared distances (d terms each)
        expected = torch.from_numpy(sk.cluster_centers_)
        torch.testing.assert_close(model.centroids_[head], expected,
                                   **tol_for(expected, terms=len(x) + 1,
                                             scale=float(abs(x).max())))
        assert model.inertia_[head].item() == pytest.approx(
            sk.inertia_, rel=bound(1.0, terms=len(x) * (x.shape[1] + 1)))


def test_fit_is_deterministic_under_random_state_even_when_subsampling() -> None:
    q, k = _training_data(1)
    a = KMeans(n_clusters=4, random_state=3, max_points=30).fit(q, k).centroids_
    b = KMeans(n_clusters=4, random_state=3, max_points=30).fit(q, k).centroids_
    assert torch.equal(a, b)
    assert a.shape == (2, 4, 4)


def test_fitted_model_predicts() -> None:
    gen = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0, 0.0, 0.0], [5.0, 5.0, 0.0, 0.0], [0.0, 5.0, 5.0, 5.0]])
    q_blob = torch.randint(0, 3, (2, 60), generator=gen)
    k_blob = torch.randint(0, 3, (2, 40), generator=gen)
    q = centres[q_blob] + 0.3 * torch.randn(2, 60, 4, generator=gen)
    k = centres[k_blob] + 0.3 * torch.randn(2, 40, 4, generator=gen)
    model = KMeans(n_clusters=3, top_k=1).fit(q, k)
    mask = model.predict(q, k)
    assert mask.shape == (2, 60, 40)
    # three well-separated blobs: each query meets exactly the keys of its own blob
    assert torch.equal(mask, q_blob[:, :, None] == k_blob[:, None, :])
    # top_k = 3 of 3 clusters: every query meets every key
    assert KMeans(n_clusters=3, top_k=3).fit(q, k).predict(q, k).all()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_clusters": 0}, "n_clusters must be an integer >= 1"),
        ({"top_k": 0}, "top_k must be an integer >= 1"),
        ({"n_init": 0}, "n_init must be an integer >= 1"),
        ({"max_iter": 0}, "max_iter must be an integer >= 1"),
        ({"max_points": 2}, "max_points must be None or an integer >= n_clusters=8"),
        (
            {"n_clusters": 4, "top_k": 5},
            r"top_k=5 exceeds n_clusters=4; choose top_k <= n_clusters",
        ),
    ],
)
def test_rejects_bad_hyperparameters(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        KMeans(**kwargs)


def test_top_k_too_large_for_given_centroids() -> None:
    with pytest.raises(ValueError, match=r"top_k=4 exceeds n_clusters=3"):
        KMeans.from_centroids(CENTROIDS, top_k=4)
    model = KMeans.from_centroids(CENTROIDS, top_k=1)
    model.top_k = 4
    with pytest.raises(ValueError, match=r"top_k=4 exceeds n_clusters=3"):
        model.predict(torch.zeros(2, 3, 2), torch.zeros(2, 3, 2))


def test_predict_before_fit_says_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"call fit\(\) or from_centroids\(\) first"):
        KMeans().predict(torch.zeros(2, 3, 2), torch.zeros(2, 3, 2))


def test_rejects_inputs_that_do_not_match_the_centroids() -> None:
    model = KMeans.from_centroids(CENTROIDS)
    with pytest.raises(ValueError, match="to match the centroids"):
        model.predict(torch.zeros(3, 4, 2), torch.zeros(3, 4, 2))
    with pytest.raises(ValueError, match=r"shape \(heads, B, r\)"):
        KMeans.from_centroids(torch.zeros(3, 2))


def test_fit_with_too_few_points_says_what_to_do() -> None:
    with pytest.raises(ValueError, match="lower n_clusters"):
        KMeans(n_clusters=8).fit(torch.zeros(1, 2, 4), torch.zeros(1, 3, 4))


def test_top_k_and_centroid_messages() -> None:
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match=rf"^top_k must be an integer >= 1, got {bad!r}$"):
            KMeans(n_clusters=4, top_k=bad)
    for bad in (True, 2.0):
        with pytest.raises(ValueError, match="^n_clusters must be an integer >= 1"):
            KMeans(n_clusters=bad)
    assert KMeans(n_clusters=4, max_points=4).max_points == 4  # max_points = B is enough
    with pytest.raises(ValueError, match=r"^centroids must be a tensor of shape \(heads, B, "
                                         r"r\), got \(2, 0, 3\)"):
        KMeans.from_centroids(torch.zeros(2, 0, 3))
    with pytest.raises(ValueError, match=r"^centroids must be a tensor .*, got <class 'list'>"):
        KMeans.from_centroids([1.0])
    one = KMeans.from_centroids(torch.zeros(2, 3, 1))  # r = 1 is a valid space
    assert one.n_clusters == 3


def test_more_than_eight_clusters_and_top_k() -> None:
    """Cluster memberships are packed 8 to a byte: B = 9..16 uses a second byte."""
    gen = torch.Generator().manual_seed(3)
    centroids = torch.randn(2, 12, 3, generator=gen) * 4
    q, k = torch.randn(2, 30, 3, generator=gen) * 4, torch.randn(2, 25, 3, generator=gen) * 4
    for top_k in (1, 2, 5):
        model = KMeans.from_centroids(centroids, top_k=top_k)
        mask = model.predict(q, k)
        # brute force: share at least one of the top_k nearest centroids
        dq = torch.cdist(q, centroids).topk(top_k, largest=False).indices
        dk = torch.cdist(k, centroids).topk(top_k, largest=False).indices
        mq = torch.zeros(2, 30, 12, dtype=torch.bool).scatter_(2, dq, True)
        mk = torch.zeros(2, 25, 12, dtype=torch.bool).scatter_(2, dk, True)
        expected = (mq.float() @ mk.float().transpose(1, 2)) > 0
        assert torch.equal(mask, expected), top_k
        assert mask.dtype == torch.bool and set(mask.view(torch.uint8).unique().tolist()) <= {0, 1}


def test_fit_boundaries_dtypes_and_messages() -> None:
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 2, 3, generator=gen), torch.randn(2, 2, 3, generator=gen)
    model = KMeans(n_clusters=4, n_init=1).fit(q, k)  # exactly B points per head
    assert model.centroids_.shape == (2, 4, 3)
    assert model.inertia_.dtype == torch.float64
    with pytest.raises(ValueError, match="n_clusters"):
        KMeans(n_clusters=5, n_init=1).fit(q, k)
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError, match=r"^this KMeans predictor has no centroids; call "
                                           r"fit\(\) or from_centroids\(\) first$"):
        KMeans(n_clusters=2).predict(q, k)
    with pytest.raises(ValueError, match=r"^expected x of shape \(heads=2, N, r=3\)"):
        model.predict(torch.zeros(3, 4, 3), torch.zeros(3, 4, 3))
    centroids = torch.randn(2, 6, 3, generator=gen) * 3
    big_q, big_k = torch.randn(2, 40, 3, generator=gen) * 3, torch.randn(2, 30, 3, generator=gen)
    fitted = KMeans.from_centroids(centroids, top_k=2)
    half_q, half_k = big_q.to(torch.bfloat16), big_k.to(torch.bfloat16)
    assert torch.equal(fitted.predict(half_q, half_k),
                       fitted.predict(half_q.float(), half_k.float()))
    assert torch.equal(fitted.assign(half_q), fitted.assign(half_q.float()))
