"""Gold graph extraction: tokens, offsets, exact q/k, sparse probabilities, bad input."""

from __future__ import annotations

import warnings

import pytest
import torch
from tolerances import (
    assert_layers_close,
    assert_same_support,
    entmax_prob_tol,
    score_bound,
    sum_tol,
    support_bound,
    support_size,
    transformer_terms,
)

from sparsefinder.attention.entmax_ops import entmax_normalize
from sparsefinder.data.records import LongTextWarning, TextInputError, extract
from sparsefinder.models.loading import load_model

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

TEXT = "The doctor said she would call the patient when his results arrived."


def test_record_shapes_tokens_and_offsets(default_model):
    (record,) = extract(default_model, TEXT)
    n = record.n_tokens
    assert record.tokens[0] == "[CLS]" and record.tokens[-1] == "[SEP]"
    assert record.special[0] and record.special[-1] and not any(record.special[1:-1])
    assert record.num_layers == 6 and record.num_heads == 12
    for token, (start, end), special in zip(
        record.tokens, record.offsets, record.special, strict=True
    ):
        if not special:
            assert TEXT[start:end].lower() == token.removeprefix("##")
    for layer in record.layers:
        assert layer.queries.shape == (12, n, 32) and layer.keys.shape == (12, n, 32)
        assert layer.gold.dtype == torch.bool and layer.gold.shape == (12, n, n)
        assert layer.prob_values.numel() == int(layer.gold.sum())
        probs = layer.probs()
        torch.testing.assert_close(probs.sum(-1), torch.ones(12, n),
                                   atol=sum_tol(support_size(probs)), rtol=0)
        assert torch.equal(probs > 0, layer.gold)  # the record's own values: exact


