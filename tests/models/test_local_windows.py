"""Local (sliding-window) layers end to end: one notion of a layer's allowed pairs.

Tiny random Qwen2 (layer 1 local), Gemma 2 (layer 0 local, soft-capped) and ModernBERT
(layers 1, 2 bidirectional local, run with entmax here so their gold graphs are sparse):
gold extraction, projection training, calibration on the train records, predictions,
per-row budgets and restricted attention must all stay inside each local layer's window,
and calibrated sparsity is measured over the window's pairs.
"""

from __future__ import annotations

import pytest
import torch
from tolerances import forward_tol

from sparsefinder.attention.interface import capture
from sparsefinder.attention.masks import layer_allowed
from sparsefinder.bundle import examples_dir
from sparsefinder.calibration.estimators import CalibratedDistance
from sparsefinder.data.records import extract
from sparsefinder.evaluation.accuracy import encode
from sparsefinder.evaluation.restricted import (
    LayerInputs,
    RestrictionStats,
    restrict,
    spec_graph,
)
from sparsefinder.methods.spec import PredictorSpec, RecordInputs, predict_record
from sparsefinder.metrics.scorer import Scorer
from sparsefinder.models.decoders import save_tiny_decoder
from sparsefinder.models.encoders import MODERNBERT_LOCAL, save_sparse_modernbert
from sparsefinder.models.loading import load_model
from sparsefinder.projections.hinge import train_projections
from sparsefinder.projections.pairs import _layer_pairs, sample_negatives

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

WINDOW = 16  # the decoders' local window W: keys 0 <= i - j < W
TARGET = 0.9
MODELS = ("qwen2", "gemma2", "modernbert")
TOKENS = {"qwen2": 96, "gemma2": 96, "modernbert": 60}  # per text


@pytest.fixture(scope="module")
def loaded(tmp_path_factory, default_tokenizer):
    root = tmp_path_factory.mktemp("local_windows")
    out = {f: load_model(str(save_tiny_decoder(f, root / f, max_positions=512,
                                               sliding_window=WINDOW)), alpha=1.5, device="cpu")
           for f in ("qwen2", "gemma2")}
    folder = save_sparse_modernbert(root / "modernbert", default_tokenizer)
    out["modernbert"] = load_model(str(folder), alpha_layers=[1.5] * 4, device="cpu")
    return out


@pytest.fixture(scope="module")
def texts():
    words = " ".join(p.read_text() for p in sorted(examples_dir().glob("*.txt"))).split()
    return [" ".join(words[i * 70:(i + 1) * 70]) for i in range(5)]


@pytest.fixture(scope="module")
def trained(loaded, texts):
    """Per model: (train records, projections) — projections trained briefly on them."""
    out = {}
    for name, lm in loaded.items():
        cut = [lm.tokenizer.decode(lm.tokenizer(t, add_special_tokens=False)["input_ids"]
                                   [:TOKENS[name]]) for t in texts]
        records = extract(lm, cut)
        projections = train_projections(records, rank=4, epochs=1, model_id=name, seed=0)
        out[name] = (records, projections)
    return out


def _local(record) -> list[int]:
    return [i for i, g in enumerate(record.layers) if g.sliding_window]


def _window_mask(record, layer: int) -> torch.Tensor:
    n = record.n_tokens
    mask = layer_allowed(n, n, causal=record.causal,
                         sliding_window=record.layers[layer].sliding_window)
    assert mask is not None
    return mask


@pytest.mark.parametrize("name", MODELS)
def test_the_local_layers_and_their_windows_are_those_of_the_model(name, trained):
    records, _ = trained[name]
    window = MODERNBERT_LOCAL // 2 + 1 if name == "modernbert" else WINDOW
    expected = {"qwen2": [1], "gemma2": [0], "modernbert": [1, 2]}[name]
    for record in records:
        assert _local(record) == expected
        assert record.n_tokens > 2 * window  # the window cuts something
        for layer in expected:
            graph = record.layers[layer]
            assert graph.sliding_window == window and not graph.is_softmax
            assert not graph.gold[:, ~_window_mask(record, layer)].any()  # gold inside
            assert graph.gold.float().mean() < 0.5 * _window_mask(record, layer).float().mean()


