"""Long-context records: bounded extraction equals the dense path; long corpus texts."""

from __future__ import annotations

import pytest
import torch
from tolerances import assert_layers_close, transformer_terms

from sparsefinder.data.long_context import extract_long, long_texts
from sparsefinder.data.records import TextInputError, extract
from sparsefinder.metrics.scorer import Scorer
from sparsefinder.models.decoders import save_tiny_decoder
from sparsefinder.models.loading import load_model

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    folder = save_tiny_decoder("qwen2", tmp_path_factory.mktemp("lc") / "qwen2",
                               max_positions=2048, sliding_window=32)
    return load_model(str(folder), device="cpu")


def test_bounded_record_equals_the_dense_record_with_sliding_windows(qwen2):
    (text,) = long_texts(qwen2.tokenizer, 700, 1, "train")
    long = extract_long(qwen2, text, budget_mib=8)  # several blocks per layer
    (dense,) = extract(qwen2, text)
    assert long.n_tokens == dense.n_tokens == 700 and long.tokens == dense.tokens
    assert long.offsets == dense.offsets and long.causal
    # The bounded pass multiplies blocks where the dense one multiplies whole heads (float32;
    # this family normalises in float32 whatever the dtype): edge for edge except keys that
    # rounding, carried through the layers before, can move across the threshold.
    config = qwen2.model.config
    flips = []
    for index, (a, b) in enumerate(zip(long.layers, dense.layers, strict=True)):
        assert a.sliding_window == b.sliding_window
        terms = transformer_terms(layers=index, hidden=config.hidden_size,
                                  intermediate=config.intermediate_size, n=700)
        assert_layers_close(a, b, terms=terms + config.hidden_size)
        flips.append((a.gold != b.gold).sum((-2, -1)))
    assert [layer.sliding_window for layer in long.layers] == [None, 32]
    # a head allows at least n pairs (every row its own key): each flipped edge moves its gold
    # sparsity by at most 1/n
    difference = (Scorer(long).gold_sparsity - Scorer(dense).gold_sparsity).abs()
    assert bool((difference <= torch.stack(flips) / long.n_tokens).all())


def test_long_texts_have_the_asked_length_and_bad_sizes_are_named(qwen2):
    texts = long_texts(qwen2.tokenizer, 1000, 3, "train")
    assert len(texts) == 3
    assert all(len(qwen2.tokenizer(t)["input_ids"]) in range(990, 1011) for t in texts)
    with pytest.raises(ValueError, match="fewer than one text of"):
        long_texts(qwen2.tokenizer, 10**7, 1, "validation")
    with pytest.raises(ValueError, match="must be >= 1"):
        long_texts(qwen2.tokenizer, 0, 1)


def test_too_long_text_is_refused_with_the_limit(qwen2):
    (text,) = long_texts(qwen2.tokenizer, 2100, 1, "train")
    with pytest.raises(TextInputError, match="maximum of 2048"):
        extract_long(qwen2, text)


def test_supports_are_the_bounded_records_gold_bit_for_bit(qwen2):
    """The bit-packed supports (every layer, windows included) come from the same blocks as
    the bounded record's edges: the same pairs exactly, and the sparsity they imply."""
    from sparsefinder.attention.masks import layer_allowed
    from sparsefinder.data.long_context import extract_supports

    (text,) = long_texts(qwen2.tokenizer, 300, 1, "train")
    supports = extract_supports(qwen2, text, budget_mib=2)
    long = extract_long(qwen2, text, budget_mib=2)
    assert supports.tokens == long.tokens and supports.causal
    assert supports.sliding_windows == {1: 32}
    kept = allowed = 0
    for bits, layer in zip(supports.layers, long.layers, strict=True):
        assert torch.equal(bits.to_dense(), layer.gold)
        kept += int(layer.gold.sum())
        allowed += bits.heads * int(layer_allowed(300, 300, causal=True,
                                                  sliding_window=layer.sliding_window).sum())
    assert supports.sparsity() == pytest.approx(1 - kept / allowed)
    assert 0.0 < supports.sparsity() < 1.0
    with pytest.raises(TextInputError, match="maximum of 2048"):
        extract_supports(qwen2, long_texts(qwen2.tokenizer, 2100, 1, "train")[0])
