"""SparseBERT: NoDiagonal wrapper and the static, frequency-ranked DAM-style mask."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsefinder.attention.masks import causal_mask
from sparsefinder.predictors.sparsebert import NoDiagonal, StaticMask
from sparsefinder.predictors.window import Window


def _qk(heads: int, n: int, m: int | None = None, r: int = 4):
    gen = torch.Generator().manual_seed(0)
    m = n if m is None else m
    return torch.randn(heads, n, r, generator=gen), torch.randn(heads, m, r, generator=gen)


def _golds(heads: int, lengths: list[int], density: float = 0.2, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(heads, n, n, generator=gen) < density for n in lengths]


class _Fixed:
    """A predictor that always returns the same tensor (to catch in-place edits)."""

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask

    def predict(self, q, k, *, causal=False):
        return self.mask


# -- NoDiagonal --------------------------------------------------------------------------


def test_no_diagonal_removes_exactly_the_diagonal():
    q, k = _qk(3, 9)
    inner = Window(5)
    mask = NoDiagonal(inner).predict(q, k)
    eye = torch.eye(9, dtype=torch.bool)
    assert torch.equal(mask, inner.predict(q, k) & ~eye)
    full = NoDiagonal(_Fixed(torch.ones(3, 9, 9, dtype=torch.bool))).predict(q, k)
    assert full.sum().item() == 3 * (81 - 9)
    assert not full.diagonal(dim1=-2, dim2=-1).any()


def test_no_diagonal_with_prefix_keys_removes_own_key():
    q, k = _qk(1, 3, 5)
    mask = NoDiagonal(_Fixed(torch.ones(1, 3, 5, dtype=torch.bool))).predict(q, k)
    # query i is key i + 2
    assert mask[0].tolist() == [
        [True, True, False, True, True],
        [True, True, True, False, True],
        [True, True, True, True, False],
    ]


def test_no_diagonal_does_not_modify_the_wrapped_output():
    inner = _Fixed(torch.ones(2, 4, 4, dtype=torch.bool))
    q, k = _qk(2, 4)
    NoDiagonal(inner).predict(q, k)
    assert inner.mask.all()


def test_no_diagonal_passes_causal_and_fit():
    q, k = _qk(2, 8)
    mask = NoDiagonal(Window(3)).predict(q, k, causal=True)
    assert torch.equal(mask, Window(3).predict(q, k) & causal_mask(8, 8) & ~torch.eye(8).bool())
    static = NoDiagonal(StaticMask("structured", 0.5))
    assert static.fit(_golds(2, [8])) is static and static.predictor.rank_ is not None
    with pytest.raises(AttributeError, match="fit"):
        NoDiagonal(Window(3)).fit()


def test_no_diagonal_rejects_non_predictors():
    with pytest.raises(ValueError, match="predictor"):
        NoDiagonal("window")


# -- StaticMask: hand-checked ------------------------------------------------------------


def test_structured_keeps_the_most_frequent_offset():
    n = 4
    gold = torch.zeros(1, n, n, dtype=torch.bool)
    gold[0, 1:, :-1] |= torch.eye(n - 1, dtype=torch.bool)  # offset -1 always
    gold[0, 0, 0] = True  # offset 0 once in 4
    # Offset -1 covers 3 of 16 cells: keeping just it means sparsity 13/16.
    model = StaticMask("structured", 13 / 16).fit([gold])
    q, k = _qk(1, n)
    assert torch.equal(model.predict(q, k)[0], gold[0, :, :] & ~torch.eye(n, dtype=torch.bool))
    assert model.frequency_[0, 3 - 1].item() == 1.0  # index δ + L - 1
    assert model.frequency_[0, 3].item() == 0.25
    # Asking for a little more density adds the next offset (0), whole.
    model.target_sparsity = 0.8
    expected = gold[0] | torch.eye(n, dtype=torch.bool)
    assert torch.equal(model.predict(q, k)[0], expected)


def test_unstructured_keeps_the_most_frequent_pairs():
    golds = [torch.zeros(1, 3, 3, dtype=torch.bool) for _ in range(4)]
    for g in golds:
        g[0, 0, 2] = True  # always
    golds[0][0, 1, 1] = golds[1][0, 1, 1] = True  # half the time
    golds[0][0, 2, 0] = True  # a quarter
    model = StaticMask("unstructured", 1 - 2 / 9).fit(golds)
    mask = model.predict(*_qk(1, 3))[0]
    expected = torch.zeros(3, 3, dtype=torch.bool)
    expected[0, 2] = expected[1, 1] = True
    assert torch.equal(mask, expected)


def test_structured_prediction_is_shared_along_diagonals():
    model = StaticMask("structured", 0.7).fit(_golds(2, [12, 20], density=0.3))
    mask = model.predict(*_qk(2, 16))
    keep = model.keep()
    for h in range(2):
        for i in range(16):
            for j in range(16):
                assert mask[h, i, j].item() == keep[h, j - i + 19].item()


def test_longer_texts_keep_nothing_beyond_the_training_length():
    model = StaticMask("structured", 0.0).fit(_golds(1, [5]))
    mask = model.predict(*_qk(1, 8))[0]
    offsets = torch.arange(8)[None, :] - torch.arange(8)[:, None]
    assert torch.equal(mask, offsets.abs() <= 4)
    model = StaticMask("unstructured", 0.0).fit(_golds(1, [5]))
    mask = model.predict(*_qk(1, 8))[0]
    assert mask[:5, :5].all() and not mask[5:].any() and not mask[:, 5:].any()


# -- StaticMask: the target --------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(["structured", "unstructured"]),
    n=st.integers(2, 24),
    target=st.floats(0.0, 0.99),
    density=st.floats(0.05, 0.6),
    seed=st.integers(0, 1000),
    causal=st.booleans(),
)
def test_hits_target_on_training_length(kind, n, target, density, seed, causal):
    golds = _golds(3, [n, n], density=density, seed=seed)
    model = StaticMask(kind, target).fit(golds, causal=causal)
    mask = model.predict(*_qk(3, n), causal=causal)
    grid = n * (n + 1) / 2 if causal else n * n
    sparsity = 1 - mask.sum((1, 2)).double() / grid
    one_position = (n if kind == "structured" else 1) / grid  # the largest share
    assert (sparsity <= target + 1e-9).all()
    assert (sparsity > target - one_position - 1e-9).all()


def test_several_lengths_mean_kept_fraction_reaches_goal_minimally():
    lengths = [6, 10, 14]
    golds = _golds(2, lengths, density=0.25, seed=3)
    target = 0.6
    model = StaticMask("structured", target).fit(golds)

    def mean_density(m: StaticMask) -> torch.Tensor:
        return torch.stack([m.predict(*_qk(2, n)).double().mean((1, 2)) for n in lengths]).mean(0)

    assert (mean_density(model) >= 1 - target - 1e-9).all()
    # Dropping the last kept offset would fall below the goal.
    keep = model.keep()
    for h in range(2):
        last = (model.rank_[h] * keep[h]).argmax()
        assert model.cum_share_[h, model.rank_[h, last]] < 1 - target


def test_lower_target_only_adds_positions():
    model = StaticMask("unstructured", 0.9).fit(_golds(2, [16, 16]))
    q, k = _qk(2, 16)
    masks = []
    for t in (0.9, 0.7, 0.5, 0.2, 0.0):
        model.target_sparsity = t
        masks.append(model.predict(q, k))
    for sparse, dense in zip(masks, masks[1:], strict=False):
        assert (sparse | dense).equal(dense)
    assert masks[-1].all()


def test_causal_fit_never_keeps_the_future():
    model = StaticMask("unstructured", 0.0).fit(_golds(2, [10]), causal=True)
    mask = model.predict(*_qk(2, 10))  # not cut at predict time: the mask itself is causal
    assert torch.equal(mask, causal_mask(10, 10).expand(2, -1, -1))


def test_only_shapes_matter_and_accepts_stacked_tensor():
    golds = torch.stack(_golds(2, [8, 8, 8]))
    model = StaticMask("structured", 0.5).fit(golds)
    q, k = _qk(2, 8)
    assert torch.equal(model.predict(q, k), model.predict(q * 0, k + 1))
    same = StaticMask("structured", 0.5).fit(list(golds))
    assert torch.equal(model.predict(q, k), same.predict(q, k))


# -- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"kind": "diagonal", "target_sparsity": 0.5}, "kind"),
        ({"kind": "structured", "target_sparsity": 1.0}, "target_sparsity"),
        ({"kind": "structured", "target_sparsity": -0.1}, "target_sparsity"),
        ({"kind": "structured", "target_sparsity": True}, "target_sparsity"),
        ({"kind": "unstructured", "target_sparsity": "0.5"}, "target_sparsity"),
    ],
)
def test_bad_hyperparameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        StaticMask(**kwargs)


def test_predict_before_fit():
    with pytest.raises(RuntimeError, match="fit"):
        StaticMask("structured", 0.5).predict(*_qk(1, 4))


def test_target_changed_to_invalid_after_fit():
    model = StaticMask("structured", 0.5).fit(_golds(1, [4]))
    model.target_sparsity = 1.5
    with pytest.raises(ValueError, match="target_sparsity"):
        model.predict(*_qk(1, 4))


@pytest.mark.parametrize(
    ("golds", "match"),
    [
        ([], "empty"),
        ([torch.zeros(2, 4, 4)], "bool"),
        ([torch.zeros(2, 4, 5, dtype=torch.bool)], "shape"),
        ([torch.zeros(4, 4, dtype=torch.bool)], "shape"),
        ([torch.zeros(2, 4, 4, dtype=torch.bool), torch.zeros(3, 4, 4, dtype=torch.bool)], "heads"),
    ],
)
def test_bad_gold_masks(golds, match):
    with pytest.raises(ValueError, match=match):
        StaticMask("structured", 0.5).fit(golds)


def test_heads_must_match_fit():
    model = StaticMask("structured", 0.5).fit(_golds(2, [6]))
    with pytest.raises(ValueError, match="heads"):
        model.predict(*_qk(3, 6))


def _fitted(kind: str, n: int = 6, heads: int = 2, seed: int = 0, causal: bool = False):
    gen = torch.Generator().manual_seed(seed)
    golds = [torch.rand(heads, n, n, generator=gen) < 0.4 for _ in range(3)]
    return StaticMask(kind, 0.6).fit(golds, causal=causal)


@pytest.mark.parametrize("kind", ["structured", "unstructured"])
def test_prefix_keys_causal_and_empty_sides(kind):
    """(n, m) with m > n: query i is aligned with key i + m - n (the last rows of (m, m))."""
    mask = _fitted(kind)
    q, k = torch.zeros(2, 6, 3), torch.zeros(2, 6, 3)
    full = mask.predict(q, k)
    assert torch.equal(mask.predict(torch.zeros(2, 4, 3), k), full[:, 2:])
    assert torch.equal(mask.predict(q, k, causal=True), full & causal_mask(6, 6))
    assert mask.predict(torch.zeros(2, 0, 3), k).shape == (2, 0, 6)
    assert mask.predict(q, torch.zeros(2, 0, 3)).shape == (2, 6, 0)
    one = mask.predict(torch.zeros(2, 1, 3), torch.zeros(2, 1, 3))
    assert torch.equal(one, full[:, :1, :1])


def test_no_diagonal_equality_and_fit_message():
    from sparsefinder.predictors import Distance

    assert NoDiagonal(Distance(1.0)) == NoDiagonal(Distance(1.0))
    assert NoDiagonal(Distance(1.0)) != NoDiagonal(Distance(2.0))
    assert NoDiagonal(Distance(1.0)) != Distance(1.0)
    with pytest.raises(AttributeError, match=r"^Distance has no fit\(\); nothing to fit$"):
        NoDiagonal(Distance(1.0)).fit()


def test_fit_messages_and_fitted_state():
    with pytest.raises(ValueError, match=r"^gold_masks is empty; pass at least one bool "
                                         r"\(heads, n, n\) graph$"):
        StaticMask("structured", 0.5).fit([])
    with pytest.raises(ValueError, match=r"gold_masks\[1\] has 3 heads but gold_masks\[0\] "
                                         r"has 2; "):
        StaticMask("structured", 0.5).fit([torch.ones(2, 3, 3, dtype=torch.bool),
                                           torch.ones(3, 3, 3, dtype=torch.bool)])
    with pytest.raises(ValueError, match=r"got torch.float32"):
        StaticMask("structured", 0.5).fit([torch.ones(2, 3, 3)])
    with pytest.raises(ValueError, match=r"got list"):
        StaticMask("structured", 0.5).fit([[True]])
    with pytest.raises(RuntimeError, match=r"^this StaticMask is not fitted; call "
                                           r"fit\(gold_masks\) first$"):
        StaticMask("structured", 0.5).predict(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3))
    single = StaticMask("unstructured", 0.5).fit(torch.ones(2, 1, 1, dtype=torch.bool))
    assert single.max_length_ == 1 and single.share_ is not None
    causal = _fitted("structured", causal=True)
    assert causal.causal_ is True and _fitted("structured").causal_ is False
    with pytest.raises(ValueError, match=r"^this StaticMask was fitted on 2 heads but q has 3"):
        causal.predict(torch.zeros(3, 4, 2), torch.zeros(3, 4, 2))


def test_equally_frequent_offsets_are_kept_nearest_the_diagonal_first():
    # an all-True gold: every offset is as frequent as every other; offset δ holds 5 − |δ| of
    # the 25 cells. Target 0.6 keeps 10 cells: δ = 0 (5), δ = −1 (4, 9 so far), δ = +1 (13).
    full = torch.ones(1, 5, 5, dtype=torch.bool)
    q, k = _qk(1, 5)
    band = StaticMask("structured", 0.6).fit(full).predict(q, k)[0]
    assert torch.equal(band, torch.ones(5, 5, dtype=torch.bool).tril(1).triu(-1))
    # unstructured: |j − i| first, then the position index i·5 + j: the diagonal (5 cells),
    # then (0,1), (1,0), (1,2), (2,1), (2,3) (the shortest prefix holding 10 of 25 cells)
    cells = StaticMask("unstructured", 0.6).fit(full).predict(q, k)[0]
    expected = torch.eye(5, dtype=torch.bool)
    for i, j in ((0, 1), (1, 0), (1, 2), (2, 1), (2, 3)):
        expected[i, j] = True
    assert torch.equal(cells, expected)


def test_frequency_is_counted_over_every_text_that_has_the_offset():
    # text 1 (n = 2) all True; text 2 (n = 3): its diagonal and the cell (2, 0) (δ = −2)
    second = torch.eye(3, dtype=torch.bool)[None].clone()
    second[0, 2, 0] = True
    fitted = StaticMask("structured", 0.5).fit([torch.ones(1, 2, 2, dtype=torch.bool), second])
    # δ = −2: 1 of 1; −1: 1 of 1 + 2; 0: 2 + 3 of 2 + 3; +1: 1 of 3; +2: 0 of 1
    assert fitted.frequency_[0].tolist() == pytest.approx([1.0, 1 / 3, 1.0, 1 / 3, 0.0])
    # causal: the future never occurs and has frequency 0
    causal = StaticMask("structured", 0.5).fit(torch.ones(1, 3, 3, dtype=torch.bool),
                                                causal=True)
    assert causal.frequency_[0].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_no_diagonal_fit_passes_keyword_arguments():
    static = NoDiagonal(StaticMask("structured", 0.5))
    static.fit(_golds(2, [8]), causal=True)
    assert static.predictor.causal_ is True


def test_gold_heads_mismatch_message():
    with pytest.raises(ValueError, match=r"^gold_masks\[1\] has 3 heads but gold_masks\[0\] has "
                                         r"2; fit one StaticMask per layer$"):
        StaticMask("structured", 0.5).fit([torch.ones(2, 4, 4, dtype=torch.bool),
                                           torch.ones(3, 4, 4, dtype=torch.bool)])
