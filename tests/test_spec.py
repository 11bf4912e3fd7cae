"""sparsefinder.spec: one registry of methods, PredictorSpec values, one prediction path."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.graphs import AttentionRecord, LayerGraph
from sparsefinder.predictors import Distance, GlobalTokens, TopK, Union, Window
from sparsefinder.projections import HeadProjections
from sparsefinder.spec import (
    INPUTS,
    METHODS,
    PredictorSpec,
    RecordInputs,
    get_method,
    predict_record,
)

HEADS, D, R = 2, 6, 3


def _record(n: int = 7, layers: int = 2, causal: bool = False) -> AttentionRecord:
    gen = torch.Generator().manual_seed(n)
    graphs = []
    for _ in range(layers):
        q, k = torch.randn(HEADS, n, D, generator=gen), torch.randn(HEADS, n, D, generator=gen)
        gold = torch.rand(HEADS, n, n, generator=gen) < 0.3
        graphs.append(LayerGraph(q, k, gold, torch.ones(int(gold.sum())), D**-0.5))
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=causal, layers=graphs)


def _projections(layers: int = 2) -> HeadProjections:
    gen = torch.Generator().manual_seed(0)
    return HeadProjections(weight=torch.randn(layers, HEADS, R, D, generator=gen),
                           bias=torch.zeros(layers, HEADS, R), model_id="synthetic", alpha=1.5,
                           centroids={4: torch.randn(layers, HEADS, 4, R, generator=gen)})


def test_every_method_declares_what_it_reads_once():
    assert set(METHODS) >= {"distance", "quantization", "kmeans", "fixed", "window", "topk",
                            "longformer", "bigbird", "reformer", "routing", "sparsebert-dams",
                            "sparsebert-damu", "distance-nodiag"}
    assert all(method.inputs in INPUTS for method in METHODS.values())
    assert METHODS["topk"].inputs == "original" and METHODS["topk"].oracle
    assert METHODS["window"].inputs == "shape" and not METHODS["window"].needs_projections
    assert METHODS["distance"].needs_projections and METHODS["kmeans"].needs_projections
    assert METHODS["sparsebert-dams"].fit is not None
    with pytest.raises(ValueError, match="unknown method 'nope'.*distance"):
        get_method("nope")


def test_spec_is_a_hashable_value_and_validates_its_parameters():
    a = PredictorSpec.of("kmeans", {"top_k": 2, "n_clusters": 4}, window=3,
                         global_tokens=["last", "first"])
    b = PredictorSpec.of("kmeans", {"n_clusters": 4, "top_k": 2}, window=3,
                         global_tokens=("first", "last"))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a.params_json() == '{"n_clusters": 4, "top_k": 2}'
    assert a.label() == "kmeans n_clusters=4 top_k=2 ∪ window 3 ∪ global first+last"
    with pytest.raises(ValueError, match=r"missing \['threshold'\]"):
        PredictorSpec.of("distance", {})
    with pytest.raises(ValueError, match=r"unknown \['t'\]"):
        PredictorSpec.of("distance", {"threshold": 1.0, "t": 2})
    with pytest.raises(ValueError, match="window must be"):
        PredictorSpec.of("fixed", window=-1)
    with pytest.raises(ValueError, match="global_tokens"):
        PredictorSpec("fixed", (), 0, ("middle",))
    assert PredictorSpec.of("fixed").label() == "empty graph"


def test_build_unites_the_method_with_window_and_global_tokens():
    spec = PredictorSpec.of("distance", {"threshold": 0.5}, window=3, global_tokens=["first"])
    built = spec.build(None, 0)
    assert built == Union(Distance(0.5), Window(3), GlobalTokens(first=True, last=False))
    assert PredictorSpec.of("distance", {"threshold": 0.5}).build(None, 0) == Distance(0.5)
    assert PredictorSpec.of("fixed").build(None, 0) is None
    assert PredictorSpec.of("topk", {"k": 2}).build(None, 1) == TopK(2)


def test_learned_methods_without_projections_name_the_training_command():
    with pytest.raises(ValueError, match="sparsefinder train"):
        PredictorSpec.of("kmeans", {"n_clusters": 4, "top_k": 1}).build(None, 0)
    with pytest.raises(ValueError, match="sparsefinder train"):
        RecordInputs(_record()).projected(0)


def test_predict_record_gives_each_predictor_the_inputs_its_method_declares():
    record, projections = _record(), _projections()
    vectors = RecordInputs(record, projections)
    q, k = vectors.projected(1)
    assert q.shape == (HEADS, 7, R) and vectors.projected(1)[0] is q  # computed once
    assert vectors.get(1, "original")[0] is record.layers[1].queries
    spec = PredictorSpec.of("topk", {"k": 2})
    masks = predict_record(spec, spec.build_layers(projections, 2), vectors)
    layer = record.layers[0]
    assert torch.equal(masks[0], TopK(2).predict(layer.queries, layer.keys))  # original q/k
    spec = PredictorSpec.of("distance", {"threshold": 1.0})
    masks = predict_record(spec, spec.build_layers(projections, 2), vectors)
    assert torch.equal(masks[1], Distance(1.0).predict(*vectors.projected(1)))
    empty = PredictorSpec.of("fixed")
    masks = predict_record(empty, empty.build_layers(projections, 2), vectors)
    assert all(m.dtype == torch.bool and not m.any() for m in masks)
    with pytest.raises(ValueError, match="predictors for 1 layers"):
        predict_record(spec, spec.build_layers(projections, 1), vectors)


def test_causal_records_get_causal_predictions():
    record = _record(causal=True)
    spec = PredictorSpec.of("window", {"window": 5})
    (first, _) = predict_record(spec, spec.build_layers(None, 2), RecordInputs(record))
    assert not first.triu(diagonal=1).any() and first.diagonal(dim1=-2, dim2=-1).all()


def test_projections_of_another_shape_are_refused_by_record_inputs():
    with pytest.raises(ValueError, match="expect"):
        RecordInputs(_record(layers=3), _projections(layers=2))
