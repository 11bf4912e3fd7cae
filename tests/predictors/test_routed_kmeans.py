"""Routed k-means: keys clustered offline, each query routed to centroids ranked by q·c."""

from __future__ import annotations

import pytest
import torch
from sklearn.exceptions import NotFittedError

from sparsefinder.attention.masks import causal_mask
from sparsefinder.predictors.routed_kmeans import RoutedKMeans, descending_order


def _qk(heads: int = 2, n: int = 12, m: int | None = None, d: int = 4, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    return torch.randn(heads, n, d, generator=gen), torch.randn(heads, m, d, generator=gen)


def _fitted(b: int = 6, d: int = 4, **params) -> RoutedKMeans:
    gen = torch.Generator().manual_seed(1)
    keys = torch.randn(2, 300, d, generator=gen)
    return RoutedKMeans(n_clusters=b, n_init=1, **params).fit(None, keys)


def test_hand_checked_routing():
    centroids = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]])
    k = torch.tensor([[[0.9, 0.1], [1.1, 0.0], [0.1, 0.9], [-1.0, 0.2]]])  # clusters 0,0,1,2
    q = torch.tensor([[[5.0, 1.0], [0.0, 2.0]]])  # q0 ranks 0 > 1 > 2; q1 ranks 1 > 0 = 2
    model = RoutedKMeans.from_centroids(centroids, budget=0.25)
    assert model.assign_keys(k).tolist() == [[0, 0, 1, 2]]
    # budget 0.25·4 = 1 key: q0 takes centroid 0 (2 keys), q1 takes centroid 1 (1 key)
    assert model.predict(q, k)[0].int().tolist() == [[1, 1, 0, 0], [0, 0, 1, 0]]
    # budget 0.5 = 2 keys: q1 needs a second centroid; 0 and 2 tie, the lower index wins
    model.budget = 0.5
    assert model.predict(q, k)[0].int().tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]]
    top = RoutedKMeans.from_centroids(centroids, mode="top", n_routes=2)
    assert top.predict(q, k)[0].int().tolist() == [[1, 1, 1, 0], [1, 1, 1, 0]]


def test_fit_shapes_and_graph_is_union_of_bucket_blocks():
    model = _fitted(b=6)
    assert model.centroids_.shape == (2, 6, 4) and model.inertia_.shape == (2,)
    q, k = _qk()
    mask = model.predict(q, k)
    assert mask.dtype == torch.bool and mask.shape == (2, 12, 12)
    key_ids = model.assign_keys(k)
    routes = model.routes(q, key_ids)
    expected = routes.gather(2, key_ids[:, None, :].expand(-1, 12, -1))
    assert torch.equal(mask, expected)
    # keys of one cluster are always linked to the same queries
    same = key_ids[0, :, None] == key_ids[0, None, :]
    cols = mask[0].T
    for a, b in same.nonzero().tolist():
        assert torch.equal(cols[a], cols[b])


def test_budget_monotone_every_row_nonempty_and_full_budget_is_dense():
    model = _fitted(b=6)
    q, k = _qk(n=20)
    previous = None
    for budget in (0.01, 0.1, 0.3, 0.6, 1.0):
        model.budget = budget
        mask = model.predict(q, k)
        assert mask.any(-1).all()  # the best centroid (and then some key) is always taken
        if previous is not None:
            assert (mask >= previous).all()
        previous = mask
    assert previous.all()


def test_top_mode_routes_each_query_to_n_routes_centroids():
    model = _fitted(b=6, mode="top", n_routes=2)
    q, k = _qk()
    routes = model.routes(q, model.assign_keys(k))
    assert (routes.sum(-1) == 2).all()
    model.n_routes = 6
    assert model.predict(q, k).all()


def test_causal_counts_only_visible_keys():
    model = _fitted(b=5, budget=0.3)
    q, k = _qk(n=10)
    mask = model.predict(q, k, causal=True)
    assert not (mask & ~causal_mask(10, 10)).any()
    for i in (0, 4, 9):  # row i = the non-causal prediction over the keys it may see
        alone = model.predict(q[:, i : i + 1], k[:, : i + 1])
        assert torch.equal(mask[:, i, : i + 1], alone[:, 0])


def test_descending_order_matches_a_stable_torch_sort():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 7, 40, generator=gen)
    x[0, 0, :6] = 0.0
    x[0, 0, 6] = -0.0
    x[1, 2, :] = -2.5
    x[2, 3, 10:20] = float("inf")
    expected = torch.sort(x, stable=True, dim=-1, descending=True).indices
    assert torch.equal(descending_order(x), expected)