def test_extracted_layers_keep_gold_bit_packed(default_model):
    """A record holds 1/8 byte per (head, query, key) of gold, not a dense bool mask."""
    (record,) = extract(default_model, TEXT)
    n = record.n_tokens
    for layer in record.layers:
        vectors = layer.queries.nbytes + layer.keys.nbytes + layer.prob_values.nbytes
        assert layer.stored_bytes() == vectors + 12 * n * -(-n // 8)
        assert not any(isinstance(v, torch.Tensor) and v.dtype == torch.bool
                       for v in vars(layer).values())


def test_stored_vectors_are_the_ones_entering_qk(default_model):
    """Recomputing entmax from the stored q, k reproduces the gold graph: edge for edge except
    keys the product's rounding can move across the threshold (tests/tolerances.py)."""
    (record,) = extract(default_model, TEXT)
    for layer in record.layers:
        recomputed = entmax_normalize(layer.scores(), 1.5)
        score_err = score_bound(layer.queries, layer.keys, layer.scaling)
        kept = support_size(recomputed, layer.probs())
        assert_same_support(recomputed, layer.probs(), slack=support_bound(score_err, 1.5, kept))
        torch.testing.assert_close(recomputed, layer.probs(), rtol=0,
                                   atol=entmax_prob_tol(score_err, 1.5, kept))


def test_entmax_is_sparse_on_the_default_model(default_model):
    (record,) = extract(default_model, TEXT)
    zero_fraction = 1 - torch.stack([layer.gold.float().mean() for layer in record.layers])
    assert float(zero_fraction.mean()) > 0.3


def test_batching_and_padding_do_not_change_graphs(default_model64):
    """In float64: the padded batch and the text alone differ by float64 rounding only
    (products over other shapes), bounded through the layers (tests/tolerances.py)."""
    short, long = "Short text.", TEXT
    together = extract(default_model64, [long, short], batch_size=2)
    alone = extract(default_model64, [short], batch_size=1)[0]
    assert together[1].tokens == alone.tokens
    config = default_model64.model.config
    n = together[0].n_tokens  # the padded width
    for index, (a, b) in enumerate(zip(together[1].layers, alone.layers, strict=True)):
        terms = transformer_terms(layers=index, hidden=config.hidden_size,
                                  intermediate=config.intermediate_size, n=n)
        assert_layers_close(a, b, terms=terms + config.hidden_size, dtype=torch.float64)


@pytest.mark.parametrize("bad", ["", "   \n\t ", None, 42])
def test_empty_or_non_text_input_is_rejected(default_model, bad):
    with pytest.raises(TextInputError):
        extract(default_model, [bad])


def test_no_texts_is_rejected(default_model):
    with pytest.raises(TextInputError, match="no texts"):
        extract(default_model, [])


def test_long_text_truncate_chunk_and_error(tiny_model_dirs):
    loaded = load_model(str(tiny_model_dirs["bert"]), device="cpu")  # max 64 tokens
    text = " ".join(f"word{i}" for i in range(80))
    with pytest.warns(LongTextWarning, match="truncated to its first 64 tokens"):
        (record,) = extract(loaded, text)
    assert record.truncated and record.n_tokens == 64
    with pytest.warns(LongTextWarning, match="split into"):
        chunks = extract(loaded, text, long_text="chunk")
    assert len(chunks) > 1 and all(chunk.n_tokens <= 64 for chunk in chunks)
    covered = {offset for chunk in chunks for offset in chunk.offsets if offset != (0, 0)}
    assert max(end for _, end in covered) == len(text)
    with pytest.raises(TextInputError, match="more than the model's maximum"):
        extract(loaded, text, long_text="error")
    with pytest.raises(ValueError, match="long_text"):
        extract(loaded, text, long_text="drop")


def test_emoji_and_non_english_text_work(default_model):
    with warnings.catch_warnings():
        warnings.simplefilter("error", LongTextWarning)
        (record,) = extract(default_model, "Καλημέρα 🌍🚀 東京 Москва café ✨✨✨")
    assert record.n_tokens > 3 and record.layers[0].gold.any()


def test_decoder_records_are_causal(tiny_model_dirs):
    loaded = load_model(str(tiny_model_dirs["gpt2"]), device="cpu")
    (record,) = extract(loaded, "tokens of a decoder only see the past")
    assert record.causal
    n = record.n_tokens
    future = ~torch.ones(n, n, dtype=torch.bool).tril()
    assert all(not layer.gold[:, future].any() for layer in record.layers)
    assert torch.isinf(record.layers[0].scores(causal=True)[:, future]).all()


def test_text_exactly_at_the_maximum_length_is_not_long(tiny_model_dirs):
    """64 tokens with [CLS] and [SEP] fit a 64-position model: no warning, no error."""
    loaded = load_model(str(tiny_model_dirs["bert"]), device="cpu")
    exact, over = " ".join(["the"] * 62), " ".join(["the"] * 63)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LongTextWarning)
        (record,) = extract(loaded, exact, long_text="error")
        (chunk,) = extract(loaded, exact, long_text="chunk")
    assert record.n_tokens == chunk.n_tokens == 64 and not record.truncated
    with pytest.warns(LongTextWarning, match=r"^text 0 has 65 tokens, more than the model's "
                                             r"maximum of 64: truncated to its first 64 tokens"):
        (cut,) = extract(loaded, over)
    assert cut.truncated and cut.n_tokens == 64
    with pytest.raises(TextInputError, match=r"^text 0 has 65 tokens, more than the model's "
                                             r"maximum of 64; shorten it or use "
                                             r"long_text='truncate' or 'chunk'$"):
        extract(loaded, over, long_text="error")


def test_bad_text_messages():
    from sparsefinder.data.records import check_text

    with pytest.raises(TextInputError, match=r"^expected a string of text, got int$"):
        check_text(42)
    with pytest.raises(TextInputError, match=r"^the text is empty; paste or upload some text "
                                             r"\(one word or more\)$"):
        check_text(" \n")
    assert check_text(" a ") == " a "


def test_dense_probabilities_keep_their_dtype():
    from sparsefinder.data.records import LayerGraph

    gold = torch.tensor([[[True, False], [True, True]]])
    values = torch.tensor([1.0, 0.25, 0.75], dtype=torch.float64)
    graph = LayerGraph(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), gold, values, 1.0)
    dense = graph.probs()
    assert dense.dtype == torch.float64
    assert dense.tolist() == [[[1.0, 0.0], [0.25, 0.75]]]


