"""Precision, exact fraction, attention-mass recall and block recall (issue 10)."""

from __future__ import annotations

import pytest
import torch
from tolerances import ratio_tol

from sparsefinder.attention.masks import causal_mask
from sparsefinder.metrics.measures import (
    block_graph,
    block_recall,
    exact_fraction,
    mass_recall,
    precision,
    recall,
)

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


def _mask(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)[None]


GOLD = _mask([[1, 1, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1]])
PRED = _mask([[1, 0, 0, 1], [0, 1, 1, 0], [0, 0, 1, 1]])


def test_precision_by_hand():
    # pred has 6 pairs, 4 of them gold
    assert precision(PRED, GOLD).tolist() == [pytest.approx(4 / 6)]
    assert precision(GOLD, GOLD).tolist() == [1.0]


def test_precision_empty_prediction_is_one_and_causal_ignores_future():
    empty = torch.zeros_like(GOLD)
    assert precision(empty, GOLD).tolist() == [1.0]
    gold = torch.eye(3, dtype=torch.bool)[None]
    pred = torch.ones(1, 3, 3, dtype=torch.bool)  # 3 gold of 6 allowed; 3 future pairs
    assert precision(pred, gold).tolist() == [pytest.approx(3 / 9)]
    assert precision(pred, gold, causal=True).tolist() == [pytest.approx(3 / 6)]


def test_exact_fraction_by_hand():
    # row 0 misses (0,1); rows 1 and 2 are fully covered
    assert exact_fraction(PRED, GOLD).tolist() == [pytest.approx(2 / 3)]
    assert exact_fraction(torch.zeros_like(GOLD), GOLD).tolist() == [0.0]
    # a row without gold edges counts as exact
    gold = _mask([[0, 0], [1, 0]])
    assert exact_fraction(torch.zeros_like(gold), gold).tolist() == [0.5]


def test_exact_fraction_is_one_iff_recall_is_one():
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        gold = torch.rand(4, 7, 9, generator=gen) < 0.3
        pred = gold | (torch.rand(4, 7, 9, generator=gen) < 0.5)
        drop = torch.rand(4, 7, 9, generator=gen) < 0.05
        pred &= ~drop
        ex, rc = exact_fraction(pred, gold), recall(pred, gold)
        assert torch.equal(ex == 1.0, rc == 1.0)
        # adding pairs never makes a row inexact
        more = pred | (torch.rand(4, 7, 9, generator=gen) < 0.2)
        assert (exact_fraction(more, gold) >= ex).all()


def test_mass_recall_by_hand_and_bounds():
    probs = torch.tensor([[[0.7, 0.3, 0.0], [0.0, 0.0, 1.0]]])
    pred = _mask([[1, 0, 1], [0, 0, 1]])
    assert mass_recall(pred, probs).tolist() == [pytest.approx((0.7 + 1.0) / 2)]
    assert mass_recall(probs > 0, probs).tolist() == [pytest.approx(1.0)]
    assert mass_recall(torch.zeros_like(pred), probs).tolist() == [0.0]
    assert mass_recall(torch.zeros(2, 0, 3, dtype=torch.bool), torch.zeros(2, 0, 3)).tolist() == [
        1.0, 1.0,
    ]


def test_mass_recall_rejects_bad_probs():
    with pytest.raises(ValueError, match="probs"):
        mass_recall(GOLD, GOLD)
    with pytest.raises(ValueError, match="must match"):
        mass_recall(GOLD, torch.zeros(1, 3, 3))


def test_block_graph_and_block_recall_by_hand():
    gold = torch.zeros(1, 5, 5, dtype=torch.bool)
    gold[0, 0, 0] = gold[0, 4, 4] = gold[0, 1, 3] = True
    # tiles of 2: gold tiles (0,0), (2,2), (0,1)
    assert block_graph(gold, 2)[0].nonzero().tolist() == [[0, 0], [0, 1], [2, 2]]
    pred = torch.zeros_like(gold)
    pred[0, 1, 1] = True  # same tile as gold (0,0), a different pair
    pred[0, 4, 0] = True  # tile (2,0): not gold
    assert block_recall(pred, gold, 2).tolist() == [pytest.approx(1 / 3)]
    assert recall(pred, gold).tolist() == [0.0]
    assert block_recall(gold, gold, 2).tolist() == [1.0]
    assert block_recall(pred, torch.zeros_like(gold), 2).tolist() == [1.0]