@pytest.mark.parametrize("name", MODELS)
def test_training_positives_and_negatives_stay_inside_the_window(name, trained):
    records, _ = trained[name]
    sizes = [r.n_tokens for r in records]
    for layer in _local(records[0]):
        pairs = _layer_pairs(records, layer)
        negatives = sample_negatives(pairs.gold_flat, pairs.gold_base, pairs.n_allowed, 20,
                                     torch.Generator().manual_seed(0))
        total = sum(sizes)
        # rows of the stacked tables → (text, position): texts are concatenated per head
        q_pos = pairs.q_row - pairs.head * total
        starts = torch.tensor([0, *sizes]).cumsum(0)
        text = torch.searchsorted(starts, q_pos, right=True) - 1
        query = q_pos - starts[text]
        positive = pairs.k_row - pairs.head * total - starts[text]
        negative = (pairs.k_base - pairs.head * total - starts[text])[:, None] + negatives
        window = records[0].layers[layer].sliding_window
        for keys in (positive[:, None], negative):
            ahead = keys - query[:, None]  # j - i
            reach = ahead.abs() if not records[0].causal else -ahead
            assert ((reach >= 0) & (reach < window)).all()
        assert (negative - query[:, None] == -(window - 1)).any()  # the window's far end
        for t, record in enumerate(records):  # negatives are non-edges of their own row
            rows = text == t
            gold = record.layers[layer].gold
            heads = pairs.head[rows][:, None].expand(-1, negatives.shape[1])
            assert not gold[heads, query[rows][:, None].expand_as(heads), negative[rows]].any()


def _per_layer(records, masks_of) -> torch.Tensor:
    """Macro sparsity per layer (float64 (layers,)): over texts, then heads."""
    per_text = [Scorer(r).score(masks_of(r)).sparsity for r in records]  # (layers, heads)
    return torch.stack(per_text).mean(0).mean(-1)


@pytest.mark.parametrize("name", MODELS)
def test_calibrated_sparsity_of_the_local_layers_is_measured_over_the_window(name, trained):
    """distance:equal gives every head the target: each local layer lands within ±0.01 of it
    on the train records, counted over its window's pairs; distance:budget meets it on
    average over every layer and head, and its train estimate of each local layer is what
    its predictions measure (±0.01)."""
    records, projections = trained[name]
    layers = records[0].num_layers

    def measured(spec):
        built = spec.build_layers(projections, layers, spec.fit(records))
        return _per_layer(records, lambda r: predict_record(spec, built,
                                                            RecordInputs(r, projections)))

    equal = measured(PredictorSpec.of("distance:equal", {"target_sparsity": TARGET}))
    for layer in _local(records[0]):
        assert abs(float(equal[layer]) - TARGET) <= 0.01, (layer, equal.tolist())
    budget = measured(PredictorSpec.of("distance:budget", {"target_sparsity": TARGET}))
    assert abs(float(budget.mean()) - TARGET) <= 0.01, budget.tolist()
    estimate = CalibratedDistance(target_sparsity=TARGET, allocation="budget").fit_records(
        records, projections).train_sparsity_.mean(-1)
    for layer in _local(records[0]):
        assert abs(float(budget[layer]) - float(estimate[layer])) <= 0.01


@pytest.mark.parametrize("name", MODELS)
def test_predictions_and_per_row_budgets_stay_inside_the_window(name, trained):
    records, projections = trained[name]
    layers = records[0].num_layers
    record = records[0]
    vectors = RecordInputs(record, projections)
    k = 6
    for spec in (PredictorSpec.of("distance", {"threshold": 1e6}),  # every pair
                 PredictorSpec.of("topk", {"k": k}),
                 PredictorSpec.of("rowfrac:budget", {"target_sparsity": TARGET}),
                 PredictorSpec.of("topk", {"k": k}, window=3, global_tokens=("first",))):
        built = spec.build_layers(projections, layers, spec.fit(records))
        masks = predict_record(spec, built, vectors)
        for layer in _local(record):
            allowed = _window_mask(record, layer)
            assert not masks[layer][:, ~allowed].any(), (spec.method_id, layer)
            if spec.method_id == "topk" and not spec.window:  # the budget is spent inside
                counts = masks[layer].sum(-1)
                assert torch.equal(counts, allowed.sum(-1).clamp(max=k).expand_as(counts))
        if spec.method_id == "distance":
            local = _local(record)
            assert all(masks[i].any(0).eq(_window_mask(record, i)).all() for i in local)


