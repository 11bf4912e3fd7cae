"""Quest page selection: the bound is a true upper bound, the top pages are kept, causal."""

from __future__ import annotations

import pytest
import torch
from tolerances import bound

from sparsefinder.predictors.quest import QuestPages

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


def _qk(heads=3, n=50, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(heads, n, d, generator=g), torch.randn(heads, n, d, generator=g)


def test_bound_is_an_upper_bound_on_every_key_of_its_page():
    q, k = _qk(n=45)  # 45 = 2 full pages of 16 + a partial one
    quest = QuestPages(pages=1, page_size=16)
    bounds = quest.upper_bounds(q, k)
    scores = q @ k.transpose(-1, -2)
    # both are sums of d products of magnitude ≤ |q_d|·max|k_d|: 2d roundings apart at most
    slack = bound(float((q.abs() @ k.abs().amax(1, keepdim=True).transpose(-1, -2)).max()),
                  terms=2 * q.shape[-1])
    for p in range(bounds.shape[-1]):
        page_max = scores[..., p * 16:(p + 1) * 16].amax(-1)
        assert torch.all(bounds[..., p] >= page_max - slack)
    # the brute-force bound sum_d max(q_d*min_d, q_d*max_d)
    low, high = quest.page_bounds(k)
    brute = torch.maximum(q[:, :, None, :] * low[:, None], q[:, :, None, :] * high[:, None])
    torch.testing.assert_close(bounds, brute.sum(-1), rtol=0, atol=slack)


def test_keeps_the_pages_of_highest_bound_and_counts_them():
    q, k = _qk(n=64)
    quest = QuestPages(pages=2, page_size=16)
    mask = quest.predict(q, k)
    bounds = quest.upper_bounds(q, k)
    expected_pages = bounds.topk(2, dim=-1).indices.sort(-1).values
    for h in range(3):
        for i in range(64):
            kept_pages = mask[h, i].view(4, 16)
            assert torch.all(kept_pages.all(-1) | ~kept_pages.any(-1))  # whole pages
            assert kept_pages.any(-1).nonzero().flatten().tolist() == \
                expected_pages[h, i].tolist()
    # every query's best key lies in a kept page whenever its page has the top bound
    assert QuestPages(pages=4, page_size=16).predict(q, k).all()


def test_causal_never_keeps_the_future_and_ranks_only_started_pages():
    q, k = _qk(n=40)
    mask = QuestPages(pages=2, page_size=8).predict(q, k, causal=True)
    assert not mask[:, ~torch.ones(40, 40, dtype=torch.bool).tril()].any()
    assert mask[:, torch.arange(40), torch.arange(40)].sum() > 0
    # query 3 (page 0 only started) keeps keys 0..3 and nothing else
    assert torch.equal(mask[:, 3].nonzero()[:, 1].unique(), torch.arange(4))


def test_more_pages_never_lose_an_edge():
    q, k = _qk(n=70)
    masks = [QuestPages(pages=p, page_size=8).predict(q, k, causal=True) for p in (1, 2, 4, 8)]
    for small, large in zip(masks, masks[1:], strict=False):
        assert torch.all(large | ~small)


@pytest.mark.parametrize("bad", [{"pages": 0}, {"pages": 2, "page_size": 0},
                                 {"pages": True}])
def test_bad_parameters_are_named(bad):
    with pytest.raises(ValueError, match="must be an integer >= 1"):
        QuestPages(**bad)


def test_a_local_layer_picks_pages_that_reach_its_window():
    from sparsefinder.attention.masks import layer_allowed

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 64, 8, generator=g), torch.randn(2, 64, 8, generator=g)
    allowed = layer_allowed(64, 64, causal=True, sliding_window=10)
    inside = QuestPages(2, 4).predict(q, k, causal=True, sliding_window=10)
    assert not (inside & ~allowed).any()
    # both chosen pages reach the window: every row past the first page keeps a key of each
    rows = inside[:, 12:]
    assert (rows.sum(-1) >= 2).all() and (rows.sum(-1) <= 8).all()
    pages = rows.view(2, 52, 16, 4).any(-1).sum(-1)  # distinct pages kept per row
    assert (pages == 2).all()
    cut_after = QuestPages(2, 4).predict(q, k, causal=True) & allowed
    assert cut_after.sum() < inside.sum()


def _reference(quest, q, k, causal, window):
    """Quest by hand: each query ranks the pages holding a key it may reach by their upper
    bound, keeps the best ``pages`` of them, and then the keys of those it may reach."""
    heads, n, m = q.shape[0], q.shape[1], k.shape[1]
    size = quest.page_size
    bounds = quest.upper_bounds(q.double(), k.double())
    out = torch.zeros(heads, n, m, dtype=torch.bool)
    for i in range(n):
        pos = i + (m - n)
        reach = [(j <= pos if causal else True) and (abs(pos - j) < window if window else True)
                 for j in range(m)]
        pages = sorted({j // size for j in range(m) if reach[j]})
        for h in range(heads):
            best = sorted(pages, key=lambda p: -float(bounds[h, i, p]))[:quest.pages]
            for j in range(m):
                out[h, i, j] = reach[j] and j // size in best
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, 5, 9])
@pytest.mark.parametrize(("n", "m"), [(30, 30), (20, 37)])
def test_pages_match_a_hand_reference(causal, window, n, m):
    g = torch.Generator().manual_seed(n + m + (window or 0))
    q, k = torch.randn(2, n, 6, generator=g), torch.randn(2, m, 6, generator=g)
    quest = QuestPages(pages=3, page_size=4)
    got = quest.predict(q, k, causal=causal, sliding_window=window)
    assert torch.equal(got, _reference(quest, q, k, causal, window))


def test_half_precision_inputs_are_ranked_in_float32():
    q, k = _qk(n=40)
    quest = QuestPages(pages=2, page_size=4)
    for dtype in (torch.bfloat16, torch.float16):
        assert torch.equal(quest.predict(q.to(dtype), k.to(dtype), causal=True),
                           quest.predict(q.to(dtype).float(), k.to(dtype).float(), causal=True))


def test_edge_shapes():
    quest = QuestPages(pages=1, page_size=4)
    for n, m in ((0, 5), (5, 0), (0, 0)):
        out = quest.predict(torch.zeros(2, n, 3), torch.zeros(2, m, 3))
        assert out.shape == (2, n, m) and out.dtype == torch.bool
    q, k = _qk(n=6)
    one_query = quest.predict(q[:, -1:], k, causal=True)  # decoding: the last query alone
    assert torch.equal(one_query, quest.predict(q, k, causal=True)[:, -1:])
    assert one_query.any()
    assert quest.predict(q, k[:, :1]).all()  # one key: its page is every query's best


def test_masks_stay_on_the_inputs_device():
    """The meta device stands in for a GPU: every index and mask follows the inputs."""
    quest = QuestPages(pages=2, page_size=4)
    for n, m, window in ((6, 9, None), (6, 9, 3), (0, 9, None), (6, 0, None)):
        q, k = torch.zeros(2, n, 3, device="meta"), torch.zeros(2, m, 3, device="meta")
        for causal in (False, True):
            out = quest.predict(q, k, causal=causal, sliding_window=window)
            assert out.device.type == "meta" and out.shape == (2, n, m), (n, m, window)