def test_block_recall_causal_ignores_future_pairs():
    n = 8
    gold = torch.eye(n, dtype=torch.bool)[None]
    future_only = ~causal_mask(n, n)[None]
    # a prediction with only future pairs touches the diagonal tiles but covers nothing
    assert block_recall(future_only, gold, 4).tolist() == [pytest.approx(1.0)]
    assert block_recall(future_only, gold, 4, causal=True).tolist() == [0.0]


def test_block_recall_bounds_edge_recall_and_block_one_is_recall():
    gen = torch.Generator().manual_seed(1)
    gold = torch.rand(3, 20, 33, generator=gen) < 0.2
    pred = torch.rand(3, 20, 33, generator=gen) < 0.3
    assert torch.allclose(block_recall(pred, gold, 1), recall(pred, gold))
    # a tile is covered if ANY predicted pair is in it, so larger tiles can only help here
    r16, r64 = block_recall(pred, gold, 16), block_recall(pred, gold, 64)
    assert (r16 >= recall(pred, gold) - ratio_tol(pred.shape[-1] ** 2)).all()
    assert (r64 >= 0).all() and (r64 <= 1).all()
    with pytest.raises(ValueError, match="block"):
        block_recall(pred, gold, 0)


def test_metrics_reject_mismatched_shapes():
    for fn in (precision, exact_fraction):
        with pytest.raises(ValueError, match="must match"):
            fn(GOLD, GOLD[..., :2])
    with pytest.raises(ValueError, match="bool"):
        precision(GOLD.float(), GOLD)


def test_exact_fraction_word_path_matches_the_definition():
    gen = torch.Generator().manual_seed(2)
    for m in (8, 24, 64):  # multiples of 8 take the int64-word path
        gold = torch.rand(3, 11, m, generator=gen) < 0.2
        pred = gold & (torch.rand(3, 11, m, generator=gen) < 0.97)
        expected = 1.0 - (gold & ~pred).any(-1).double().mean(-1)
        assert torch.allclose(exact_fraction(pred, gold), expected)
        wide = torch.zeros(3, 11, m + 1, dtype=torch.bool)
        wide[..., 1:] = pred
        assert torch.allclose(exact_fraction(wide[..., 1:], gold), expected)  # not contiguous


