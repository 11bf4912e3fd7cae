"""Union: OR of the members' predictions (paper §4.7)."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.predictors import Distance, GlobalTokens, KMeans, Predictor, Union, Window


class Fixed:
    """A predictor that returns one stored mask and records the calls it gets."""

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask
        self.causal_seen: list[bool] = []
        self.fitted = False

    def predict(self, q, k, *, causal=False):
        self.causal_seen.append(causal)
        return self.mask & torch.ones_like(self.mask).tril() if causal else self.mask

    def fit(self, q, k):
        self.fitted = True
        return self


def _data(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(3, 8, 4, generator=gen), torch.randn(3, 8, 4, generator=gen)


def test_is_a_predictor_with_readable_repr() -> None:
    union = Union(Window(3), GlobalTokens(last=False))
    assert isinstance(union, Predictor)
    assert repr(union) == "Union(Window(size=3), GlobalTokens(first=True, last=False))"


def test_is_the_or_of_its_members() -> None:
    q, k = _data()
    members = [
        Distance(1.5),
        KMeans.from_centroids(torch.randn(3, 4, 4, generator=torch.Generator().manual_seed(1))),
        Window(3),
        GlobalTokens(),
    ]
    expected = torch.zeros(3, 8, 8, dtype=torch.bool)
    for p in members:
        expected |= p.predict(q, k)
    assert torch.equal(Union(*members).predict(q, k), expected)
    assert torch.equal(Union(*reversed(members)).predict(q, k), expected)
    # fixed patterns only, and learned patterns only
    assert torch.equal(
        Union(Window(3), GlobalTokens()).predict(q, k),
        Window(3).predict(q, k) | GlobalTokens().predict(q, k),
    )
    assert torch.equal(
        Union(members[0], members[1]).predict(q, k),
        members[0].predict(q, k) | members[1].predict(q, k),
    )


def test_hand_computed_three_tokens() -> None:
    a = torch.tensor([[[True, False, False], [False, False, False], [False, False, True]]])
    b = torch.tensor([[[False, False, False], [True, False, False], [False, False, True]]])
    expected = torch.tensor([[[True, False, False], [True, False, False], [False, False, True]]])
    q = k = torch.zeros(1, 3, 2)
    assert torch.equal(Union(Fixed(a), Fixed(b)).predict(q, k), expected)
    assert torch.equal(Union(Fixed(a)).predict(q, k), a)


def test_never_modifies_a_members_output() -> None:
    a = torch.eye(4, dtype=torch.bool)[None].repeat(2, 1, 1)
    before = a.clone()
    q = k = torch.zeros(2, 4, 2)
    Union(Fixed(a), Fixed(~a)).predict(q, k)
    Union(Fixed(a), Window(3)).predict(q, k)
    assert torch.equal(a, before)


def test_causal_is_passed_to_members_and_leaves_no_future() -> None:
    fixed = Fixed(torch.ones(2, 5, 5, dtype=torch.bool))
    q = k = torch.zeros(2, 5, 2)
    mask = Union(fixed, Window(5), GlobalTokens()).predict(q, k, causal=True)
    assert fixed.causal_seen == [True]
    assert torch.equal(mask, torch.ones(2, 5, 5).tril().bool())


def test_fit_reaches_members_that_have_fit() -> None:
    q, k = _data()
    kmeans, fixed = KMeans(n_clusters=2, n_init=1), Fixed(torch.zeros(3, 8, 8, dtype=torch.bool))
    union = Union(kmeans, Window(1), fixed)
    assert union.fit(q, k) is union
    assert kmeans.centroids_ is not None and kmeans.centroids_.shape == (3, 2, 4)
    assert fixed.fitted


def test_nested_unions() -> None:
    q, k = _data()
    nested = Union(Union(Window(1), GlobalTokens()), Distance(1.0))
    flat = Union(Window(1), GlobalTokens(), Distance(1.0))
    assert torch.equal(nested.predict(q, k), flat.predict(q, k))


def test_rejects_empty_and_non_predictors() -> None:
    with pytest.raises(ValueError, match="at least one predictor"):
        Union()
    with pytest.raises(TypeError, match="predict"):
        Union(Window(3), "window")


def test_equality_message_and_device():


    assert Union(Window(3), GlobalTokens()) == Union(Window(3), GlobalTokens())
    assert Union(Window(3)) != Union(Window(5))
    assert Union(Window(3)) != Window(3)
    with pytest.raises(ValueError, match=r"^Union needs at least one predictor, e.g. "
                                         r"Union\(KMeans\(\), Window\(3\)\)$"):
        Union()
    q = torch.zeros(2, 4, 3, device="meta")
    assert Union(Window(3), GlobalTokens()).predict(q, q).device.type == "meta"


def test_a_union_passes_a_local_window_to_members_that_honour_it():
    """top-k ∪ window on a local layer: the k keys are chosen inside the window."""
    from sparsefinder.attention.masks import layer_allowed
    from sparsefinder.predictors import TopK

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 30, 4, generator=g), torch.randn(2, 30, 4, generator=g)
    allowed = layer_allowed(30, 30, causal=True, sliding_window=6)
    union = Union(TopK(3), Window(1))
    inside = union.predict(q, k, causal=True, sliding_window=6) & allowed
    alone = TopK(3).predict(q, k, causal=True, sliding_window=6) | (
        Window(1).predict(q, k, causal=True))
    assert torch.equal(inside, alone & allowed)
    assert (inside.sum(-1)[:, 3:] >= 3).all()  # k keys inside the window on every full row
    assert torch.equal(union.predict(q, k, causal=True),
                       TopK(3).predict(q, k, causal=True) | Window(1).predict(q, k, causal=True))


def test_a_member_that_knows_no_window_is_not_given_one():
    """A plug-in predictor whose predict takes no ``sliding_window`` still works in a union
    on a local layer: only the members that honour a window get it."""

    class Plain:  # the Predictor protocol without windows
        def predict(self, q, k, *, causal=False):
            return torch.ones(q.shape[0], q.shape[1], k.shape[1], dtype=torch.bool).tril()

    q = torch.randn(2, 8, 3, generator=torch.Generator().manual_seed(1))
    union = Union(Plain(), Window(1))
    got = union.predict(q, q, causal=True, sliding_window=3)
    assert torch.equal(got, Plain().predict(q, q, causal=True))


def test_reads_shapes_only_names_the_patterns_that_ignore_q_and_k() -> None:
    from sparsefinder.predictors.union import reads_shapes_only

    assert reads_shapes_only(Window(2)) and reads_shapes_only(GlobalTokens())
    assert reads_shapes_only(Union(Window(0), GlobalTokens(first=True, last=False)))
    assert not reads_shapes_only(Union(Window(2), Distance(1.0)))
    assert not reads_shapes_only(Distance(1.0))
    assert not reads_shapes_only(Union(Distance(1.0)))


@pytest.mark.parametrize(("n", "m"), [(6, 6), (5, 7)])
def test_shared_union_is_every_heads_mask_before_the_causal_cut(n, m) -> None:
    """Three members that each add edges no other has (the diagonal, the first and the last
    token): the pattern is their OR, every head's mask, and cut like predict(causal=True)."""
    from sparsefinder.attention.masks import apply_causal
    from sparsefinder.predictors.union import shared_union

    union = Union(Window(1), GlobalTokens(first=True, last=False),
                  GlobalTokens(first=False, last=True))
    pattern = shared_union(union, n, m, torch.device("cpu"))
    assert pattern.shape == (n, m) and pattern.dtype == torch.bool
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, n, 2, generator=gen), torch.randn(3, m, 2, generator=gen)
    for causal in (False, True):
        predicted = union.predict(q, k, causal=causal)
        for head in range(3):
            assert torch.equal(predicted[head], apply_causal(pattern, causal))
    members = [p.shared_pattern(n, m) for p in union.predictors]
    for index, own in enumerate(members):  # each member adds an edge of its own
        others = torch.zeros_like(own)
        for j, other in enumerate(members):
            if j != index:
                others |= other
        assert (own & ~others).any()
    single = shared_union(Window(2), n, m)
    assert torch.equal(single, Window(2).shared_pattern(n, m))
    single[:] = False  # a fresh tensor: the next call is not affected
    assert torch.equal(shared_union(Window(2), n, m), Window(2).shared_pattern(n, m))
    assert shared_union(Union(Window(2), Distance(1.0)), n, m) is None