def test_errors():
    with pytest.raises(NotFittedError):
        RoutedKMeans().predict(*_qk())
    model = _fitted(b=6)
    with pytest.raises(ValueError, match="original queries/keys"):
        model.predict(*_qk(d=5))
    with pytest.raises(ValueError, match="budget"):
        RoutedKMeans(budget=0.0)
    with pytest.raises(ValueError, match="mode"):
        RoutedKMeans(mode="nearest")
    with pytest.raises(ValueError, match="n_routes"):
        RoutedKMeans(n_clusters=4, n_routes=5)
    with pytest.raises(ValueError, match="more training tokens"):
        RoutedKMeans(n_clusters=8).fit(None, torch.randn(1, 5, 4))
    with pytest.raises(ValueError, match="k must be"):
        RoutedKMeans().fit(None, torch.randn(5, 4))
    empty = model.predict(torch.zeros(2, 0, 4), torch.zeros(2, 3, 4))
    assert empty.shape == (2, 0, 3)


@pytest.mark.parametrize("mode", ["budget", "top"])
@pytest.mark.parametrize("causal", [False, True])
def test_packed_routes_equal_the_sorted_routes(mode, causal):
    """The CPU path (one integer sort, a threshold per query) routes exactly as a full
    stable sort of the scores does, ties (equal scores, ±0.0, duplicated centroids) too."""
    from sparsefinder.predictors import routed_kmeans as rk

    gen = torch.Generator().manual_seed(7)
    for trial in range(12):
        b = int(torch.randint(1, 40, (1,), generator=gen))
        n = int(torch.randint(1, 50, (1,), generator=gen))
        m = n if trial % 2 else int(torch.randint(1, 50, (1,), generator=gen))
        centroids = torch.randn(3, b, 4, generator=gen)
        if b > 2:
            centroids[:, 1] = centroids[:, 0]
        q, k = _qk(heads=3, n=n, m=m, seed=trial)
        if trial % 3 == 0:
            q = q.round()  # many exactly equal scores
        for budget in (0.01, 0.08, 0.3, 1.0):
            model = RoutedKMeans.from_centroids(centroids, mode=mode, budget=budget,
                                                n_routes=min(3, b))
            key_ids = model.assign_keys(k)
            score = torch.bmm(q, centroids.transpose(1, 2))
            score[0, 0, :] = 0.0
            score[0, 0, 0] = -0.0
            counts, limit = None, None
            if mode == "budget":
                counts, visible = model._counts(key_ids, n, b, causal, torch.float32)
                limit = budget * visible
            sorted_routes = rk._routes_sorted(score.clone(), counts, limit, model.n_routes)
            packed_routes = rk._routes_packed(score.clone(), counts, limit, model.n_routes)
            assert torch.equal(packed_routes, sorted_routes), (trial, budget)


def _reference_routes(model, centroids, q, k, causal):
    """Routing by hand (float64): nearest centroid of each key; each query's centroids by
    q·c (ties: lower index), taken while the visible keys of the better ones are below
    budget · visible (or the n_routes best)."""
    c, q, k = centroids.double(), q.double(), k.double()
    heads, n, m, b = q.shape[0], q.shape[1], k.shape[1], c.shape[1]
    ids = ((k[:, :, None, :] - c[:, None, :, :]) ** 2).sum(-1).argmin(-1)  # (heads, m)
    routes = torch.zeros(heads, n, b, dtype=torch.bool)
    for h in range(heads):
        budget = model.budget
        budget = float(budget[h]) if isinstance(budget, torch.Tensor) else budget
        for i in range(n):
            seen = [j for j in range(m) if not causal or j <= i + (m - n)]
            scores = (c[h] @ q[h, i]).tolist()
            order = sorted(range(b), key=lambda x: (-scores[x], x))
            if model.mode == "top":
                taken = order[:model.n_routes]
            else:
                counts = [sum(int(ids[h, j]) == x for j in seen) for x in range(b)]
                taken, before = [], 0
                for x in order:
                    if before < budget * len(seen):
                        taken.append(x)
                    before += counts[x]
            routes[h, i, taken] = True
    mask = routes.gather(2, ids[:, None, :].expand(heads, n, m))
    if causal:
        mask &= causal_mask(n, m)
    return ids, routes, mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("dtype", "b"), [(torch.float64, 5), (torch.float32, 300)])