def test_block_graph_word_path_matches_the_definition():
    gen = torch.Generator().manual_seed(4)
    for n, m, block in ((32, 64, 16), (30, 50, 16), (64, 64, 64), (20, 24, 8), (9, 13, 4)):
        mask = torch.rand(2, n, m, generator=gen) < 0.01
        nb, mb = -(-n // block), -(-m // block)
        expected = torch.zeros(2, nb, mb, dtype=torch.bool)
        for h, i, j in mask.nonzero().tolist():
            expected[h, i // block, j // block] = True
        assert torch.equal(block_graph(mask, block), expected)
        assert torch.equal(block_graph(mask.transpose(1, 2).transpose(1, 2), block), expected)


def test_mass_recall_matches_a_dense_sum():
    gen = torch.Generator().manual_seed(5)
    probs = torch.rand(4, 6, 9, generator=gen) * (torch.rand(4, 6, 9, generator=gen) < 0.5)
    pred = torch.rand(4, 6, 9, generator=gen) < 0.4
    expected = (probs * pred).sum((-2, -1)).double() / probs.sum((-2, -1)).double()
    assert torch.allclose(mass_recall(pred, probs), expected)
    assert mass_recall(pred[:, :0], probs[:, :0]).tolist() == [1.0] * 4


# ---------------------------------------------------------------- the Scorer's one pass


def _record(golds: list[torch.Tensor], causal: bool, gen: torch.Generator):
    from sparsefinder.data.records import AttentionRecord, LayerGraph

    layers = []
    for gold in golds:
        heads, n, m = gold.shape
        weights = torch.rand(heads, n, m, generator=gen) * gold
        probs = weights / weights.sum(-1, keepdim=True).clamp(min=1e-12)
        layers.append(LayerGraph(torch.zeros(heads, n, 2), torch.zeros(heads, m, 2), gold,
                                 probs[gold].float(), 1.5))
    return AttentionRecord(text="x", tokens=["t"] * golds[0].shape[1],
                           offsets=[(0, 0)] * golds[0].shape[1],
                           special=[False] * golds[0].shape[1], causal=causal, layers=layers)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [0, 1, 5, 16, 37, 64, 90])
def test_scorer_extras_equal_the_metric_functions(causal, n):
    from sparsefinder.metrics.measures import EXTRA_METRICS, sparsity
    from sparsefinder.metrics.scorer import Scorer

    gen = torch.Generator().manual_seed(n)
    golds = []
    for density in (0.05, 0.3):
        gold = torch.rand(4, n, n, generator=gen) < density
        gold[0] = False  # a head without gold edges
        if n:
            gold[1, 0] = False  # a row without gold edges
        if causal:
            gold &= causal_mask(n, n)
        golds.append(gold)
    record = _record(golds, causal, gen)
    scorer = Scorer(record)
    for trial in range(3):
        preds = [(torch.rand(4, n, n, generator=gen) < 0.2 * trial) | (g & (torch.rand(
            4, n, n, generator=gen) < 0.9)) for g in golds]
        scores = scorer.score(preds)
        assert set(scores.metrics()) == {"recall", "sparsity", *EXTRA_METRICS}
        for layer, (pred, gold) in enumerate(zip(preds, golds, strict=True)):
            probs = record.layers[layer].probs()
            expected = {
                "recall": recall(pred & causal_mask(n, n) if causal else pred, gold),
                "sparsity": sparsity(pred, causal=causal),
                "precision": precision(pred, gold, causal=causal),
                "exact_fraction": exact_fraction(pred, gold),
                "mass_recall": mass_recall(pred, probs),
                "block_recall16": block_recall(pred, gold, 16, causal=causal),
                "block_recall64": block_recall(pred, gold, 64, causal=causal),
            }
            for name, value in expected.items():
                got = getattr(scores, name)[layer]
                assert got.dtype == torch.float64, name
                if name in ("recall", "sparsity"):  # integer counts: exactly equal
                    assert torch.equal(got, value), name
                else:  # mass_recall: the function sums float32 probabilities (2n terms)
                    atol = ratio_tol(2 * n, torch.float32) if name == "mass_recall" \
                        else ratio_tol(n * n)
                    assert torch.allclose(got, value, rtol=0, atol=atol), (name, got, value)
        basic = Scorer(record, extra=False).score(preds)
        assert basic.precision is None
        assert torch.equal(basic.recall, scores.recall)
        assert torch.equal(basic.sparsity, scores.sparsity)


@pytest.mark.parametrize("block", [8, 16, 24, 64])
def test_block_graph_fast_path_equals_the_definition(block):
    gen = torch.Generator().manual_seed(block)
    for n, m in ((block * 3, block * 2), (37, 100), (1, 9)):
        mask = torch.rand(3, n, m, generator=gen) < 0.02
        tiles = block_graph(mask, block)
        nb, mb = -(-n // block), -(-m // block)
        expected = torch.zeros(3, nb, mb, dtype=torch.bool)
        for i in range(nb):
            for j in range(mb):
                expected[:, i, j] = mask[:, i * block:(i + 1) * block,
                                         j * block:(j + 1) * block].flatten(1).any(-1)
        assert torch.equal(tiles, expected)


# ---------------------------------------------------------------- edges of the fast paths


def _tiles_by_definition(mask: torch.Tensor, block: int) -> torch.Tensor:
    *lead, n, m = mask.shape
    nb, mb = -(-n // block), -(-m // block)
    expected = torch.zeros(*lead, nb, mb, dtype=torch.bool)
    for i in range(nb):
        for j in range(mb):
            expected[..., i, j] = mask[..., i * block:(i + 1) * block,
                                       j * block:(j + 1) * block].flatten(-2).any(-1)
    return expected


@pytest.mark.parametrize("block", [8, 9, 18, 72])
def test_block_graph_with_more_leading_axes_and_whole_query_tiles(block):
    gen = torch.Generator().manual_seed(block + 1)
    # (layers, heads, n, m): n a whole number of tiles and m not, and both whole
    for n, m in ((block * 2, block + 3), (block * 2, block * 3)):
        mask = torch.rand(2, 3, n, m, generator=gen) < 0.02
        assert torch.equal(block_graph(mask, block), _tiles_by_definition(mask, block))


@pytest.mark.parametrize("offset", [1, 8, 9])
def test_block_graph_of_a_view_at_any_storage_offset(offset):
    gen = torch.Generator().manual_seed(offset)
    base = torch.rand(offset + 2 * 32 * 32, generator=gen) < 0.02
    mask = base[offset:].view(2, 32, 32)  # contiguous, but not aligned to an int64 word
    assert torch.equal(block_graph(mask, 16), _tiles_by_definition(mask, 16))


def test_block_graph_refuses_a_bool_or_float_block():
    with pytest.raises(ValueError, match=r"^block must be an integer >= 1, got True$"):
        block_graph(GOLD, True)
    with pytest.raises(ValueError, match=r"^block must be an integer >= 1, got 2.0$"):
        block_graph(GOLD, 2.0)


def test_block_recall_of_a_single_gold_tile():
    gold = torch.zeros(1, 4, 4, dtype=torch.bool)
    gold[0, 0, 0] = True  # one gold tile of 2
    pred = torch.zeros_like(gold)
    pred[0, 3, 3] = True
    assert block_recall(pred, gold, 2).tolist() == [0.0]
    assert block_recall(gold, gold, 2).tolist() == [1.0]


def test_exact_fraction_with_more_leading_axes_and_word_sized_queries():
    gen = torch.Generator().manual_seed(9)
    for n, m in ((8, 5), (16, 8), (5, 16)):  # only m decides the word path
        gold = torch.rand(2, 3, n, m, generator=gen) < 0.3
        pred = gold & (torch.rand(2, 3, n, m, generator=gen) < 0.9)
        expected = 1.0 - (gold & ~pred).any(-1).double().mean(-1)
        assert torch.allclose(exact_fraction(pred, gold), expected)
    empty = torch.zeros(2, 0, 3, dtype=torch.bool)
    assert exact_fraction(empty, empty).tolist() == [1.0, 1.0]
    no_keys = torch.zeros(2, 3, 0, dtype=torch.bool)  # rows without keys have no gold edge
    assert exact_fraction(no_keys, no_keys).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("offset", [1, 3, 8, 9])
def test_exact_fraction_of_views_at_any_storage_offset(offset):
    gen = torch.Generator().manual_seed(offset)

    def view(density: float) -> torch.Tensor:  # contiguous, starting `offset` bytes in
        return (torch.rand(offset + 2 * 5 * 16, generator=gen) < density)[offset:].view(2, 5, 16)

    gold, pred = view(0.3), view(0.6)
    for p in (pred, pred | gold):
        expected = 1.0 - (gold & ~p).any(-1).double().mean(-1)
        assert torch.allclose(exact_fraction(p, gold), expected)
    # a 3-d mask whose query count (not its key count) is a whole number of words
    gold, pred = torch.rand(3, 8, 5, generator=gen) < 0.3, torch.rand(3, 8, 5, generator=gen) < 0.6
    assert torch.allclose(exact_fraction(pred, gold),
                          1.0 - (gold & ~pred).any(-1).double().mean(-1))


def test_mass_recall_keeps_double_precision_and_partial_mass():
    probs = torch.tensor([[[1 / 3, 2 / 3]]], dtype=torch.float64)
    pred = _mask([[1, 0]])
    assert mass_recall(pred, probs).item() == 1 / 3  # exact in float64
    partial = torch.tensor([[[0.2, 0.3]]])  # rows need not sum to 1: a share of the total
    assert mass_recall(pred, partial).tolist() == [pytest.approx(0.4)]


def test_messages_name_the_bad_argument():
    with pytest.raises(ValueError, match=r"^pred must be a bool tensor \(heads, n, m\), got "
                                         r"torch.float32; for probabilities pass `pred > 0`$"):
        precision(GOLD.float(), GOLD)
    with pytest.raises(ValueError, match=r"^gold must be a bool tensor \(heads, n, m\), got "
                                         r"torch.float32; for probabilities pass `gold > 0`$"):
        exact_fraction(GOLD, GOLD.float())
    with pytest.raises(ValueError, match=r"^pred must be a bool tensor"):
        mass_recall(GOLD.float(), GOLD.float())
    with pytest.raises(ValueError, match=r"^probs must be a float tensor \(heads, n, m\) of "
                                         r"attention probabilities; records give them via "
                                         r"record\.layers\[l\]\.probs\(\)$"):
        mass_recall(GOLD, GOLD)


def test_metrics_stay_on_the_inputs_device():
    """The 'meta' device stands in for a GPU: every result and every mask the metrics build
    must live where the inputs are (a CPU mask there would fail or move the result)."""
    meta = torch.zeros(2, 5, 5, dtype=torch.bool, device="meta")
    none = torch.zeros(2, 0, 5, dtype=torch.bool, device="meta")
    results = [precision(meta, meta, causal=True), block_recall(meta, meta, 2, causal=True),
               exact_fraction(none, none), block_graph(none, 2),
               mass_recall(meta, torch.zeros(2, 5, 5, device="meta"))]
    assert [r.device.type for r in results] == ["meta"] * 5
    assert [tuple(r.shape) for r in results] == [(2,), (2,), (2,), (2, 0, 3), (2,)]
