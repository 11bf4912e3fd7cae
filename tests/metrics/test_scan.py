"""The scorer's compiled read of a prediction at the gold edges equals its tensor-op read."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.metrics import scan
from sparsefinder.metrics.scorer import Scorer
from sparsefinder.predictors import Window

# numerical: re-run under other CPU kernels (make test-portable)
pytestmark = [pytest.mark.numerical,
              pytest.mark.skipif(not scan.applies(torch.zeros(1)), reason="no numba")]


def _record(causal: bool, window: int | None, seed: int = 0) -> AttentionRecord:
    gen = torch.Generator().manual_seed(seed)
    heads, n = 3, 33
    layers = []
    for _ in range(2):
        gold = torch.rand(heads, n, n, generator=gen) < 0.2
        gold[:, :, 0] = True
        if causal:
            gold &= torch.ones(n, n, dtype=torch.bool).tril()
        if window:
            band = torch.ones(n, n, dtype=torch.bool).tril() & ~torch.ones(
                n, n, dtype=torch.bool).tril(-window)
            gold &= band
        probs = gold * torch.rand(heads, n, n, generator=gen)
        probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-12)
        layers.append(LayerGraph(torch.randn(heads, n, 4, generator=gen),
                                 torch.randn(heads, n, 4, generator=gen), gold, probs[gold],
                                 1.5, sliding_window=window))
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=causal, layers=layers)


@pytest.mark.parametrize(("causal", "window"), [(False, None), (True, None), (True, 6)])
def test_compiled_and_tensor_reads_give_the_same_scores(monkeypatch, causal, window) -> None:
    record = _record(causal, window)
    gen = torch.Generator().manual_seed(1)
    preds = [torch.rand(3, 33, 33, generator=gen) < 0.3 for _ in range(2)]
    shared = [Window(5).predict(torch.zeros(3, 33, 1), torch.zeros(3, 33, 1))[:1].expand(
        3, -1, -1) for _ in range(2)]  # one mask for every head (stride 0)
    compiled = [Scorer(record).score(p) for p in (preds, shared)]
    monkeypatch.setattr(scan, "applies", lambda pred: False)
    tensor = [Scorer(record).score(p) for p in (preds, shared)]
    for fast, slow in zip(compiled, tensor, strict=True):
        for name in ("recall", "sparsity", "precision", "exact_fraction"):
            assert torch.equal(getattr(fast, name), getattr(slow, name)), name
        # the missed mass: float64 sums of <= 33·33 terms of at most 1, in another order
        bound = 33 * 33 * torch.finfo(torch.float64).eps
        torch.testing.assert_close(fast.mass_recall, slow.mass_recall, rtol=0, atol=bound)
    assert (compiled[0].recall < 1).any() and (compiled[0].exact_fraction < 1).any()


@pytest.mark.parametrize(("n", "m", "causal", "window"),
                         [(40, 40, False, None), (40, 40, True, None), (37, 53, True, None),
                          (48, 48, True, 9), (35, 35, False, 7), (16, 64, False, None)])
def test_kept_pairs_and_tiles_count_only_each_rows_allowed_run(n, m, causal, window) -> None:
    """Whole 16-key tiles are read as words (or as 16 bytes where m is not a multiple of 8),
    partial ones byte by byte (runs that start or end inside a tile): the same as the AND
    with the allowed pairs."""
    from sparsefinder.attention.masks import allowed_key_range, layer_allowed
    from sparsefinder.metrics.measures import block_graph, count_true

    gen = torch.Generator().manual_seed(n + m)
    pred = torch.rand(3, n, m, generator=gen) < 0.3
    pred[1] = False  # a head that keeps nothing
    kept, tiles = scan.count_kept(pred, *allowed_key_range(n, m, causal=causal,
                                                           sliding_window=window))
    allowed = layer_allowed(n, m, causal=causal, sliding_window=window)
    cut = pred if allowed is None else pred & allowed
    assert torch.equal(kept, count_true(cut))
    assert torch.equal(tiles, block_graph(cut, scan.TILE))