def test_long_text_warning_points_at_the_caller(tiny_model_dirs):
    """Not at torch's inference_mode wrapper: a user sees which call truncated."""
    loaded = load_model(str(tiny_model_dirs["bert"]), device="cpu")
    with pytest.warns(LongTextWarning) as caught:
        extract(loaded, " ".join(["the"] * 70))
    assert caught[0].filename == __file__


def _graph(seed: int = 0, heads: int = 3, n: int = 7, m: int = 7, window=None):
    from sparsefinder.data.records import LayerGraph

    gen = torch.Generator().manual_seed(seed)
    gold = torch.rand(heads, n, m, generator=gen) < 0.4
    return LayerGraph(torch.randn(heads, n, 4, generator=gen), torch.randn(heads, m, 4,
                      generator=gen), gold, torch.rand(int(gold.sum()), generator=gen), 0.5,
                      sliding_window=window), gold


def test_one_head_and_its_edge_count_read_from_the_packed_gold():
    graph, gold = _graph(1, heads=4, n=5, m=13)
    assert torch.equal(graph.gold_of(2), gold[2])
    assert torch.equal(graph.gold_of(slice(1, 3)), gold[1:3])
    assert torch.equal(graph.gold_of(torch.tensor([3, 0])), gold[[3, 0]])
    assert [graph.gold_count(h) for h in range(4)] == gold.sum((-2, -1)).tolist()


def test_rows_of_one_head_and_their_edge_count_read_from_the_packed_gold():
    graph, gold = _graph(2, heads=3, n=40, m=21)
    for rows in (slice(5, 17), slice(0, 1), slice(39, 40), slice(None), slice(12, 12)):
        assert torch.equal(graph.gold_of(1, rows), gold[1, rows])
        assert graph.gold_count(2, rows) == int(gold[2, rows].sum())
    assert torch.equal(graph.gold_of(slice(0, 2), slice(3, 9)), gold[0:2, 3:9])
    assert graph.gold_count(0) == int(gold[0].sum())
    assert graph.gold_count(slice(0, 2)) == int(gold[:2].sum())
    assert graph.gold_count(slice(0, 0)) == 0


@pytest.mark.parametrize("causal", [False, True])
def test_scores_mask_what_a_windowed_layer_cannot_attend_to(causal):
    from sparsefinder.attention.masks import layer_allowed

    graph, _ = _graph(2, window=2)
    scores = graph.scores(causal=causal)
    raw = graph.queries @ graph.keys.transpose(-1, -2) * 0.5
    allowed = layer_allowed(7, 7, causal=causal, sliding_window=2)
    assert allowed is not None and not bool(allowed.all())
    assert torch.equal(scores[:, allowed], raw[:, allowed])
    assert bool((scores[:, ~allowed] == float("-inf")).all())


def test_a_captured_call_keeps_its_window_and_alpha_in_the_layer_graph():
    from sparsefinder.attention.interface import AttentionCall
    from sparsefinder.data.records import _layer_graph

    gen = torch.Generator().manual_seed(3)
    probs = torch.rand(2, 2, 6, 6, generator=gen) * (torch.rand(2, 2, 6, 6, generator=gen) < 0.5)
    call = AttentionCall(1, torch.randn(2, 2, 6, 4, generator=gen),
                         torch.randn(2, 2, 6, 4, generator=gen), probs,
                         torch.ones(2, 1, 6, 6, dtype=torch.bool), 0.5, True,
                         sliding_window=3, alpha=2.0)
    graph = _layer_graph(call, 1, 5)
    assert graph.sliding_window == 3 and graph.alpha == 2.0 and graph.scaling == 0.5
    assert torch.equal(graph.gold, probs[1, :, :5, :5] > 0)
    assert torch.equal(graph.queries, call.query[1, :, :5])
