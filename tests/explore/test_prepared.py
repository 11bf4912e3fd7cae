"""sparsefinder.explore: prepared texts (no Streamlit)."""

from __future__ import annotations

import torch

from sparsefinder.explore import prepared as prep
from sparsefinder.explore.availability import available_methods


def test_round_up_and_distance_range(prepared):
    assert prep._round_up(0.37) == 0.5 and prep._round_up(3.2) == 5.0
    assert prep._round_up(10.0) == 10.0
    assert prepared.t_max > 0


def test_hash_codes_enable_hashattention_when_they_fit(record, projections):
    from sparsefinder.explore import live
    from sparsefinder.explore import state as urlstate
    from sparsefinder.projections.hash_code_table import HashCodeTable

    gen = torch.Generator().manual_seed(1)
    heads, d = record.num_heads, record.layers[0].queries.shape[-1]
    maps = [(torch.randn(heads, d, 16, generator=gen), torch.randn(heads, d, 16, generator=gen))
            for _ in range(record.num_layers)]
    codes = HashCodeTable(model_id="m", alpha=1.5, maps=maps)
    without = prep.prepare(record, projections)
    assert "hashattention" not in available_methods(without)
    assert without.fitted("hashattention") is None
    ready = prep.prepare(record, projections, hash_codes=codes)
    assert "hashattention" in available_methods(ready)
    assert ready.fitted("hashattention") is maps
    state = urlstate.ViewState(method="hashattention", hamming=16, window=0, global_tokens=())
    preds = live.predict_layers(ready, state)
    assert all(p.all() for p in preds)  # distance 16 of 16 bits: every key
    tight = live.predict_layers(ready, state.with_(hamming=0))
    assert sum(int(p.sum()) for p in tight) < sum(int(p.sum()) for p in preds)
    other = HashCodeTable(model_id="m", alpha=1.5, maps=maps[:2])  # another model's shape
    assert prep.prepare(record, projections, hash_codes=other).hash_codes is None


def test_a_slider_move_resolves_the_parts_once(record, projections, monkeypatch):
    """The parts a method takes are resolved once per prepared text: moving a slider (a new
    value of the same method) builds, reads the inputs and the fitted part without asking the
    resolver again, and the masks are those of the spec built from the resolver's parts."""
    from sparsefinder.explore import live
    from sparsefinder.explore import state as urlstate
    from sparsefinder.learned_parts import LearnedParts
    from sparsefinder.methods.spec import LayerPrediction

    calls: list[object] = []
    real = LearnedParts.for_method
    monkeypatch.setattr(LearnedParts, "for_method",
                        lambda self, method: calls.append(method) or real(self, method))
    prepared = prep.prepare(record, projections)
    state = urlstate.ViewState(method="distance", calibration="none", t=0.5)
    first = live.predict_layers(prepared, state)[0]  # (lists the methods that run here too)
    after_first = len(calls)
    for t in (0.7, 0.9):  # two more moves
        live.predict_layers(prepared, state.with_(t=t))[0]
    assert len(calls) == after_first
    raw_distance = [c for c in calls if getattr(c, "method_id", c) == "distance"]
    assert len(raw_distance) == 1  # one resolve of the family's parts for the whole text
    spec = live.spec_for(state, prepared)
    built = spec.build_layers(real(prepared.parts, spec), prepared.num_layers)
    assert torch.equal(first, LayerPrediction(spec, built, prepared.vectors, shared=True)(0))
