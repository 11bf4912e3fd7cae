"""Restricted α-entmax attention on tiny random BERT and GPT-2 models built here (fast).

Tolerances come from tests/tolerances.py (dtype eps, accumulated terms, magnitudes); the
comparisons of two evaluations of a whole forward (a text alone and inside a padded batch)
run in float64, where any change of graph shows far above rounding.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from tolerances import forward_tol, prob_tol, sum_tol, support_size
from transformers import AutoTokenizer, BertConfig, BertModel, GPT2Config, GPT2Model

from sparsefinder.attention.entmax_ops import entmax_normalize, reference_mode
from sparsefinder.attention.interface import AttentionCall, capture, use_entmax
from sparsefinder.evaluation.restricted import (
    LayerInputs,
    RestrictionStats,
    RestrictionWarning,
    per_text,
    predictor_graph,
    restrict,
)
from sparsefinder.models.loading import default_model_path
from sparsefinder.predictors import Distance, TopK, Union, Window
from sparsefinder.projections.heads import HeadProjections

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

TEXTS = [
    "Sparse attention keeps only a few keys for every query in the sentence.",
    "A short one.",
    "Entmax gives exact zeros, so most pairs never matter for the output at all here.",
]
HEADS = 4


@pytest.fixture(scope="module")
def tokenizer():
    tok = AutoTokenizer.from_pretrained(default_model_path())
    tok.padding_side = "right"
    return tok


def _bert() -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=3,
                        num_attention_heads=HEADS, intermediate_size=64,
                        max_position_embeddings=64, initializer_range=0.5)
    model = BertModel(config).eval()
    use_entmax(model, 1.5)
    return model


def _gpt2() -> GPT2Model:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=30522, n_embd=32, n_layer=3, n_head=HEADS, n_positions=64,
                        initializer_range=0.5)
    model = GPT2Model(config).eval()
    use_entmax(model, 1.5)
    return model


MODELS = {"bert": _bert, "gpt2": _gpt2}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    return MODELS[request.param]()


def _batch(tokenizer, texts=TEXTS):
    return tokenizer(texts, padding=True, return_tensors="pt")


def _run(model, batch, graph_fn=None, **options):
    calls: list[AttentionCall] = []
    with torch.inference_mode(), capture(calls.append):
        if graph_fn is None:
            out = model(**batch, output_hidden_states=True)
        else:
            with restrict(model, graph_fn, **options):
                out = model(**batch, output_hidden_states=True)
    return out, calls


def gold_plus_noise(alpha: float = 1.5, extra: float = 0.2, seed: int = 0):
    """A recall-1 graph: the layer's own gold graph (from its restricted-run q/k) plus
    random extra pairs."""
    gen = torch.Generator().manual_seed(seed)

    def graph(inputs: LayerInputs) -> torch.Tensor:
        scores = inputs.query @ inputs.key.transpose(-1, -2) * inputs.scaling
        allowed = inputs.valid[:, None, None, :]
        if inputs.causal:
            n, m = scores.shape[-2:]
            allowed = allowed & torch.ones(n, m, dtype=torch.bool).tril(m - n)
        gold = entmax_normalize(scores, alpha, allowed) > 0
        return gold | (torch.rand(gold.shape, generator=gen) < extra)

    return graph


def test_recall_one_is_bit_identical_to_full_entmax(model, tokenizer) -> None:
    batch = _batch(tokenizer)
    real = batch["attention_mask"].bool()
    with reference_mode():  # the package's sort-based entmax: the same τ bit for bit
        full, full_calls = _run(model, batch)
        restricted, calls = _run(model, batch, gold_plus_noise())
    assert len(calls) == 3
    for a, b in zip(full.hidden_states, restricted.hidden_states, strict=True):
        assert torch.equal(a[real], b[real])
    for a, b in zip(full_calls, calls, strict=True):
        assert torch.equal(a.probs > 0, b.probs > 0)
        assert bool((a.allowed & ~b.allowed.expand_as(a.probs)).any())  # it did restrict


def test_a_sparse_graph_changes_the_output_and_misses_get_zero(model, tokenizer) -> None:
    batch = _batch(tokenizer)
    graph = per_text(lambda layer, q, k, causal: Window(3).predict(q, k, causal=causal))
    full, _ = _run(model, batch)
    restricted, calls = _run(model, batch, graph)
    real = batch["attention_mask"].bool()
    a, b = full.last_hidden_state[real], restricted.last_hidden_state[real]
    n = batch["input_ids"].shape[1]
    assert float((a - b).abs().max()) > forward_tol(model.config, a, n)["atol"]
    band = Window(3).predict(torch.zeros(1, n, 1), torch.zeros(1, n, 1))[0]
    for call in calls:
        for row in range(real.shape[0]):  # padding query rows are left to the model's mask
            probs = call.probs[row][:, real[row]]
            assert torch.all(probs[:, ~band[real[row]]] == 0)
            torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs[..., 0]), rtol=0,
                                       atol=sum_tol(support_size(probs)))


def test_padding_and_batching_do_not_change_a_text(model, tokenizer) -> None:
    """Each text restricted alone (no padding) = the same text inside a padded batch.

    In float64: the two differ by float64 rounding only (products over other shapes), so a
    pair's projected distance would have to lie within ~1e-15 of the threshold to flip."""
    model = copy.deepcopy(model).double()
    proj = _random_projections(model)
    graph = predictor_graph(lambda layer: Union(Distance(2.0), Window(1)), "projected", proj)
    batch = _batch(tokenizer)
    out, _ = _run(model, batch, graph)
    for row, text in enumerate(TEXTS):
        alone, _ = _run(model, _batch(tokenizer, [text]), graph)
        length = int(batch["attention_mask"][row].sum())
        expected = alone.last_hidden_state[0]
        width = batch["input_ids"].shape[1]
        torch.testing.assert_close(out.last_hidden_state[row, :length], expected,
                                   **forward_tol(model.config, expected, width))


