"""Sparse-consistency of a whole forward pass on the default model (paper Prop. 1).

Every layer restricted to a graph that contains its own gold graph (recall 1 everywhere:
a predicted Sparsefinder graph united with the gold graph of that layer's restricted-run
q/k) gives the full-entmax model output: bit for bit with the ``entmax`` package's
sort-based functions, and the same support with values equal up to float rounding of τ with
the fast solver (its τ depends on which blocks of keys it kept). That half runs the model in
float64 (a copy), where the rounding of τ is bounded far below any change of graph
(tests/tolerances.py: :func:`on_threshold`, :func:`prob_tol`, :func:`forward_tol`).
"""

from __future__ import annotations

import pytest
import torch
from tolerances import assert_same_support, forward_tol, on_threshold, prob_tol, support_size

from sparsefinder.attention.entmax_ops import entmax_normalize, reference_mode
from sparsefinder.attention.interface import AttentionCall, capture
from sparsefinder.bundle import bundle
from sparsefinder.data.corpus import default_corpus
from sparsefinder.evaluation.restricted import LayerInputs, predictor_graph, restrict
from sparsefinder.predictors import Distance, Union, Window
from sparsefinder.projections.heads import HeadProjections

pytestmark = [pytest.mark.slow, pytest.mark.numerical]


def _texts(tokenizer) -> list[str]:
    """A long text (~230 tokens: the fast solver runs) and a short one (padding)."""
    passages = default_corpus("train")
    long = " ".join(passages[:4])
    ids = tokenizer(long, truncation=True, max_length=230)["input_ids"]
    return [tokenizer.decode(ids[1:-1]), passages[5][:200]]


def _gold_union(loaded, projections):
    predicted = predictor_graph(lambda layer: Union(Distance(1.0), Window(3)), "projected",
                                projections)

    def graph(inputs: LayerInputs) -> torch.Tensor:
        scores = inputs.query @ inputs.key.transpose(-1, -2) * inputs.scaling
        gold = entmax_normalize(scores, loaded.alpha, inputs.valid[:, None, None, :]) > 0
        return gold | predicted(inputs)

    return graph


def _run(loaded, batch, graph_fn=None):
    calls: list[AttentionCall] = []
    with torch.inference_mode(), capture(calls.append):
        if graph_fn is None:
            return loaded.model(**batch, output_hidden_states=True), calls
        with restrict(loaded.model, graph_fn):
            return loaded.model(**batch, output_hidden_states=True), calls


def test_recall_one_gives_the_full_entmax_forward(default_model, default_model64) -> None:
    loaded = default_model
    projections = HeadProjections.load(bundle().path("projections.pt"),
                                       expected_model_id=loaded.model_id)
    batch = loaded.tokenizer(_texts(loaded.tokenizer), padding=True, return_tensors="pt")
    assert batch["input_ids"].shape[1] > 200
    real = batch["attention_mask"].bool()
    graph = _gold_union(loaded, projections)

    with reference_mode():
        full, _ = _run(loaded, batch)
        restricted, _ = _run(loaded, batch, graph)
    for a, b in zip(full.hidden_states, restricted.hidden_states, strict=True):
        assert torch.equal(a[real], b[real])

    model64 = default_model64
    graph = _gold_union(model64, projections)
    full, full_calls = _run(model64, batch)
    restricted, calls = _run(model64, batch, graph)
    f64 = torch.float64
    for a, b in zip(full_calls, calls, strict=True):
        kept = support_size(a.probs, b.probs)  # same support, up to keys on the threshold
        assert_same_support(a.probs, b.probs, slack=on_threshold(loaded.alpha, kept, f64))
        assert b.allowed.float().mean() < 0.5  # the graph really was sparse
        torch.testing.assert_close(a.probs, b.probs, rtol=0,
                                   atol=2 * prob_tol(kept, loaded.alpha, f64))
    n = batch["input_ids"].shape[1]
    for a, b in zip(full.hidden_states, restricted.hidden_states, strict=True):
        torch.testing.assert_close(a[real], b[real],
                                   **forward_tol(model64.model.config, a[real], n))


def test_missing_gold_edges_change_the_output(default_model) -> None:
    loaded = default_model
    projections = HeadProjections.load(bundle().path("projections.pt"),
                                       expected_model_id=loaded.model_id)
    batch = loaded.tokenizer(_texts(loaded.tokenizer), padding=True, return_tensors="pt")
    real = batch["attention_mask"].bool()
    graph = predictor_graph(lambda layer: Union(Distance(1.0), Window(3)), "projected",
                            projections)
    full, _ = _run(loaded, batch)
    restricted, _ = _run(loaded, batch, graph)
    cos = torch.nn.functional.cosine_similarity(full.last_hidden_state[real],
                                                restricted.last_hidden_state[real], dim=-1)
    assert cos.mean() < 0.999
