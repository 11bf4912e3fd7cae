"""The slider's fast path: a window/global pattern is one (n, m) mask per kind of layer,
broadcast over the heads, and the scorer reads it once. Masks and every metric must equal
the per-head path's (``predict_record`` without ``shared``) exactly, on the default model,
on decoders with causal and sliding-window layers and on a bidirectional local encoder.
"""

from __future__ import annotations

import pytest
import torch

from sparsefinder.bundle import examples_dir
from sparsefinder.data.records import extract
from sparsefinder.explore import live
from sparsefinder.explore import prepared as prep
from sparsefinder.methods.spec import PredictorSpec, predict_layer, predict_record
from sparsefinder.models.decoders import save_tiny_decoder
from sparsefinder.models.encoders import save_sparse_modernbert
from sparsefinder.models.loading import load_model

SPECS = [  # (method, params, window, global tokens)
    ("window", {"window": 0}, 3, ()),
    ("window", {"window": 0}, 1, ("first",)),
    ("window", {"window": 0}, 8, ("last",)),  # an even size acts as the next odd one
    ("window", {"window": 0}, 0, ("first", "last")),
    ("window", {"window": 0}, 31, ("first", "last")),
    ("window", {"window": 0}, 999, ()),  # wider than the text: every allowed pair
    ("window", {"window": 0}, 0, ()),  # nothing switched on: the empty graph
]


@pytest.fixture(scope="module")
def records(tmp_path_factory, default_tokenizer, record):
    """Gold records: the default model's; tiny Qwen2 (layer 0 global, 1 local), Gemma 2
    (layer 0 local) and a SparseModernBERT-like encoder (layers 1, 2 local ±4)."""
    root = tmp_path_factory.mktemp("live_shared")
    words = " ".join(p.read_text() for p in sorted(examples_dir().glob("*.txt"))).split()
    text = " ".join(words[:80])
    out = {"default": record}
    for family in ("qwen2", "gemma2"):
        folder = save_tiny_decoder(family, root / family, max_positions=512, sliding_window=16)
        out[family] = extract(load_model(str(folder), alpha=1.5, device="cpu"), [text])[0]
    folder = save_sparse_modernbert(root / "modernbert", default_tokenizer)
    out["modernbert"] = extract(load_model(str(folder), alpha_layers=[1.5] * 4, device="cpu"),
                                [text])[0]
    return out


def _per_head(prepared, spec):
    """Today's path: every head's own (heads, n, m) copy."""
    predictors = spec.build_layers(prepared.projections_for(spec.method_id), prepared.num_layers,
                                   prepared.fitted(spec.method_id))
    return predict_record(spec, predictors, prepared.inputs_for(spec.method_id))


@pytest.mark.parametrize("name", ["default", "qwen2", "gemma2", "modernbert"])
def test_the_shared_path_gives_the_same_masks_and_every_metric(records, name):
    record = records[name]
    if name != "default":
        assert any(g.sliding_window for g in record.layers)  # local layers are exercised
    prepared = prep.prepare(record)
    for method, params, window, global_tokens in SPECS:
        spec = PredictorSpec.of(method, params, window=window, global_tokens=global_tokens)
        fast, slow = live.predict(prepared, spec), _per_head(prepared, spec)
        assert len(fast) == len(slow) == record.num_layers
        for a, b in zip(fast, slow, strict=True):
            assert a.stride(0) == 0 or record.num_heads == 1  # one mask, not one per head
            assert a.shape == b.shape and torch.equal(a, b)
        got, expected = live.score(prepared, fast).metrics(), prepared.scorer.score(slow)
        assert set(got) == set(expected.metrics())
        assert torch.equal(live.score(prepared, fast).gold_sparsity, expected.gold_sparsity)
        for metric, values in expected.metrics().items():
            assert torch.equal(got[metric], values), (name, spec.label(), metric)
        for layer in (0, record.num_layers - 1):
            assert live.summarize(live.score(prepared, fast), layer, 1) == live.summarize(
                prepared.scorer.score(slow), layer, 1)


