"""Calibrated distance: per-head thresholds for a target sparsity/recall, fitted on train."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.calibration.estimators import CalibratedDistance, CalibratedRowFraction
from sparsefinder.calibration.samples import DistanceSamples
from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.metrics.measures import recall, score_layers, sparsity
from sparsefinder.metrics.scorer import macro_average
from sparsefinder.predictors import Distance
from sparsefinder.predictors.row_fraction import RowFraction
from sparsefinder.predictors.threshold_distance import ThresholdDistance
from sparsefinder.projections.heads import HeadProjections

HEADS, D, LAYERS = 3, 6, 2


def _record(gen: torch.Generator, n: int, causal: bool = False) -> AttentionRecord:
    """Heads of different scales and gold densities: head h keeps the (2 + 3h) nearest keys,
    except head 2 whose gold keys are random (the distance tells nothing about them)."""
    layers = []
    for _ in range(LAYERS):
        scale = torch.tensor([0.5, 1.0, 3.0])[:, None, None]
        q = torch.randn(HEADS, n, D, generator=gen) * scale
        k = torch.randn(HEADS, n, D, generator=gen) * scale
        scores = -torch.cdist(q, k)
        if causal:
            scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -1e9)
        keep = torch.tensor([2, 5, 8])[:, None, None].clamp(max=n)
        scores[2] = torch.rand(n, n, generator=gen)
        ranks = scores.argsort(-1, descending=True).argsort(-1)
        gold = ranks < keep
        if causal:
            gold &= torch.ones(n, n, dtype=torch.bool).tril()
        layers.append(LayerGraph(q, k, gold, torch.ones(int(gold.sum())), D**-0.5))
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=causal, layers=layers)


def _identity() -> HeadProjections:
    weight = torch.eye(D).expand(LAYERS, HEADS, D, D).clone()
    return HeadProjections(weight=weight, bias=torch.zeros(LAYERS, HEADS, D),
                           model_id="synthetic", alpha=1.5)


def _records(seed: int, count: int, causal: bool = False) -> list[AttentionRecord]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(12, 60, (count,), generator=gen).tolist()
    return [_record(gen, n, causal) for n in lengths]


@pytest.fixture(scope="module")
def train() -> list[AttentionRecord]:
    return _records(0, 40)


@pytest.fixture(scope="module")
def held_out() -> list[AttentionRecord]:
    return _records(1, 40)


@pytest.fixture(scope="module")
def samples(train) -> DistanceSamples:
    return DistanceSamples.from_records(train, _identity(), samples_per_text=512)


def _scores(model: CalibratedDistance, records: list[AttentionRecord]) -> dict:
    projections = _identity()
    per_text = []
    for record in records:
        preds = [model.predict(q, k, causal=record.causal, layer=i)
                 for i, (q, k) in enumerate(projections.project_record(record))]
        per_text.append(score_layers(preds, record.gold_masks(), causal=record.causal))
    return macro_average(per_text)


def test_threshold_distance_equals_distance_with_one_threshold() -> None:
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(HEADS, 7, 4, generator=gen), torch.randn(HEADS, 9, 4, generator=gen)
    for causal in (False, True):
        ours = ThresholdDistance(torch.full((HEADS,), 1.7**2)).predict(q, k, causal=causal)
        assert torch.equal(ours, Distance(1.7).predict(q, k, causal=causal))
    t2 = torch.tensor([-1.0, 0.5, 100.0])  # nothing, some, everything
    mask = ThresholdDistance(t2).predict(q, k)
    assert not mask[0].any() and mask[2].all() and 0 < mask[1].sum() < mask[1].numel()


@pytest.mark.parametrize("target", [0.6, 0.8, 0.9, 0.95])
def test_equal_allocation_meets_target_sparsity_on_held_out(samples, held_out, target) -> None:
    model = CalibratedDistance(target_sparsity=target).fit(samples)
    assert model.sq_thresholds_.shape == (LAYERS, HEADS)
    # every head on its own meets the target on train (estimate), and held out on average
    assert torch.allclose(model.train_sparsity_, torch.tensor(target, dtype=torch.float64),
                          atol=2e-3)
    scores = _scores(model, held_out)
    assert abs(scores["sparsity"] - target) < 0.01
    assert (scores["sparsity_per_head"] - target).abs().max() < 0.03


def test_heads_get_different_thresholds(samples) -> None:
    """Heads differ in scale (×6): one shared threshold could not give them one sparsity."""
    t2 = CalibratedDistance(target_sparsity=0.9).fit(samples).sq_thresholds_
    assert (t2[:, 2] > 10 * t2[:, 0]).all()


@pytest.mark.parametrize("target", [0.7, 0.9])
def test_target_recall(samples, train, held_out, target) -> None:
    model = CalibratedDistance(target_recall=target).fit(samples)
    assert torch.allclose(model.train_recall_, torch.tensor(target, dtype=torch.float64),
                          atol=5e-3)
    assert abs(_scores(model, held_out)["recall"] - target) < 0.03


def test_budget_allocation_beats_equal_at_the_same_sparsity(samples, held_out) -> None:
    equal = CalibratedDistance(target_sparsity=0.85).fit(samples)
    budget = CalibratedDistance(target_sparsity=0.85, allocation="budget").fit(samples)
    # same mean density on train (each head its own, different, sparsity)...
    assert abs(float(budget.train_sparsity_.mean()) - 0.85) < 0.005
    assert budget.train_sparsity_.std() > 0.02
    # ...and a higher mean recall, on train and held out
    assert budget.train_recall_.mean() > equal.train_recall_.mean() + 0.01
    ours, theirs = _scores(budget, held_out), _scores(equal, held_out)
    assert abs(ours["sparsity"] - 0.85) < 0.01
    assert ours["recall"] > theirs["recall"]


def test_budget_allocation_for_a_target_recall(samples) -> None:
    budget = CalibratedDistance(target_recall=0.9, allocation="budget").fit(samples)
    equal = CalibratedDistance(target_recall=0.9).fit(samples)
    assert float(budget.train_recall_.mean()) >= 0.9
    assert float(budget.train_recall_.mean()) < 0.91
    assert budget.train_sparsity_.mean() > equal.train_sparsity_.mean()  # fewer kept pairs


def test_causal_records_count_only_allowed_pairs() -> None:
    train, held_out = _records(4, 30, causal=True), _records(5, 30, causal=True)
    model = CalibratedDistance(target_sparsity=0.8).fit_records(train, _identity(), 512)
    scores = _scores(model, held_out)
    assert abs(scores["sparsity"] - 0.8) < 0.01
    q, k = _identity().project_record(held_out[0])[0]
    assert not (model.predict(q, k, causal=True) & ~torch.ones(
        q.shape[1], k.shape[1], dtype=torch.bool).tril()).any()


def test_samples_are_deterministic_and_sorted(train) -> None:
    a = DistanceSamples.from_records(train[:5], _identity(), 64, seed=2)
    b = DistanceSamples.from_records(train[:5], _identity(), 64, seed=2)
    assert torch.equal(a.pairs, b.pairs) and torch.equal(a.gold, b.gold)
    assert a.pairs.shape == (LAYERS, HEADS, 5 * 64) and a.n_texts == 5
    assert (a.pairs.diff(dim=-1) >= 0).all()


def test_head_without_gold_edges_counts_as_recalled() -> None:
    record = _record(torch.Generator().manual_seed(6), 20)
    gold = record.layers[0].gold  # a copy (stored bit-packed): change it, then assign it
    gold[1] = False
    record.layers[0].gold = gold
    samples = DistanceSamples.from_records([record], _identity(), 32)
    assert torch.isinf(samples.gold[0, 1]).all()
    model = CalibratedDistance(target_recall=0.5).fit(samples)
    assert torch.isfinite(model.sq_thresholds_).all()


def test_default_model_short_texts(default_model) -> None:
    """Real attention graphs and the bundled projections: the target is met on the texts the
    thresholds were fitted on (estimation is per text, so this holds for a handful)."""
    from sparsefinder.bundle import bundle
    from sparsefinder.data.records import extract

    projections = HeadProjections.load(bundle().path("projections.pt"))
    texts = ["The cat sat on the mat because it was tired.",
             "Sparse attention keeps only a few keys for every query in a long sentence.",
             "She gave him the book, and he thanked her for it the next morning."]
    records = extract(default_model, texts)
    model = CalibratedDistance(target_sparsity=0.8).fit_records(records, projections, 4096)
    per_text = []
    for record in records:
        projected = projections.project_record(record)
        preds = [model.predict(q, k, layer=i) for i, (q, k) in enumerate(projected)]
        per_text.append(score_layers(preds, record.gold_masks()))
    assert abs(macro_average(per_text)["sparsity"] - 0.8) < 0.02
    graph = records[0].layers[0]
    q, k = projected_first = projections.project_record(records[0])[0]
    assert projected_first[0].shape[-1] == projections.dim
    assert 0 < float(recall(model.predict(q, k), graph.gold).mean()) <= 1
    assert sparsity(model.predict(q, k)).shape == (projections.num_heads,)


def test_errors(samples) -> None:
    with pytest.raises(ValueError, match="exactly one of"):
        CalibratedDistance().fit(samples)
    with pytest.raises(ValueError, match="exactly one of"):
        CalibratedDistance(target_sparsity=0.9, target_recall=0.9).fit(samples)
    with pytest.raises(ValueError, match=r"target_sparsity must be a number in \(0, 1\)"):
        CalibratedDistance(target_sparsity=1.0).fit(samples)
    with pytest.raises(ValueError, match="allocation must be one of"):
        CalibratedDistance(target_sparsity=0.9, allocation="greedy").fit(samples)
    with pytest.raises(ValueError, match="not fitted"):
        CalibratedDistance(target_sparsity=0.9).for_layer(0)
    with pytest.raises(TypeError, match="fit_records"):
        CalibratedDistance(target_sparsity=0.9).fit([])
    with pytest.raises(ValueError, match="at least one TRAIN record"):
        DistanceSamples.from_records([], _identity())
    fitted = CalibratedDistance(target_sparsity=0.9).fit(samples)
    with pytest.raises(ValueError, match="layer must be in"):
        fitted.for_layer(LAYERS)
    with pytest.raises(ValueError, match="calibrated for 3 heads"):
        fitted.predict(torch.zeros(2, 4, D), torch.zeros(2, 4, D))
    with pytest.raises(ValueError, match="NaN"):
        ThresholdDistance(torch.tensor([float("nan")]))


# ---------------------------------------------------------------- per-row keep fraction


def test_row_fraction_keeps_the_nearest_keys_of_every_row() -> None:
    gen = torch.Generator().manual_seed(7)
    q, k = torch.randn(HEADS, 9, 4, generator=gen), torch.randn(HEADS, 10, 4, generator=gen)
    mask = RowFraction(torch.tensor([0.0, 0.35, 1.0])).predict(q, k)
    assert not mask[0].any() and mask[2].all()
    assert (mask[1].sum(-1) == 3).all()  # floor(0.35 * 10)
    dist = torch.cdist(q, k)[1]
    kept_max = dist.masked_fill(~mask[1], -1).amax(-1)
    dropped_min = dist.masked_fill(mask[1], torch.inf).amin(-1)
    assert (kept_max <= dropped_min).all()
    causal = RowFraction(torch.full((HEADS,), 0.5)).predict(q, q, causal=True)
    assert torch.equal(causal.sum(-1)[0], torch.arange(1, 10) // 2)
    assert not (causal & ~torch.ones(9, 9, dtype=torch.bool).tril()).any()
    with pytest.raises(ValueError, match=r"fractions must lie in \[0, 1\]"):
        RowFraction(torch.tensor([1.5]))


def test_row_fraction_sparsity_does_not_drift_with_length(held_out) -> None:
    model = CalibratedRowFraction(target_sparsity=0.9).fit(
        DistanceSamples.from_records(held_out[:3], _identity(), 64, rank_fractions=True))
    for record in held_out:
        q, k = _identity().project_record(record)[0]
        s = sparsity(model.predict(q, k))
        assert (s >= 0.9 - 1e-9).all() and (s < 0.9 + 1 / record.n_tokens + 1e-9).all()


def test_calibrated_row_fraction_recall_target_and_budget(held_out) -> None:
    train = _records(8, 40)
    fractions = DistanceSamples.from_records(train, _identity(), 256, rank_fractions=True)
    assert fractions.gold_fraction.shape == fractions.gold.shape
    assert (fractions.gold_fraction[torch.isfinite(fractions.gold_fraction)] <= 1).all()
    by_recall = CalibratedRowFraction(target_recall=0.8).fit(fractions)
    # rank fractions are discrete (1/m steps): the quantile reaches the target, a little over
    assert (by_recall.train_recall_ >= 0.8).all() and (by_recall.train_recall_ < 0.83).all()
    assert abs(_scores(by_recall, held_out)["recall"] - 0.8) < 0.05
    equal = CalibratedRowFraction(target_sparsity=0.85).fit(fractions)
    budget = CalibratedRowFraction(target_sparsity=0.85, allocation="budget").fit(fractions)
    assert abs(float(budget.train_sparsity_.mean()) - 0.85) < 0.005
    ours, theirs = _scores(budget, held_out), _scores(equal, held_out)
    assert 0.85 <= ours["sparsity"] < 0.87 and 0.85 <= theirs["sparsity"] < 0.87
    assert ours["recall"] > theirs["recall"]
    with pytest.raises(TypeError, match="rank_fractions=True"):
        CalibratedRowFraction(target_sparsity=0.9).fit(
            DistanceSamples.from_records(train[:2], _identity(), 8))


@pytest.mark.parametrize("causal", [True, False])
def test_predict_of_a_local_layer_stays_inside_its_window(causal) -> None:
    """A calibrated estimator's own ``predict`` agrees with ``predict_record``: a local
    layer's keep fraction is spent on its window, and nothing outside it is kept."""
    from sparsefinder.attention.masks import layer_allowed

    records = _records(0, 3, causal=causal)
    samples = DistanceSamples.from_records(records, _identity(), rank_fractions=True)
    q, k = records[0].layers[0].queries, records[0].layers[0].keys
    n, window = q.shape[1], 4
    allowed = layer_allowed(n, n, causal=causal, sliding_window=window)
    rowfrac = CalibratedRowFraction(target_sparsity=0.5).fit(samples)
    mask = rowfrac.predict(q, k, causal=causal, sliding_window=window)
    assert not mask[:, ~allowed].any()
    expected = RowFraction(rowfrac.fractions_[0]).predict(q, k, causal=causal,
                                                          sliding_window=window)
    assert torch.equal(mask, expected)
    distance = CalibratedDistance(target_sparsity=0.5).fit(samples)
    cut = distance.predict(q, k, causal=causal, sliding_window=window)
    assert torch.equal(cut, distance.predict(q, k, causal=causal) & allowed)