def test_routes_and_masks_match_a_hand_reference(causal, dtype, b):
    """float64 vectors, or more than 256 centroids, take the sorted path; a key prefix
    (m > n) makes the causal counts start past 0."""
    gen = torch.Generator().manual_seed(b)
    centroids = torch.randn(2, b, 3, generator=gen)
    q, k = torch.randn(2, 9, 3, generator=gen), torch.randn(2, 14, 3, generator=gen)
    q, k = q.to(dtype), k.to(dtype)
    for params in ({"budget": 0.2}, {"budget": torch.tensor([0.05, 0.5])},
                   {"mode": "top", "n_routes": 2}):
        model = RoutedKMeans.from_centroids(centroids, **params)
        ids, routes, mask = _reference_routes(model, centroids, q, k, causal)
        assert torch.equal(model.assign_keys(k), ids)
        assert torch.equal(model.routes(q, ids, causal=causal), routes), params
        assert torch.equal(model.predict(q, k, causal=causal), mask), params


def test_a_query_before_every_key_is_routed_nowhere():
    # causal with 2 keys for 4 queries: query i sees keys j <= i − 2, so queries 0 and 1 none
    centroids = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    q, k = torch.ones(1, 4, 2), torch.tensor([[[1.0, 0.1], [0.1, 1.0]]])
    model = RoutedKMeans.from_centroids(centroids, budget=0.5)
    ids = model.assign_keys(k)
    routes = model.routes(q, ids, causal=True)
    assert routes[0, :2].sum().item() == 0 and routes[0, 2:].any(-1).all()
    assert model.routes(q.double(), ids, causal=True).tolist() == routes.tolist()
    counts, visible = model._counts(ids, 4, 2, True, torch.float64)
    assert visible.flatten().tolist() == [0.0, 0.0, 1.0, 2.0]
    assert counts[0].tolist() == [[0, 0], [0, 0], [1, 0], [1, 1]]
    assert visible.dtype == torch.float64 and counts.dtype == torch.int32


def test_descending_order_keeps_tiny_and_float64_differences():
    tiny = torch.tensor([[1e-9, 3e-9, 2e-9, -1e-9]])
    assert descending_order(tiny).tolist() == [[1, 2, 0, 3]]
    wide = torch.tensor([[0.5, 0.25, 0.75, -1.0]], dtype=torch.float64)
    assert descending_order(wide).tolist() == [[2, 0, 1, 3]]


def test_per_head_budget_errors_name_the_heads():
    model = RoutedKMeans.from_centroids(torch.randn(3, 4, 2), budget=torch.tensor([0.1, 0.2]))
    q = torch.randn(3, 5, 2)
    with pytest.raises(ValueError, match="^2 per-head budgets for 3 heads$"):
        model.routes(q, torch.zeros(3, 5, dtype=torch.long))


def test_parameter_bounds_and_messages():
    for name in ("n_clusters", "n_init", "max_iter", "n_routes"):
        for bad in (0, True, 1.5):
            with pytest.raises(ValueError, match=f"^{name} must be an integer >= 1, got "):
                RoutedKMeans(**{name: bad})
    with pytest.raises(ValueError, match=r"^max_points must be None or an integer >= "
                                         r"n_clusters=8, got 7$"):
        RoutedKMeans(n_clusters=8, max_points=7)
    with pytest.raises(ValueError, match="max_points"):
        RoutedKMeans(n_clusters=8, max_points=8.0)
    assert RoutedKMeans(n_clusters=8, max_points=8).max_points == 8  # the bound is inclusive
    assert RoutedKMeans(budget=1.0).budget == 1.0 and RoutedKMeans(budget=1).budget == 1
    for bad in (1.5, 2.0, True, "0.1", -0.1):
        with pytest.raises(ValueError, match=r"^budget must be a share of keys in \(0, 1\], "):
            RoutedKMeans(budget=bad)
    ok = torch.tensor([0.5, 1.0])
    assert torch.equal(RoutedKMeans(budget=ok).budget, ok)
    for bad in (torch.tensor([0.5, 1.5]), torch.tensor([0.0, 0.5]), torch.tensor([[0.5]]),
                torch.tensor([2.0])):
        with pytest.raises(ValueError, match=r"^a per-head budget must be a 1-d tensor of shares "
                                             r"of keys in \(0, 1\], got "):
            RoutedKMeans(budget=bad)
    with pytest.raises(ValueError, match="^n_routes=5 exceeds n_clusters=4; choose n_routes <= "
                                         "n_clusters$"):
        RoutedKMeans(n_clusters=4, n_routes=5)