def test_empty_rows_keep_their_diagonal_with_a_warning(model, tokenizer) -> None:
    batch = _batch(tokenizer)
    stats = RestrictionStats()
    with pytest.warns(RestrictionWarning, match=r"layer \d: \d+ query rows .* no key in the"):
        _, calls = _run(model, batch, per_text(
            lambda layer, q, k, causal: torch.zeros(q.shape[0], q.shape[1], k.shape[1],
                                                    dtype=torch.bool)), stats=stats)
    real = batch["attention_mask"].bool()
    n = real.shape[1]
    eye = torch.eye(n)
    for call in calls:
        assert torch.isfinite(call.probs).all()
        for row in range(real.shape[0]):
            keep = real[row]  # one key a row: the solvers' shifted score 0, τ = -1, p = 1
            torch.testing.assert_close(call.probs[row][:, keep][:, :, keep],
                                       eye[keep][:, keep].expand(HEADS, -1, -1), rtol=0,
                                       atol=prob_tol(1, 1.5))
    assert stats.repaired_rows == 3 * HEADS * int(real.sum())  # every real row, every layer
    assert stats.rows == stats.repaired_rows  # padding query rows are not counted
    # Entmax ran over the diagonal only: |kept| = L of L² (or L(L+1)/2 causal) allowed pairs.
    lengths = real.sum(1).double()
    causal = isinstance(model, GPT2Model)
    expected = 1 - (2 / (lengths + 1) if causal else 1 / lengths)
    overall, per_layer = stats.sparsity()
    assert overall == pytest.approx(float(expected.mean()), rel=1e-12)
    assert len(per_layer) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error", RestrictionWarning)
        _run(model, batch, lambda inputs: torch.zeros(HEADS, n, n, dtype=torch.bool),
             warn_empty=False)


def test_wrong_graphs_get_errors_naming_layer_and_head(model, tokenizer) -> None:
    batch = _batch(tokenizer)
    n = batch["input_ids"].shape[1]
    with pytest.raises(ValueError, match=r"layer 0, head 0 .*graph is \(9, 9\).*n=" + str(n)):
        _run(model, batch, lambda inputs: torch.ones(HEADS, 9, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"layer 0: graph has 3 heads .* 4 heads \(0\.\.3\)"):
        _run(model, batch, lambda inputs: torch.ones(3, n, n, dtype=torch.bool))
    per_head = [torch.ones(n, n, dtype=torch.bool)] * HEADS
    per_head[2] = torch.ones(n, n - 1, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"layer 0, head 2: graph has shape"):
        _run(model, batch, lambda inputs: per_head)
    with pytest.raises(ValueError, match=r"bool tensor .* got torch.float32"):
        _run(model, batch, lambda inputs: torch.ones(HEADS, n, n))
    calls = []

    def later_layer_wrong(inputs: LayerInputs):
        calls.append(inputs.layer)
        size = n if inputs.layer < 2 else n + 1
        return torch.ones(HEADS, n, size, dtype=torch.bool)

    with pytest.raises(ValueError, match=r"^layer 2, head 0"):
        _run(model, batch, later_layer_wrong)
    with pytest.raises(ValueError, match=r"layer 1: the predictor returned 2 heads"):
        _run(model, batch, per_text(
            lambda layer, q, k, causal: torch.ones(2 if layer else HEADS, q.shape[1], k.shape[1],
                                                   dtype=torch.bool)))


def test_scoped_to_the_block_and_the_model(tokenizer) -> None:
    bert, other = _bert(), _bert()
    batch = _batch(tokenizer)
    before, _ = _run(bert, batch)
    empty = per_text(lambda layer, q, k, causal: Window(1).predict(q, k))
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RestrictionWarning)
        with restrict(bert, empty):
            inside_other = other(**batch).last_hidden_state
            inside = bert(**batch).last_hidden_state
        after = bert(**batch).last_hidden_state
    assert torch.equal(inside_other, before.last_hidden_state)  # another model: untouched
    n = batch["input_ids"].shape[1]
    moved = float((inside - before.last_hidden_state).abs().max())
    assert moved > forward_tol(bert.config, before.last_hidden_state, n)["atol"]
    assert torch.equal(after, before.last_hidden_state)  # nothing left behind


