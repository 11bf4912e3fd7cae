"""Coreference figures: the pronoun rows (one per pronoun token, all its antecedents outlined)
and the paper's reference point."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from tolerances import bound

from sparsefinder.analysis.coref import PairTokens
from sparsefinder.explore.coref import pronoun_rows_frame
from sparsefinder.figures.coref import pronoun_figure, reference_figure

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

TOKENS = ["[CLS]", "the", "pilot", "thanked", "the", "mechanic", "because", "he", "had", "it",
          "[SEP]"]


def _record(n: int = len(TOKENS)):
    """A stand-in record (what pronoun_rows_frame reads): row-stochastic random probs."""
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(2, n, n, generator=gen)
    probs = probs / probs.sum(-1, keepdim=True)
    layer = SimpleNamespace(probs=lambda: probs)
    return SimpleNamespace(n_tokens=n, tokens=TOKENS[:n], layers=[layer])


def _figure(pairs, pred=None):
    frame = pronoun_rows_frame(_record(), 0, 1, pairs, pred)
    return frame, pronoun_figure(frame, "L0H1")


def test_a_pronoun_with_two_antecedents_is_one_row_with_both_outlined():
    """The crash of the Coreference page: "he" with two candidates (pilot, mechanic)."""
    pairs = [PairTokens(np.array([7]), np.array([2])), PairTokens(np.array([7]), np.array([5]))]
    pred = torch.zeros(len(TOKENS), len(TOKENS), dtype=torch.bool)
    pred[7, 5] = True
    frame, fig = _figure(pairs, pred)
    gold, predicted, marks, marks2 = fig.data
    assert isinstance(fig, go.Figure)
    assert np.asarray(gold.z).shape == (1, len(TOKENS))
    assert list(gold.y) == ["pairs 0, 1: 7 · he"]
    assert list(gold.x) == [f"{i} · {t}" for i, t in enumerate(TOKENS)]
    expected = _record().layers[0].probs()[1][7].numpy()
    # the record's float32 probabilities, at most one rounding away in the figure's data
    np.testing.assert_allclose(np.asarray(gold.z)[0], expected, rtol=bound(1.0))
    assert np.asarray(predicted.z)[0].tolist() == [float(k == 5) for k in range(len(TOKENS))]
    for trace in (marks, marks2):
        assert sorted(trace.x) == ["2 · pilot", "5 · mechanic"]
        assert list(trace.y) == ["pairs 0, 1: 7 · he"] * 2
    notes = dict(zip(marks.x, marks.text, strict=True))
    assert notes["2 · pilot"].startswith("antecedent of pair 0")
    assert notes["5 · mechanic"].startswith("antecedent of pair 1")
    assert notes["5 · mechanic"].endswith("predicted: yes")
    assert notes["2 · pilot"].endswith("predicted: no")
    assert [t.showlegend for t in (marks, marks2)] == [True, False]


def test_rows_follow_the_text_and_each_pronoun_lists_its_pairs():
    """Three pronoun tokens, two of them with two candidates and shared antecedents."""
    pairs = [PairTokens(np.array([9]), np.array([5])),
             PairTokens(np.array([7]), np.array([2])),
             PairTokens(np.array([7]), np.array([5])),
             PairTokens(np.array([9]), np.array([3])),
             PairTokens(np.array([8]), np.array([1, 2]))]
    frame, fig = _figure(pairs)
    gold, _, marks, _ = fig.data
    assert list(gold.y) == ["pairs 1, 2: 7 · he", "pair 4: 8 · had", "pairs 0, 3: 9 · it"]
    assert np.asarray(gold.z).shape == (3, len(TOKENS))
    outlined = sorted(zip(marks.y, marks.x, strict=True))
    assert outlined == sorted([
        ("pairs 1, 2: 7 · he", "2 · pilot"), ("pairs 1, 2: 7 · he", "5 · mechanic"),
        ("pair 4: 8 · had", "1 · the"), ("pair 4: 8 · had", "2 · pilot"),
        ("pairs 0, 3: 9 · it", "3 · thanked"), ("pairs 0, 3: 9 · it", "5 · mechanic")])
    assert fig.layout.height == 140 + 34 * 3
    assert fig.layout.yaxis.autorange == "reversed"  # read top-down, like the text


@pytest.mark.parametrize("per_pronoun", [1, 2, 3])
def test_any_number_of_antecedents_draws(per_pronoun):
    pairs = [PairTokens(np.array([p]), np.array([a]))
             for p in (7, 9) for a in (2, 5, 1)[:per_pronoun]]
    _, fig = _figure(pairs)
    assert np.asarray(fig.data[0].z).shape == (2, len(TOKENS))
    assert len(fig.data[2].x) == 2 * per_pronoun


def test_reference_figure_skips_undefined_recall():
    fig = reference_figure([("p01", 0.5, 0.7), ("none", float("nan"), 0.9)])
    assert [t.name for t in fig.data] == ["paper", "p01"]
