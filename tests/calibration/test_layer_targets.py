"""tools/layer_targets.py: the budget allocation with per-layer recall weights."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

import sparsefinder.calibration.floor as floor_module
from sparsefinder.calibration.allocation import allocate
from sparsefinder.calibration.floor import CalibratedFlooredDistance
from sparsefinder.calibration.samples import DistanceSamples
from tests.calibration.test_estimators import _identity, _records

TOOL = Path(__file__).resolve().parents[2] / "tools" / "layer_targets.py"
spec = importlib.util.spec_from_file_location("layer_targets", TOOL)
layer_targets = importlib.util.module_from_spec(spec)
spec.loader.exec_module(layer_targets)


def test_weights_move_density_to_the_heavier_layer_at_the_same_mean() -> None:
    samples = DistanceSamples.from_records(_records(0, 30), _identity(), samples_per_text=512,
                                           row_ranks=True)
    plain = CalibratedFlooredDistance(0.8, 2, "budget").fit(samples)
    layers = plain.sq_thresholds_.shape[0]
    same = layer_targets.weighted_fit(samples, 0.8, 2, torch.ones(layers))
    assert torch.equal(same.sq_thresholds_, plain.sq_thresholds_)
    heavy = layer_targets.weighted_fit(samples, 0.8, 2, torch.tensor([8.0] + [1.0] * (layers - 1)))
    assert float(heavy.train_sparsity_[0].mean()) < float(plain.train_sparsity_[0].mean())
    assert abs(float(heavy.train_sparsity_.mean()) - float(plain.train_sparsity_.mean())) < 0.01
    assert floor_module.allocate is allocate  # restored after the fit


def test_a_full_layer_keeps_every_allowed_key() -> None:
    q = torch.zeros(2, 5, 4)
    assert layer_targets._Full().predict(q, q).all()
    causal = layer_targets._Full().predict(q, q, causal=True)
    assert causal.sum() == 2 * 15