def test_learned_methods_keep_their_per_head_masks_and_numbers(prepared):
    """k-means ∪ window reads q/k: nothing is shared, and the numbers are today's."""
    spec = PredictorSpec.of("kmeans", {"n_clusters": 4, "top_k": 1}, window=3,
                            global_tokens=("first",))
    fast, slow = live.predict(prepared, spec), _per_head(prepared, spec)
    assert all(a.stride(0) != 0 and torch.equal(a, b) for a, b in zip(fast, slow, strict=True))
    got, expected = live.score(prepared, fast), prepared.scorer.score(slow)
    for metric, values in expected.metrics().items():
        assert torch.equal(got.metrics()[metric], values)


def test_layers_of_one_kind_share_one_mask(records):
    """Qwen2's global and local layers get two masks; equal layers would get one."""
    record = records["qwen2"]
    prepared = prep.prepare(record)
    spec = PredictorSpec.of("window", {"window": 0}, window=5, global_tokens=("first",))
    masks = live.predict(prepared, spec)
    doubled = type(record)(**{**vars(record), "layers": [*record.layers, *record.layers]})
    twice = predict_record(spec, spec.build_layers(None, 4), prep.prepare(doubled).vectors,
                           shared=True)
    assert twice[0].data_ptr() == twice[2].data_ptr() != twice[1].data_ptr()
    assert all(torch.equal(a, b) for a, b in zip(twice, [*masks, *masks], strict=True))
    with pytest.raises(RuntimeError):  # read-only: a write would reach every head
        masks[0][0, 0, 0] = True


@pytest.mark.parametrize("sliding_window", [None, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_predict_layer_shared_equals_per_head(causal, sliding_window):
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, 11, 4, generator=gen), torch.randn(3, 11, 4, generator=gen)
    for window, global_tokens in ((3, ()), (0, ("last",)), (5, ("first", "last"))):
        predictor = PredictorSpec.of("window", {"window": 0}, window=window,
                                     global_tokens=global_tokens).build(None, 0)
        fast = predict_layer(predictor, q, k, causal=causal, sliding_window=sliding_window,
                             shared=True)
        slow = predict_layer(predictor, q, k, causal=causal, sliding_window=sliding_window)
        assert fast.stride(0) == 0 and torch.equal(fast, slow)


def test_one_mask_given_to_layers_of_different_windows_is_cut_per_layer(records):
    """The scorer counts a shared mask once per (mask, allowed pairs), not once per mask:
    the same all-True mask scores differently on Qwen2's global and local layers."""
    record = records["qwen2"]
    scorer = prep.prepare(record).scorer
    heads, n, m = record.layers[0].gold.shape
    everything = torch.ones(n, m, dtype=torch.bool).expand(heads, n, m)
    got = scorer.score([everything] * record.num_layers)
    expected = scorer.score([everything.contiguous()] * record.num_layers)
    for metric, values in expected.metrics().items():
        assert torch.equal(got.metrics()[metric], values), metric
    assert got.precision[0, 0] != got.precision[1, 0]


def test_softmax_layers_score_alike_and_are_named(sparse_modernbert_records):
    """SparseModernBERT's softmax local layers (dense gold graphs): same numbers on the fast
    path, and the layers the Explorer greys are the ones the sweep leaves out."""
    prepared = prep.prepare(sparse_modernbert_records[1])
    spec = PredictorSpec.of("window", {"window": 0}, window=5, global_tokens=("first",))
    got = live.score(prepared, live.predict(prepared, spec))
    expected = prepared.scorer.score(_per_head(prepared, spec))
    for metric, values in expected.metrics().items():
        assert torch.equal(got.metrics()[metric], values), metric
    assert live.softmax_layers(got) == [1, 2]
    assert live.softmax_layers(type(got)(recall=got.recall, sparsity=got.sparsity)) == []
