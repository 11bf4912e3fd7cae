"""The Explorer's accuracy of a setting on one text (tiny random BERT, built here)."""

from __future__ import annotations

import pytest
from tolerances import bound

from sparsefinder.explore.accuracy import reference, setting_accuracy
from sparsefinder.methods.spec import PredictorSpec
from sparsefinder.models.loading import LoadedModel

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

TEXT = "Sparse attention keeps only a few keys for every query in this sentence."


@pytest.fixture(scope="module")
def tiny(tiny_entmax_bert) -> LoadedModel:
    return tiny_entmax_bert


def test_setting_accuracy_on_one_text(tiny: LoadedModel) -> None:
    full = reference(tiny, TEXT)
    dense = setting_accuracy(tiny, TEXT, PredictorSpec.of("window", {"window": 255}), None, full)
    assert dense.output_cosine == 1.0 and dense.sparsity == 0.0
    narrow = setting_accuracy(tiny, TEXT, PredictorSpec.of("window", {"window": 1}), None, full)
    assert narrow.output_cosine < 0.99 and len(narrow.layer_cosine) == 2
    n = len(tiny.tokenizer(TEXT)["input_ids"])
    assert narrow.sparsity == pytest.approx(1 - 1 / n) and narrow.repaired_rows == 0.0
    empty = setting_accuracy(tiny, TEXT, PredictorSpec.of("window", {"window": 0}), None)
    assert empty.repaired_rows == 1.0 and empty.sparsity == narrow.sparsity
    with pytest.raises(ValueError, match="sparsefinder train --model tiny --out DIR"):
        setting_accuracy(tiny, TEXT, PredictorSpec.of("distance", {"threshold": 1.0}), None)


def test_task_accuracy_is_perfect_at_recall_one_and_needs_two_texts(default_model):
    from sparsefinder.explore.accuracy import task_accuracy
    from sparsefinder.methods.spec import PredictorSpec

    texts = ["The cat sat on the mat.", "Stocks fell sharply on Monday.",
             "A kitten slept on the rug."]
    full_graph = PredictorSpec.of("window", {"window": 999})  # every pair kept
    result = task_accuracy(default_model, texts, full_graph, None)
    assert (result.retrieval_top1, result.n_texts) == (1.0, 3)
    assert result.retrieval_ndcg10 == pytest.approx(1.0)
    # cosine of (nearly) equal float32 vectors: a dot product and two norms of d terms each
    hidden = default_model.model.config.hidden_size
    assert result.embedding_cosine == pytest.approx(1.0, abs=bound(1.0, terms=2 * hidden + 4))
    with pytest.raises(ValueError, match="two texts"):
        task_accuracy(default_model, texts[:1], full_graph, None)
