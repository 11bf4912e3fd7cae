"""Per-head sums: the right values on hand-made heads, and exact when split and added."""

from __future__ import annotations

import math

import pytest
import torch
from synthetic_heads import KINDS, synthetic_record
from tolerances import bound

from sparsefinder.analysis.atlas_stats import (
    ROW_STATS,
    HeadSums,
    hist_quantile,
    punctuation_mask,
    row_features,
)
from sparsefinder.metrics.scorer import Scorer

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


def _sums(records):
    sums = HeadSums.zeros(records[0].num_layers, records[0].num_heads)
    for record in records:
        sums.add_record(record, Scorer(record, extra=False).gold_sparsity)
    return sums


def test_row_features_of_hand_made_heads():
    record = synthetic_record(16)
    punct = punctuation_mask(record.tokens, record.special)
    assert punct.sum() == 1 and not punct[0] and not punct[-1]
    features = row_features(record.layers[0], False, punct)
    assert set(features) == set(ROW_STATS)
    k = {kind: i for i, kind in enumerate(KINDS)}
    prev = features["previous"][k["previous"]]
    # the heads' probabilities are float32 (0.9 is 0.8999999762): one rounding of values ≤ 1,
    # then a sum over the row's 16 keys
    tol = {"rtol": 0.0, "atol": bound(1.0, terms=16 + 1)}
    assert prev[0] == 0
    torch.testing.assert_close(prev[1:], torch.full((15,), 0.9, dtype=prev.dtype), **tol)
    torch.testing.assert_close(features["next"][k["next"]][:-1],
                               torch.full((15,), 0.9, dtype=torch.float64), **tol)
    torch.testing.assert_close(features["first"][k["sink"]][1:],
                               torch.full((15,), 0.7, dtype=torch.float64), **tol)
    local = k["local"]
    assert features["contiguous"][local].eq(1).all()
    assert features["support"][local][5] == 5
    assert features["distance"][local][5] == pytest.approx(1.2)
    mixed = k["mixed"]
    assert features["contiguous"][mixed].eq(0).all() and features["support"][mixed].eq(2).all()
    assert features["entropy"][mixed] == pytest.approx(torch.full((16,), math.log(2)))
    broad = k["broad"]
    assert features["support_fraction"][broad] == pytest.approx(torch.full((16,), 15 / 16))
    assert features["not_full"][broad].eq(1).all()


def test_two_halves_added_equal_one_pass():
    """Counts and histograms exactly; float64 sums up to the order of the additions."""
    records = [synthetic_record(n, seed=s) for s, n in enumerate((8, 16, 40, 70, 12))]
    whole = _sums(records)
    halves = _sums(records[:2]) + _sums(records[2:])
    for name in ("texts", "rows", "sparsity_hist", "support_hist", "length_bin_texts"):
        assert torch.equal(getattr(whole, name), getattr(halves, name)), name
    torch.testing.assert_close(whole.pack(), halves.pack(), rtol=1e-13, atol=1e-12)
    assert torch.equal(whole.unpack(whole.pack()).pack(), whole.pack())
    means = whole.means()
    assert means["gold_sparsity"].shape == (1, len(KINDS))
    # gold sparsity per text of a head keeping 2 keys per row of n: 1 − 2/n
    mixed = KINDS.index("mixed")
    expected = sum(1 - 2 / n for n in (8, 16, 40, 70, 12)) / 5
    assert float(means["gold_sparsity"][0, mixed]) == pytest.approx(expected)
    # longer texts are sparser for a head with a fixed number of keys: a positive slope
    assert float(means["sparsity_per_100_tokens"][0, mixed]) > 0
    assert float(means["support_q50"][0, mixed]) == 2


def test_histogram_quantiles():
    hist = torch.tensor([[0.0, 2, 0, 1, 1]])
    assert hist_quantile(hist, 0.5, 1.0, offset=0.0).tolist() == [1.0]
    assert hist_quantile(hist, 0.9, 1.0, offset=0.0).tolist() == [4.0]
    assert hist_quantile(hist, 0.1, 0.2).tolist() == pytest.approx([0.3])


def test_no_text_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one text"):
        HeadSums.zeros(1, 2).means()
