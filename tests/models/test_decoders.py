"""Decoder LLM families (Llama, Qwen2, Gemma 2/3) end to end on tiny random configs.

GQA (4 query heads over 2 key/value heads), RoPE, sliding-window layers (Qwen2, Gemma):
entmax attention, gold extraction at long n, projections and prediction, restricted
attention, causal metrics; and the clear refusal of a family outside the attention interface.

Tolerances come from tests/tolerances.py. These families normalise in float32 whatever the
model's dtype (their RMSNorm casts), so whole forwards are compared in float32 with the
bound of the whole chain of accumulations (:func:`tolerances.transformer_terms`).
"""

from __future__ import annotations

import pytest
import torch
from entmax import entmax15
from tolerances import (
    assert_same_support,
    bound,
    entmax_prob_tol,
    forward_tol,
    score_bound,
    support_bound,
    support_size,
)
from transformers import AutoModel, BloomConfig

from sparsefinder.attention.masks import causal_mask
from sparsefinder.bundle import examples_dir
from sparsefinder.data.records import extract
from sparsefinder.methods.spec import PredictorSpec, RecordInputs, predict_record
from sparsefinder.metrics.scorer import Scorer
from sparsefinder.models.decoders import DECODER_FAMILIES, save_tiny_decoder, tiny_decoder_config
from sparsefinder.models.loading import ModelLoadError, load_model
from sparsefinder.projections.centroids import fit_centroids
from sparsefinder.projections.hinge import train_projections

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

WINDOW = 48  # sliding window of the local layers (tokens)
LONG_N = 1200  # "long" for a CPU test: far beyond the window and 512


def _forward_tol(model, reference: torch.Tensor, n: int) -> dict[str, float]:
    """``assert_close`` keywords for two float32 evaluations of a whole forward on n tokens."""
    return forward_tol(model.config, reference, n)


@pytest.fixture(scope="module")
def decoder_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoders")
    return {f: save_tiny_decoder(f, root / f, max_positions=2048, sliding_window=WINDOW)
            for f in DECODER_FAMILIES}


@pytest.fixture(scope="module")
def long_text() -> str:
    return " ".join(p.read_text() for p in sorted(examples_dir().glob("*.txt")))


@pytest.fixture(scope="module")
def loaded(decoder_dirs):
    return {f: load_model(str(d), alpha=1.5, device="cpu") for f, d in decoder_dirs.items()}


@pytest.fixture(scope="module")
def records(loaded, long_text):
    out = {}
    for family, lm in loaded.items():
        ids = lm.tokenizer(long_text)["input_ids"][:LONG_N]
        (record,) = extract(lm, lm.tokenizer.decode(ids))
        out[family] = record
    return out


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_local_folder_loads_with_gqa_and_long_limit(family, loaded):
    lm = loaded[family]
    info = lm.describe()
    assert info["causal"] is True and info["max_length"] == 2048
    assert info["heads"] == 4 and info["kv_heads"] == 2 and info["head_dim"] == 16
    expected = {"llama": {}, "qwen2": {1: WINDOW}, "gemma2": {0: WINDOW},
                "gemma3": {0: WINDOW}}[family]
    assert lm.sliding_window_layers == expected


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_gold_at_long_n_is_entmax_of_each_query_head_on_its_shared_key_head(family, records):
    record = records[family]
    assert record.causal and record.n_tokens >= LONG_N - 5
    for layer in record.layers:
        # GQA: query heads 0,1 share key head 0 and 2,3 share key head 1
        assert torch.equal(layer.keys[0], layer.keys[1])
        assert torch.equal(layer.keys[2], layer.keys[3])
        assert not torch.equal(layer.keys[0], layer.keys[2])
        scores = layer.scores(causal=True)  # -inf outside the causal (and sliding) mask
        # recomputed from the stored q and k: the model's scores up to the product's rounding
        score_err = score_bound(layer.queries, layer.keys, layer.scaling)
        if family == "gemma2":  # soft-capped logits, as the model's own attention
            cap = 50.0
            scores = torch.tanh(scores / cap) * cap
            score_err += bound(cap, terms=3)  # tanh is 1-Lipschitz; /, tanh, × round once each
        reference = entmax15(scores.double(), dim=-1)
        ours = layer.probs().double()
        n = support_size(ours, reference)
        assert_same_support(ours, reference, slack=support_bound(score_err, 1.5, n))
        torch.testing.assert_close(ours, reference, atol=entmax_prob_tol(score_err, 1.5, n),
                                   rtol=0)
        assert layer.gold.sum() < 0.5 * layer.gold.numel()  # entmax is sparse