def test_centroid_and_input_errors_are_named():
    with pytest.raises(NotFittedError, match=r"^this RoutedKMeans predictor has no centroids; "
                                             r"call fit\(\) or from_centroids\(\) first$"):
        RoutedKMeans().assign_keys(torch.zeros(2, 3, 4))
    for bad, shown in ((torch.zeros(2, 0, 4), r"\(2, 0, 4\)"), (torch.zeros(4, 3), r"\(4, 3\)"),
                       ([[1.0]], "<class 'list'>")):
        with pytest.raises(ValueError, match=rf"^centroids must be a tensor of shape \(heads, B, "
                                             rf"d\), got {shown}$"):
            RoutedKMeans.from_centroids(bad)
    one = RoutedKMeans.from_centroids(torch.zeros(2, 1, 3))  # a single centroid is fine
    assert one.n_clusters == 1 and one.max_points is None
    model = RoutedKMeans.from_centroids(torch.randn(2, 5, 3))
    assert model.n_clusters == 5 and model.max_points is None
    for bad in (torch.zeros(3, 4, 3), torch.zeros(2, 4, 2), torch.zeros(4, 3)):
        with pytest.raises(ValueError, match=r"^expected vectors of shape \(heads=2, N, d=3\) to "
                                             r"match the centroids \(2, 5, 3\), got "):
            model.assign_keys(bad)
    with pytest.raises(ValueError, match=r"^k must be a tensor \(heads, N, d\), got list$"):
        RoutedKMeans().fit(None, [1.0])
    with pytest.raises(ValueError, match=r"^k must be a tensor \(heads, N, d\), got \(5, 4\)$"):
        RoutedKMeans().fit(None, torch.randn(5, 4))
    with pytest.raises(ValueError, match="heads"):  # q, when given, must match k
        RoutedKMeans(n_clusters=2).fit(torch.randn(3, 5, 4), torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match="^fit got 4 keys per head but n_clusters=5; pass more "
                                         "training tokens or lower n_clusters$"):
        RoutedKMeans(n_clusters=5).fit(None, torch.randn(1, 4, 2))
    exact = RoutedKMeans(n_clusters=4).fit(None, torch.randn(1, 4, 2))  # as many keys as B
    assert exact.centroids_.shape == (1, 4, 2)


def test_fit_is_seeded_subsampled_and_float64_keys_work():
    gen = torch.Generator().manual_seed(5)
    keys = torch.randn(2, 400, 3, generator=gen, dtype=torch.float64)
    a = RoutedKMeans(n_clusters=4, max_points=50, random_state=3).fit(None, keys)
    b = RoutedKMeans(n_clusters=4, max_points=50, random_state=3).fit(None, keys.float())
    assert torch.equal(a.centroids_, b.centroids_) and a.centroids_.dtype == torch.float32
    full = RoutedKMeans(n_clusters=4, max_points=None, random_state=3).fit(None, keys)
    assert not torch.equal(a.centroids_, full.centroids_)  # 50 sampled keys, not all 400
    other = RoutedKMeans(n_clusters=4, max_points=50, random_state=4).fit(None, keys)
    assert not torch.equal(a.centroids_, other.centroids_)


def test_everything_stays_on_the_inputs_device():
    """The meta device stands in for a GPU: centroids, budgets, counts and masks follow the
    inputs, and the numpy fast paths (CPU only) are never taken there."""
    centroids = torch.randn(2, 5, 3)
    for params in ({"budget": 0.2}, {"budget": torch.tensor([0.1, 0.5])},
                   {"mode": "top", "n_routes": 2}):
        model = RoutedKMeans.from_centroids(centroids, **params)
        for causal in (False, True):
            for n, m in ((4, 6), (0, 6), (4, 0)):
                q = torch.zeros(2, n, 3, device="meta")
                k = torch.zeros(2, m, 3, device="meta")
                out = model.predict(q, k, causal=causal)
                assert (out.device.type, tuple(out.shape), out.dtype) == (
                    "meta", (2, n, m), torch.bool), (params, causal, n, m)
        ids = model.assign_keys(torch.zeros(2, 6, 3, device="meta"))
        assert ids.device.type == "meta" and ids.dtype == torch.int64
    counts, visible = model._counts(torch.zeros(2, 6, dtype=torch.long, device="meta"), 4, 5,
                                    False, torch.float64)
    assert counts.device.type == visible.device.type == "meta"
    assert visible.dtype == torch.float64 and counts.dtype == torch.int32


def test_descending_order_never_rounds_wider_scores():
    """float64 (and integer) scores that differ below float32's precision keep their order
    (rounded to float32 they tied and went by index)."""
    close = torch.tensor([[1.0, 1.0 + 1e-12, 1.0 - 1e-12]], dtype=torch.float64)
    assert descending_order(close).tolist() == [[1, 0, 2]]
    big = torch.tensor([[2**40, 2**40 + 1, 3]], dtype=torch.int64)
    assert descending_order(big).tolist() == [[1, 0, 2]]
    half = torch.tensor([[0.5, -1.0, 2.0, 0.5]], dtype=torch.bfloat16)
    assert descending_order(half).tolist() == [[2, 0, 3, 1]]
