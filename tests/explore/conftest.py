"""Fixtures of the view-model tests: one short text, random projections, its prepared form."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.explore import inputs
from sparsefinder.explore import prepared as prep
from sparsefinder.projections.heads import HeadProjections

TEXT = "The cat sat on the mat because the cat was tired, and the mat was warm."


@pytest.fixture(scope="module")
def record(default_model):
    rec, notes = inputs.extract_one(default_model, TEXT)
    assert notes == []
    return rec


@pytest.fixture(scope="module")
def projections(default_model, record):
    """Random (untrained) projections with centroids: enough to exercise every code path."""
    gen = torch.Generator().manual_seed(0)
    layers, heads, d, r = record.num_layers, record.num_heads, record.layers[0].queries.shape[2], 4
    weight = torch.randn(layers, heads, r, d, generator=gen) / d**0.5
    centroids = {b: torch.randn(layers, heads, b, r, generator=gen) for b in (2, 4, 8)}
    return HeadProjections(weight=weight, bias=torch.zeros(layers, heads, r),
                           model_id=default_model.model_id, alpha=1.5, centroids=centroids)


@pytest.fixture(scope="module")
def prepared(record, projections):
    return prep.prepare(record, projections)
