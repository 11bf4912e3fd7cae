"""The atlas end to end on synthetic heads and on the default model's predictor."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from synthetic_heads import KINDS, synthetic_record

from sparsefinder.analysis.atlas import MIN_TEXTS, AtlasInputError, compute_atlas
from sparsefinder.analysis.atlas_io import AtlasFileError, load_atlas, save_atlas
from sparsefinder.analysis.atlas_predictor import bundled_predictor
from sparsefinder.data.records import extract
from sparsefinder.methods.spec import RecordInputs, predict_record
from sparsefinder.metrics.scorer import Scorer


@pytest.fixture(scope="module")
def atlas():
    records = [synthetic_record(n, layers=2, seed=s) for s, n in enumerate((12, 16, 20, 24))]
    return compute_atlas(lambda: records, meta={"corpus": "synthetic"})


def test_one_row_per_head_with_every_statistic(atlas):
    heads = atlas.heads
    assert len(heads) == 2 * len(KINDS)
    assert heads[["layer", "head"]].values.tolist() == [[la, h] for la in range(2)
                                                         for h in range(len(KINDS))]
    for column in ("gold_sparsity", "gold_sparsity_q10", "gold_sparsity_q90",
                   "sparsity_per_100_tokens", "gold_sparsity_len0", "support", "support_q50",
                   "entropy", "distance", "diagonal", "previous", "next", "first", "last",
                   "punctuation", "contiguous", "pred_recall", "type", "type_label"):
        assert column in heads.columns, column
    assert heads["pred_recall"].isna().all()  # no predictor given
    assert atlas.meta["n_texts"] == 4 and atlas.meta["corpus"] == "synthetic"
    assert atlas.type_counts().loc[0].to_dict() == {kind: 1 for kind in KINDS}


def test_typical_rows_come_from_different_texts_and_fit_the_head(atlas):
    previous = KINDS.index("previous")
    rows = atlas.examples[f"0.{previous}"]
    assert len(rows) == 3 and len({r["text_id"] for r in rows}) == 3
    for row in rows:
        assert row["keys"][0][0] == row["query"] - 1  # the head's top key: the previous token
        assert row["query"] not in (0, row["n_tokens"] - 1)  # special rows are not examples
        assert row["text_id"] in atlas.texts
    assert atlas.heads.loc[previous, "typical_text_id"] == rows[0]["text_id"]


def test_copies_of_a_head_are_neighbours(atlas):
    count = len(KINDS)
    # layer 1 repeats layer 0: each head's nearest other head is its copy
    sim = atlas.similarity + np.eye(2 * count) * 9
    assert sim.argmin(1).tolist() == [*range(count, 2 * count), *range(count)]
    position = {head: i for i, head in enumerate(atlas.order)}
    assert all(abs(position[h] - position[h + count]) == 1 for h in range(count))


def test_too_small_a_corpus_names_the_minimum():
    records = [synthetic_record(12, seed=s) for s in range(MIN_TEXTS - 1)]
    with pytest.raises(AtlasInputError, match=f"at least {MIN_TEXTS} texts.*gave {MIN_TEXTS - 1}"):
        compute_atlas(lambda: records)
    with pytest.raises(AtlasInputError, match="gave none"):
        compute_atlas(lambda: [])


def test_files_round_trip(atlas, tmp_path):
    csv_path, json_path = save_atlas(atlas, tmp_path)
    table = pd.read_csv(csv_path)
    assert len(table) == len(atlas.heads) and table["type"].tolist() == atlas.heads["type"].tolist()
    json.loads(json_path.read_text())  # strict JSON (no NaN)
    again = load_atlas(tmp_path)
    # the file keeps 6 decimals (np.round in atlas_io): ±0.5e-6
    np.testing.assert_allclose(again.similarity, atlas.similarity, rtol=0, atol=0.5e-6)
    assert again.order == atlas.order and again.examples == atlas.examples
    assert again.sparsity_hist.shape == atlas.sparsity_hist.shape
    json_path.write_text('{"format": "other"}')
    with pytest.raises(AtlasFileError, match="sparsefinder atlas"):
        load_atlas(json_path)


def test_predictor_scores_are_the_scorers_macro_means(default_model):
    texts = ["The cat sat on the mat because it was warm.", "Rain fell all day; we stayed in.",
             "Entmax attention keeps only a few keys per query.", "Why not? It works, mostly."]
    records = extract(default_model, texts)
    predictor = bundled_predictor(default_model.model_id)
    assert predictor is not None and predictor.spec.method_id == "distance:budget"
    assert predictor.spec.window == 0 and predictor.spec.global_tokens == ()
    atlas = compute_atlas(lambda: records, predictor)
    built = predictor.spec.build_layers(predictor.projections, 6, predictor.fitted)
    per_text = [Scorer(r).score(predict_record(predictor.spec, built,
                                               RecordInputs(r, predictor.projections)))
                for r in records]
    for name in ("recall", "mass_recall", "exact_fraction", "sparsity"):
        expected = torch.stack([getattr(s, name) for s in per_text]).mean(0).reshape(-1)
        np.testing.assert_allclose(atlas.heads[f"pred_{name}"], expected.numpy(), atol=1e-12)
    assert atlas.meta["predictor"] == (
        "distance:budget floor=12 floor_share=1 target_sparsity=0.9")


def test_local_layers_are_measured_over_their_window(sparse_modernbert_records):
    """ModernBERT's local layers (softmax, ±4 keys) attend to every pair of their window:
    counted over the window's pairs they are dense (sparsity 0, every allowed key in the
    support), not 'sparse' against the whole text."""
    records = sparse_modernbert_records
    assert len(records) >= MIN_TEXTS and all(r.n_tokens > 9 for r in records)
    heads = compute_atlas(lambda: records).heads.set_index(["layer", "head"])
    for layer in (1, 2):
        rows = heads.loc[layer]
        assert (rows["type"] == "dense").all()
        assert rows["gold_sparsity"].abs().max() < 1e-9
        assert (rows["support_fraction"] - 1).abs().max() < 1e-9
        assert rows["support"].max() <= 9  # the window: the query and 4 keys on each side
    assert (heads.loc[0, "gold_sparsity"] > 0).all()  # the global layers are entmax-sparse