def test_layers_are_numbered_in_order_every_forward(tokenizer) -> None:
    bert = _bert()
    seen: list[int] = []

    def graph(inputs: LayerInputs) -> torch.Tensor:
        seen.append(inputs.layer)
        assert inputs.valid.shape == inputs.query.shape[:1] + inputs.key.shape[2:3]
        return torch.ones(inputs.heads, inputs.query.shape[2], inputs.key.shape[2],
                          dtype=torch.bool)

    with torch.inference_mode(), restrict(bert, graph):
        bert(**_batch(tokenizer))
        bert(**_batch(tokenizer, TEXTS[:1]))
    assert seen == [0, 1, 2, 0, 1, 2]


def test_refuses_a_model_without_entmax_attention() -> None:
    model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64))  # stock (sdpa) attention
    with pytest.raises(ValueError, match="use_entmax"), restrict(model, lambda inputs: None):
        pass


def _random_projections(model, rank: int = 4, centroids: int = 0) -> HeadProjections:
    layers, heads = 3, HEADS
    d = 32 // heads
    gen = torch.Generator().manual_seed(1)
    cents = {centroids: torch.randn(layers, heads, centroids, rank, generator=gen)} \
        if centroids else {}
    return HeadProjections(weight=torch.randn(layers, heads, rank, d, generator=gen),
                           bias=torch.zeros(layers, heads, rank), model_id="tiny", alpha=1.5,
                           centroids=cents)


def test_projected_predictor_needs_projections_and_matching_shapes(model, tokenizer) -> None:
    with pytest.raises(ValueError, match=r"sparsefinder train --model tiny-gpt --out DIR"):
        predictor_graph(lambda layer: Distance(1.0), "projected", None, model_name="tiny-gpt")
    wrong = HeadProjections(weight=torch.randn(3, 2, 4, 16), bias=torch.zeros(3, 2, 4),
                            model_id="other", alpha=1.5)
    graph = predictor_graph(lambda layer: Distance(1.0), "projected", wrong, model_name="tiny")
    with pytest.raises(ValueError, match=r"sparsefinder train --model tiny --out DIR"):
        _run(model, _batch(tokenizer), graph)


def test_projected_kmeans_and_original_inputs_run(model, tokenizer) -> None:
    """A projected predictor (k-means from stored centroids) and an original-q/k one."""
    proj = _random_projections(model, centroids=3)
    batch = _batch(tokenizer)
    for graph in (
        predictor_graph(lambda layer: Union(proj.kmeans(layer, 3), Window(1)), "projected",
                        proj),
        predictor_graph(lambda layer: TopK(2), "original"),
        predictor_graph(lambda layer: Window(3), "shape"),
    ):
        out, calls = _run(model, batch, graph)
        assert torch.isfinite(out.last_hidden_state).all() and len(calls) == 3


def test_a_predictor_spec_plugs_in(model, tokenizer) -> None:
    """The settings the app and the sweeps name (PredictorSpec) run restricted as they are."""
    from sparsefinder.evaluation.restricted import spec_graph
    from sparsefinder.methods.spec import PredictorSpec

    proj = _random_projections(model)
    batch = _batch(tokenizer)
    spec = PredictorSpec.of("distance", {"threshold": 2.0}, window=3)
    out, calls = _run(model, batch, spec_graph(spec, proj, 3))
    assert torch.isfinite(out.last_hidden_state).all() and len(calls) == 3
    stats = RestrictionStats()  # a window of 0 alone builds no predictor: the empty graph
    empty = PredictorSpec.of("window", {"window": 0})
    _run(model, batch, spec_graph(empty, None, 3), warn_empty=False, stats=stats)
    assert stats.repaired_rows == stats.rows > 0
    with pytest.raises(ValueError, match=r"method 'kmeans' .*sparsefinder train --model m "):
        spec_graph(PredictorSpec.of("kmeans", {"n_clusters": 2, "top_k": 1}), None, 3,
                   model_name="m")