@pytest.mark.parametrize("name", MODELS)
def test_restricted_attention_never_leaves_the_window_and_budgets_fill_it(name, loaded,
                                                                          texts):
    lm = loaded[name]
    batch = [texts[0][:300], texts[1][:200]]  # a padded batch
    k = 3
    graph = spec_graph(PredictorSpec.of("topk", {"k": k}), None, lm.num_layers)
    seen: list[tuple[LayerInputs, torch.Tensor]] = []

    def recording(inputs):
        out = graph(inputs)
        seen.append((inputs, out))
        return out

    calls = []
    stats = RestrictionStats()
    with torch.inference_mode(), restrict(lm.model, recording, stats=stats), \
            capture(calls.append):
        enc = lm.tokenizer(batch, return_tensors="pt", padding=True)
        lm.model(**enc)
    windows = lm.sliding_window_layers
    assert windows and {i.layer for i, _ in seen} == set(range(lm.num_layers))
    for (inputs, out), call in zip(seen, calls, strict=True):
        assert inputs.sliding_window == windows.get(inputs.layer)
        if not inputs.sliding_window:
            continue
        n = inputs.query.shape[2]
        allowed = layer_allowed(n, n, causal=inputs.causal, sliding_window=inputs.sliding_window)
        assert not (call.probs[..., ~allowed] > 0).any()  # attention never leaves the window
        for b in range(inputs.batch):  # top-k spends its k keys inside the window
            real = inputs.valid[b]
            rows = out[b][:, real][:, :, real]
            inside = layer_allowed(int(real.sum()), int(real.sum()), causal=inputs.causal,
                                   sliding_window=inputs.sliding_window)
            assert not rows[:, ~inside].any()
            assert torch.equal(rows.sum(-1), inside.sum(-1).clamp(max=k).expand(
                rows.shape[0], -1))
    assert stats.repaired_rows == 0
    # the whole window as the graph: sparsity 0 over the allowed pairs, the output unchanged
    everything = spec_graph(PredictorSpec.of("window", {"window": 4096}), None, lm.num_layers)
    full = encode(lm.model, lm.tokenizer, batch, max_length=lm.max_length)
    stats = RestrictionStats()
    same = encode(lm.model, lm.tokenizer, batch, graph_fn=everything, max_length=lm.max_length,
                  stats=stats)
    assert all(s == 0 for s in stats.sparsity()[1])  # kept == allowed, every layer: exact
    for a, b in zip(full.output, same.output, strict=True):  # float32 rounding of the forward
        torch.testing.assert_close(a, b, **forward_tol(lm.model.config, a, a.shape[0]))


def test_the_apps_kmeans_graph_is_cut_to_the_window_like_every_prediction(trained):
    from sparsefinder.explore.live import kmeans_layer_mask
    from sparsefinder.explore.prepared import PreparedText
    from sparsefinder.projections.centroids import fit_centroids

    records, projections = trained["qwen2"]
    fit_centroids(projections, records, clusters=(2,), max_points=2000, n_init=1)
    record = records[0]
    prepared = PreparedText(record, RecordInputs(record, projections), Scorer(record))
    spec = PredictorSpec.of("kmeans", {"n_clusters": 2, "top_k": 1})
    expected = predict_record(spec, spec.build_layers(projections, record.num_layers),
                              RecordInputs(record, projections))
    for layer in range(record.num_layers):
        mask = kmeans_layer_mask(prepared, layer, 2, 1)
        assert torch.equal(mask, expected[layer])
        if layer in _local(record):
            allowed = _window_mask(record, layer)
            assert not mask[:, ~allowed].any() and mask[:, allowed].any()
