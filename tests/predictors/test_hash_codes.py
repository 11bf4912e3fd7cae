"""HashAttention-style codes: Hamming thresholds, training on gold graphs beats random codes."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.metrics.scorer import Scorer
from sparsefinder.predictors.hash_codes import HammingCodes
from sparsefinder.projections.hash_fit import fit_hash_codes


def _record(seed: int, n: int = 60, heads: int = 2, d: int = 8) -> AttentionRecord:
    """A causal record whose gold edges are the top-3 causal scores (a learnable target)."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(heads, n, d, generator=g), torch.randn(heads, n, d, generator=g)
    scores = (q @ k.transpose(-1, -2)).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(),
                                                   float("-inf"))
    gold = torch.zeros(heads, n, n, dtype=torch.bool)
    gold.scatter_(-1, scores.topk(3, dim=-1).indices, True)
    gold &= torch.ones(n, n, dtype=torch.bool).tril()
    layer = LayerGraph(queries=q, keys=k, gold=gold,
                       prob_values=torch.full((int(gold.sum()),), 0.3), scaling=1.0)
    return AttentionRecord(text="x", tokens=["x"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=True, layers=[layer])


def test_distance_threshold_is_hamming_distance():
    w = torch.randn(1, 4, 6)
    codes = HammingCodes(w, w.clone(), max_distance=2)
    q, k = torch.randn(1, 5, 4), torch.randn(1, 7, 4)
    cq, ck = codes.signatures(q, k)
    hamming = (cq[:, :, None, :] != ck[:, None, :, :]).sum(-1)
    assert torch.equal(codes.predict(q, k), hamming <= 2)
    full = HammingCodes(w, w.clone(), max_distance=6).predict(q, k, causal=True)
    assert torch.equal(full, torch.ones(5, 7, dtype=torch.bool).tril(2)[None])


def test_learned_codes_beat_their_random_start_on_held_out_texts():
    train = [_record(s) for s in range(6)]
    test = [_record(s) for s in range(100, 103)]
    trained = fit_hash_codes(train, bits=12, steps=150, seed=0)
    untrained = fit_hash_codes(train, bits=12, steps=0, seed=0)

    def recall_at(fitted, distance):
        wq, wk = fitted[0]
        scores = [Scorer(r).score([HammingCodes(wq, wk, distance).predict(
            r.layers[0].queries, r.layers[0].keys, causal=True)]) for r in test]
        return (sum(float(s.recall.mean()) for s in scores) / len(scores),
                sum(float(s.sparsity.mean()) for s in scores) / len(scores))

    r_trained, s_trained = recall_at(trained, 3)
    r_random, s_random = recall_at(untrained, 3)
    # better recall per kept pair: recall/(1 - sparsity) is the lift over random keeping
    assert r_trained / (1 - s_trained) > r_random / (1 - s_random)
    assert r_trained / (1 - s_trained) > 1.5


def test_bad_inputs_are_named():
    w = torch.randn(2, 4, 6)
    with pytest.raises(ValueError, match=r"max_distance must be an integer in \[0, 6\]"):
        HammingCodes(w, w, max_distance=7)
    with pytest.raises(ValueError, match="must both be"):
        HammingCodes(w, w[:1], max_distance=1)
    with pytest.raises(ValueError, match="fit them on this model"):
        HammingCodes(w, w, 1).predict(torch.randn(3, 5, 4), torch.randn(3, 5, 4))
    with pytest.raises(ValueError, match="training gold graphs"):
        fit_hash_codes([])


def test_a_zero_projection_is_a_plus_one_bit():
    w = torch.eye(2)[None]  # the code of a vector is the signs of its two coordinates
    q, k = torch.zeros(1, 1, 2), torch.tensor([[[0.5, 0.5], [0.0, 0.0], [-1.0, 0.5]]])
    codes = HammingCodes(w, w.clone(), max_distance=0)
    cq, ck = codes.signatures(q, k)
    assert cq.tolist() == [[[1.0, 1.0]]]
    assert ck.tolist() == [[[1.0, 1.0], [1.0, 1.0], [-1.0, 1.0]]]
    assert codes.predict(q, k).tolist() == [[[True, True, False]]]


def test_max_distance_bounds_and_the_non_causal_default():
    w = torch.randn(2, 4, 6)
    q, k = torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    nearest = HammingCodes(w, w.clone(), max_distance=0)  # only identical codes
    cq, ck = nearest.signatures(q, k)
    assert torch.equal(nearest.predict(q, k), (cq[:, :, None] == ck[:, None]).all(-1))
    full = HammingCodes(w, w.clone(), max_distance=6)
    assert full.predict(q, k).all() and torch.equal(full.predict(q, k),
                                                    full.predict(q, k, causal=False))
    for bad in (True, -1, 1.0):
        with pytest.raises(ValueError, match=r"^max_distance must be an integer in \[0, 6\], "):
            HammingCodes(w, w, max_distance=bad)
    with pytest.raises(ValueError, match=r"^hash maps are for \(heads, d\) = \(2, 4\), got q of "
                                         r"shape \(2, 5, 3\); fit them on this model$"):
        full.predict(torch.randn(2, 5, 3), torch.randn(2, 5, 3))


def test_maps_of_any_float_dtype_give_the_float32_codes():
    w = torch.randn(2, 4, 6, dtype=torch.float64)
    q, k = torch.randn(2, 5, 4), torch.randn(2, 7, 4)
    wide = HammingCodes(w, w.flip(-1), max_distance=2)
    single = HammingCodes(w.float(), w.flip(-1).float(), max_distance=2)
    assert [c.dtype for c in wide.signatures(q, k)] == [torch.float32] * 2
    assert torch.equal(wide.predict(q, k), single.predict(q, k))


def test_codes_stay_on_the_inputs_device():
    """The meta device stands in for a GPU: the maps and the ±1 constant follow the inputs."""
    w = torch.randn(2, 4, 6)
    q = torch.zeros(2, 5, 4, device="meta")
    codes = HammingCodes(w, w.clone(), max_distance=2)
    assert [c.device.type for c in codes.signatures(q, q)] == ["meta"] * 2
    assert codes.predict(q, q, causal=True).device.type == "meta"
