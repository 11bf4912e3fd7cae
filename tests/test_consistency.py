"""Sparse-consistency end to end (paper Prop. 1) on the default model and a real text.

α-entmax restricted to any mask that contains the gold graph gives exactly the gold
probabilities; so a predicted graph united with the gold graph changes nothing, and a
predicted graph with recall 1 gives exactly the same attention output. "Exactly" means: the
same support and the same values up to float32 rounding of τ (its sums run over the kept
keys, whose order and blocks depend on the mask), bounded by tests/tolerances.py
(:func:`prob_tol`, :func:`on_threshold`); against the record's own gold graph, recomputed
scores add the product's rounding (:func:`score_bound`).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from tolerances import (
    assert_same_support,
    attention_output_tol,
    entmax_prob_tol,
    on_threshold,
    prob_tol,
    score_bound,
    support_bound,
    support_size,
)

from sparsefinder.attention.entmax_ops import entmax_normalize
from sparsefinder.bundle import bundle, examples_dir
from sparsefinder.data.records import extract
from sparsefinder.metrics.measures import recall
from sparsefinder.models.loading import load_model
from sparsefinder.predictors import Distance, Union, Window
from sparsefinder.projections.heads import HeadProjections

ROOT = Path(__file__).resolve().parents[1]
PROJECTIONS = bundle().path("projections.pt")
TEXT = examples_dir() / "science_news.txt"

pytestmark = [pytest.mark.slow, pytest.mark.numerical]


@pytest.fixture(scope="module")
def setup():
    loaded = load_model("default", device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (record,) = extract(loaded, TEXT.read_text(encoding="utf-8").strip()[:2000])
    projections = HeadProjections.load(PROJECTIONS, expected_model_id=loaded.model_id)
    return loaded, record, projections


def test_union_with_gold_reproduces_gold_probabilities(setup) -> None:
    loaded, record, projections = setup
    assert record.n_tokens > 50
    for layer, ((q, k), graph) in enumerate(
        zip(projections.project_record(record), record.layers, strict=True)
    ):
        pred = Union(projections.kmeans(layer, 8), Window(3)).predict(q, k)
        assert pred.float().mean() < 0.5, "the predicted graph should be sparse"
        scores = graph.scores(record.causal)
        full = entmax_normalize(scores, loaded.alpha)
        restricted = entmax_normalize(scores, loaded.alpha, allowed=pred | graph.gold)
        kept = support_size(restricted, full, graph.probs())
        alpha = loaded.alpha
        # the same scores: the same support up to keys on the threshold, p within the solvers'
        assert_same_support(restricted, full, slack=on_threshold(alpha, kept))
        torch.testing.assert_close(restricted, full, rtol=0, atol=2 * prob_tol(kept, alpha))
        # the record's gold came from the model's own product of the same q and k
        score_err = score_bound(graph.queries, graph.keys, graph.scaling)
        slack = support_bound(score_err, alpha, kept)
        assert_same_support(restricted, graph.probs(), slack=slack)
        torch.testing.assert_close(restricted, graph.probs(), rtol=0,
                                   atol=entmax_prob_tol(score_err, alpha, kept) + slack)


def test_recall_one_gives_identical_attention_output(setup) -> None:
    loaded, record, projections = setup
    gen = torch.Generator().manual_seed(0)
    checked_equal = checked_differs = 0
    for (q, k), graph in zip(projections.project_record(record), record.layers, strict=True):
        pred = Union(Distance(2.5), Window(3)).predict(q, k)
        per_head = recall(pred, graph.gold)
        scores = graph.scores(record.causal)
        full = entmax_normalize(scores, loaded.alpha)
        approx = entmax_normalize(scores, loaded.alpha, allowed=pred)
        values = torch.randn(*k.shape[:2], 16, generator=gen)
        for h in range(pred.shape[0]):
            if per_head[h] == 1.0:
                kept = support_size(approx[h], full[h])
                slack = on_threshold(loaded.alpha, kept)
                assert_same_support(approx[h], full[h], slack=slack)
                prob_err = 2 * prob_tol(kept, loaded.alpha)
                torch.testing.assert_close(approx[h], full[h], rtol=0, atol=prob_err)
                torch.testing.assert_close(
                    approx[h] @ values[h], full[h] @ values[h], rtol=0,
                    atol=attention_output_tol(prob_err, full[h], values[h], slack),
                )
                checked_equal += 1
            else:  # a missed gold edge gets probability 0: the attention changes
                assert not torch.equal(approx[h] > 0, graph.gold[h])
                checked_differs += 1
    assert checked_equal > 0, "no head reached recall 1; the check did not run"
    assert checked_differs > 0
