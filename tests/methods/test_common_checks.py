"""Checks every registered family passes (scikit-learn's estimator_checks in spirit): it builds
at its declared defaults, predicts a mask of the right shape on small records (an encoder, a
decoder, a local sliding-window layer, grouped-query attention) that keeps no pair its layer
forbids — each form of a family too (``block`` with ``learned=True``, the old names' fixed
parameters) — its declared
bounds refuse the values just outside them, its sweep curves build, and the app's link of
each family it offers round-trips."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from sparsefinder.attention.masks import layer_allowed
from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.evaluation.curves import CURVES
from sparsefinder.explore.app_methods import APP_CALIBRATIONS, generic_params, with_extra
from sparsefinder.explore.state import ViewState, parse_view_state, view_state_to_params
from sparsefinder.methods.registry import METHODS, MethodUnavailable
from sparsefinder.methods.spec import PredictorSpec, RecordInputs, predict_record
from sparsefinder.projections.heads import HeadProjections

HEADS, D, R, LAYERS = 2, 8, 4, 2
FAMILIES = sorted(METHODS)
#: every family at its defaults, and each form an old name stands for (its fixed parameters)
SETTINGS = [(family, {}) for family in FAMILIES] + [
    (METHODS.aliases()[old][0], fixed) for old, fixed in sorted(METHODS.alias_params.items())
    if fixed]


def _record(gen: torch.Generator, n: int, causal: bool, window: int | None,
            kv_heads: int = HEADS) -> AttentionRecord:
    """``kv_heads`` < HEADS: grouped-query attention, each key head shared by its group of
    query heads (stored per query head, as the models' records are)."""
    layers = []
    for layer in range(LAYERS):
        q = torch.randn(HEADS, n, D, generator=gen)
        k = torch.randn(kv_heads, n, D, generator=gen).repeat_interleave(HEADS // kv_heads, 0)
        scores = q @ k.transpose(-1, -2)
        sliding = window if layer == 1 else None  # one local layer, as Gemma / ModernBERT
        allowed = layer_allowed(n, n, causal=causal, sliding_window=sliding)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, -math.inf)
        gold = (scores >= scores.topk(2, dim=-1).values[..., -1:]) & (scores > -math.inf)
        layers.append(LayerGraph(q, k, gold, torch.ones(int(gold.sum())) / 2, D**-0.5,
                                 sliding_window=sliding))
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=causal, layers=layers)


@pytest.fixture(scope="module")
def records() -> dict[str, AttentionRecord]:
    gen = torch.Generator().manual_seed(0)
    return {"encoder": _record(gen, 40, False, None), "decoder": _record(gen, 36, True, None),
            "local": _record(gen, 40, True, 8), "gqa": _record(gen, 36, True, None, kv_heads=1)}


@pytest.fixture(scope="module")
def train(records) -> list[AttentionRecord]:
    gen = torch.Generator().manual_seed(1)
    return [_record(gen, 64, False, None) for _ in range(2)]


@pytest.fixture(scope="module")
def projections() -> HeadProjections:
    gen = torch.Generator().manual_seed(2)
    return HeadProjections(weight=torch.randn(LAYERS, HEADS, R, D, generator=gen),
                           bias=torch.zeros(LAYERS, HEADS, R), model_id="synthetic", alpha=1.5,
                           centroids={8: torch.randn(LAYERS, HEADS, 8, R, generator=gen)})


def _defaults(family: str, fixed: dict | None = None) -> dict:
    """The declared defaults of the form ``fixed`` picks (the plain form without it)."""
    params = METHODS[family].variant("none", fixed or {}).params
    return {**{p.name: p.default for p in params if p.default is not None}, **(fixed or {})}


@pytest.mark.parametrize(("family", "fixed"), SETTINGS,
                         ids=[f"{f}-{'-'.join(map(str, x.values()))}" if x else f
                              for f, x in SETTINGS])
def test_builds_and_predicts_within_what_each_layer_allows(family, fixed, records, train,
                                                           projections) -> None:
    spec = PredictorSpec.of(family, _defaults(family, fixed))
    fitted = spec.fit(train)
    try:
        predictors = spec.build_layers(projections, LAYERS, fitted=fitted)
    except MethodUnavailable as why:  # e.g. bundled codebooks of another model: a reason
        assert str(why)
        return
    for name, record in records.items():
        masks = predict_record(spec, predictors, RecordInputs(record, projections))
        for layer, (mask, graph) in enumerate(zip(masks, record.layers, strict=True)):
            n = len(record.tokens)
            assert mask.dtype == torch.bool and mask.shape == (HEADS, n, n), (name, layer)
            allowed = layer_allowed(n, n, causal=record.causal,
                                    sliding_window=graph.sliding_window)
            if allowed is not None:
                assert not (mask & ~allowed).any(), (family, name, layer)


@pytest.mark.parametrize("family", FAMILIES)
def test_declared_bounds_are_enforced(family) -> None:
    method = METHODS[family]
    for param in method.params:
        if param.kind is object:
            continue
        params = _defaults(family)
        method.check_params(params)
        outside = []
        if param.low is not None:
            outside.append(param.low if param.low_open else param.low - 1)
        if param.high is not None:
            outside.append(param.high + (1 if param.kind is int else 1e-9))
        for value in outside:
            with pytest.raises(ValueError, match=param.name):
                method.check_params({**params, param.name: value})


@pytest.mark.parametrize("name", sorted(CURVES))
def test_every_sweep_point_is_within_its_declared_bounds(name) -> None:
    for spec in CURVES[name].specs:
        METHODS[spec.method].check_params(spec.param_dict, spec.calibration)


@pytest.mark.parametrize("family", sorted(APP_CALIBRATIONS))
def test_app_link_round_trips(family) -> None:
    for calibration in APP_CALIBRATIONS[family]:
        state = ViewState(method=family, calibration=calibration, clusters=8, pages=2)
        for param in generic_params(family) if calibration == "none" else ():
            high = param.app_high if param.app_high is not None else param.high
            value = param.default if high is None else min(high, param.default + 1)
            state = state.with_(extra=with_extra(state, family, param.name, param.kind(value)))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            back, problems = parse_view_state(view_state_to_params(state))
        assert problems == [] and back == state
