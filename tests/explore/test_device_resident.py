"""A prepared text that lives on a device: the gold bits, vectors, predictions and scorer stay
there, and a slider move returns the same numbers as on the host.

Without a GPU the device path is exercised on the CPU device: the record is moved with
:meth:`AttentionRecord.to` (packed bits moved packed) and scored by the tensor-op paths that
run on a GPU (the CPU's compiled passes switched off); the ``cuda`` test repeats it on a GPU."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.data import records as records_module
from sparsefinder.explore import live
from sparsefinder.explore import prepared as prep
from sparsefinder.methods.spec import PredictorSpec
from sparsefinder.metrics import scan
from sparsefinder.predictors import distance_pass

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

SETTINGS = [PredictorSpec.of("distance", {"threshold": 1.0}, window=3),
            PredictorSpec.of("kmeans", {"n_clusters": 4, "top_k": 1}),
            PredictorSpec.of("window", {"window": 0}, window=5, global_tokens=("first",))]


def _numbers(prepared: prep.PreparedText) -> list[torch.Tensor]:
    out = []
    for spec in SETTINGS:
        scores = live.score(prepared, live.predict(prepared, spec))
        assert scores.recall.device.type == "cpu"  # only the numbers come to the host
        out += [value for value in scores.metrics().values()]
    return out


def test_a_record_moves_packed(record, monkeypatch) -> None:
    monkeypatch.setattr(records_module, "unpack_mask", lambda *a: pytest.fail("unpacked"))
    moved = record.to("cpu")
    for old, new in zip(record.layers, moved.layers, strict=True):
        assert new.gold_shape == old.gold_shape and new.device.type == "cpu"
    monkeypatch.undo()
    assert all(torch.equal(a.gold, b.gold) for a, b in zip(record.layers, moved.layers,
                                                            strict=True))


def test_the_tensor_paths_a_gpu_runs_give_the_host_numbers(record, projections,
                                                           monkeypatch) -> None:
    host = _numbers(prep.prepare(record, projections))
    monkeypatch.setattr(distance_pass, "applies", lambda q, k: False)
    monkeypatch.setattr(scan, "applies", lambda pred: False)
    device = _numbers(prep.prepare(record, projections, device="cpu"))
    for a, b in zip(host, device, strict=True):
        # integer counts and ratios of them; the missed mass summed in another order
        torch.testing.assert_close(a, b, rtol=0, atol=64 * torch.finfo(torch.float64).eps)


@pytest.mark.cuda
def test_a_gpu_resident_text_scores_as_on_the_host(record, projections) -> None:
    host = _numbers(prep.prepare(record, projections))
    prepared = prep.prepare(record, projections, device="cuda")
    assert prepared.record.layers[0].device.type == "cuda"
    masks = live.predict(prepared, SETTINGS[0])
    assert masks[0].device.type == "cuda"
    for a, b in zip(host, _numbers(prepared), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=64 * torch.finfo(torch.float64).eps)
