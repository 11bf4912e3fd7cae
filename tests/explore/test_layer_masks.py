"""A setting's masks predicted when read: the same masks and scores as predicting every layer
at once, with at most the budget held."""

from __future__ import annotations

import threading

import torch

from sparsefinder.explore import live
from sparsefinder.explore import prepared as prep
from sparsefinder.explore.layer_masks import LazyMasks
from sparsefinder.methods.spec import PredictorSpec, predict_record


def test_lazy_masks_hold_at_most_their_budget_and_predict_again_when_read() -> None:
    calls: list[int] = []

    def predict(layer: int) -> torch.Tensor:
        calls.append(layer)
        return torch.full((2, 4, 4), layer % 2 == 0)

    masks = LazyMasks(predict, 5, layer_bytes=32, budget=96)  # three layers fit
    assert masks.keep == 3 and len(masks) == 5
    assert [bool(m[0, 0, 0]) for m in masks] == [True, False, True, False, True]
    assert masks.held == [2, 3, 4] and calls == [0, 1, 2, 3, 4]
    masks[3]
    assert calls == [0, 1, 2, 3, 4]  # held: not predicted again
    assert bool(masks[0][0, 0, 0]) and calls[-1] == 0  # dropped: predicted again
    assert masks.held == [4, 3, 0] and masks[-1] is masks[4]  # 3 was read after 4
    assert LazyMasks(predict, 5, layer_bytes=10**9).keep == 2  # two layers, whatever the size


def test_the_app_setting_scores_as_predicting_every_layer_at_once(record) -> None:
    prepared = prep.prepare(record)
    spec = PredictorSpec.of("window", {"window": 0}, window=3, global_tokens=("first",))
    lazy = live.predict(prepared, spec)
    eager = predict_record(spec, spec.build_layers(None, record.num_layers),
                           prepared.inputs_for(spec.method_id), shared=True)
    assert isinstance(lazy, LazyMasks)
    assert all(torch.equal(a, b) for a, b in zip(lazy, eager, strict=True))
    fast, slow = live.score(prepared, lazy), prepared.scorer.score(eager)
    assert torch.equal(fast.recall, slow.recall) and torch.equal(fast.sparsity, slow.sparsity)


def test_threads_reading_one_setting_get_one_mask_per_layer() -> None:
    """Sessions of the app share a cached setting: two threads reading the same layer get the
    same mask and the layer is predicted once."""
    calls: list[int] = []
    gate = threading.Barrier(2)

    def predict(layer: int) -> torch.Tensor:
        calls.append(layer)
        return torch.zeros(1, 2, 2, dtype=torch.bool)

    masks = LazyMasks(predict, 2, layer_bytes=4)
    got: list[torch.Tensor] = []

    def read() -> None:
        gate.wait()
        got.append(masks[1])

    threads = [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [1] and got[0] is got[1]