@pytest.mark.parametrize("family", ["qwen2", "gemma2", "gemma3"])
def test_sliding_window_layers_are_respected_in_gold_predictions_and_metrics(family, records):
    record = records[family]
    n = record.n_tokens
    local = [i for i, layer in enumerate(record.layers) if layer.sliding_window]
    assert local and all(record.layers[i].sliding_window == WINDOW for i in local)
    i_minus_j = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    outside = i_minus_j >= WINDOW
    for i in local:
        assert not record.layers[i].gold[:, outside].any()
    # a prediction of every pair is cut to each layer's own window, and scores sparsity 0
    everything = PredictorSpec.of("window", {"window": 2 * n + 1})
    masks = predict_record(everything, everything.build_layers(None, record.num_layers),
                           RecordInputs(record))
    scores = Scorer(record).score(masks)
    for i, mask in enumerate(masks):
        assert not mask[:, outside].any() if i in local else mask[:, outside].any()
        assert not mask[:, ~causal_mask(n, n)].any()
    assert torch.all(scores.recall == 1) and bool((scores.sparsity == 0).all())  # kept = allowed
    allowed_local = int((~outside & causal_mask(n, n)).sum())
    gold = record.layers[local[0]].gold
    expected = 1 - gold.sum((-2, -1)).double() / allowed_local
    torch.testing.assert_close(scores.gold_sparsity[local[0]], expected)


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_projections_predictions_and_causal_metrics(family, records):
    record = records[family]
    projections = train_projections([record], rank=4, epochs=1, model_id=family, seed=0)
    fit_centroids(projections, [record], clusters=(4,), max_points=2000, n_init=1)
    vectors = RecordInputs(record, projections)
    scorer = Scorer(record)
    n = record.n_tokens
    assert scorer.denominator == n * (n + 1) // 2
    results = {}
    for spec in (PredictorSpec.of("distance", {"threshold": 1.5}, window=3),
                 PredictorSpec.of("kmeans", {"n_clusters": 4, "top_k": 1}),
                 PredictorSpec.of("topk", {"k": 8})):
        masks = predict_record(spec, spec.build_layers(projections, record.num_layers), vectors)
        assert all(not m[:, ~causal_mask(n, n)].any() for m in masks)  # never the future
        results[spec.method] = scorer.score(masks)
    for scores in results.values():
        assert torch.all((scores.recall >= 0) & (scores.recall <= 1))
        assert torch.all((scores.sparsity > 0) & (scores.sparsity < 1))
    # learned projections beat chance: recall above the kept fraction (1 - sparsity)
    distance = results["distance"]
    assert float(distance.recall.mean()) > float(1 - distance.sparsity.mean())


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_restricted_attention_with_the_gold_superset_keeps_the_output(family, loaded,
                                                                        long_text):
    from sparsefinder.evaluation.accuracy import encode
    from sparsefinder.evaluation.restricted import spec_graph

    lm = loaded[family]
    texts = [long_text[:1500], long_text[2000:2600]]  # a padded batch
    full = encode(lm.model, lm.tokenizer, texts, max_length=lm.max_length)
    # top-k with k above every row's support (global layers) ∪ a window covering the local
    # layers' whole window contains the gold graph: sparse-consistency
    superset = PredictorSpec.of("topk", {"k": 64}, window=2 * WINDOW + 1)
    graph = spec_graph(superset, None, lm.num_layers)
    restricted = encode(lm.model, lm.tokenizer, texts, graph_fn=graph, max_length=lm.max_length)
    for a, b in zip(full.output, restricted.output, strict=True):
        torch.testing.assert_close(a, b, **_forward_tol(lm.model, a, a.shape[0]))
    # a tiny graph changes it, by more than rounding could
    small = spec_graph(PredictorSpec.of("window", {"window": 1}), None, lm.num_layers)
    changed = encode(lm.model, lm.tokenizer, texts, graph_fn=small, max_length=lm.max_length)
    a, b = full.output[0], changed.output[0]
    assert float((a - b).abs().max()) > _forward_tol(lm.model, a, a.shape[0])["atol"]


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_alpha_one_matches_the_familys_own_eager_softmax(family, decoder_dirs):
    path = str(decoder_dirs[family])
    lm = load_model(path, alpha=1.0, device="cpu")
    stock = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    ids = torch.randint(5, 1900, (2, 150), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 100:] = 0
    with torch.inference_mode():
        ours = lm.model(input_ids=ids, attention_mask=mask).last_hidden_state
        theirs = stock(input_ids=ids, attention_mask=mask).last_hidden_state
    valid = mask.bool()
    torch.testing.assert_close(ours[valid], theirs[valid],
                               **_forward_tol(stock, theirs[valid], ids.shape[1]))


def test_family_outside_the_attention_interface_is_refused_by_name(tmp_path, decoder_dirs):
    folder = tmp_path / "bloom"
    AutoModel.from_config(BloomConfig(vocab_size=2000, hidden_size=32, n_layer=2,
                                      n_head=4)).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((decoder_dirs["llama"] / name).read_bytes())
    with pytest.raises(ModelLoadError, match="'bloom' model family.*AttentionInterface"):
        load_model(str(folder), device="cpu")


def test_tiny_config_rejects_unknown_family_and_bad_gqa():
    with pytest.raises(ValueError, match="unknown decoder family 'bloom'"):
        tiny_decoder_config("bloom", vocab_size=10)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        tiny_decoder_config("llama", vocab_size=10, heads=4, kv_heads=3)
