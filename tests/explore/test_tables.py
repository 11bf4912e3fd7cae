"""sparsefinder.explore: tables, diffs and downloads (no Streamlit)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from sparsefinder.explore import live, tables
from sparsefinder.explore import state as urlstate

#: The raw (uncalibrated) distance family: ViewState defaults to its calibrated form.
RAW_DISTANCE = {"method": "distance", "calibration": "none"}


def test_diff_codes_and_counts():
    pred = torch.tensor([[True, True], [False, False]])
    gold = torch.tensor([[True, False], [True, False]])
    codes = tables.diff_codes(pred, gold)
    assert codes.tolist() == [[tables.DIFF_TP, tables.DIFF_FP], [tables.DIFF_FN, tables.DIFF_NONE]]
    assert tables.diff_counts(codes) == {"TP": 1, "FN": 1, "FP": 1}
    with pytest.raises(ValueError, match="must match"):
        tables.diff_codes(pred, gold[:1])


def test_edges_frame_agrees_with_the_diff(prepared):
    record = prepared.record
    pred = live.predict_layers(prepared, urlstate.ViewState(method="window", window=3))[1][4]
    frame = tables.edges_frame(record, 1, 4, pred)
    counts = tables.diff_counts(tables.diff_codes(pred, record.layers[1].gold[4]))
    assert frame["status"].value_counts().to_dict() == {k: v for k, v in counts.items() if v}
    first = frame.iloc[0]
    assert first.query_token == record.tokens[first.query]
    gold_rows = frame[frame.gold]
    assert gold_rows.gold_prob.gt(0).all() and frame[~frame.gold].gold_prob.eq(0).all()
    gold_only = tables.edges_frame(record, 1, 4)
    assert set(gold_only.status) == {"gold"} and len(gold_only) == int(record.layers[1].gold[4]
                                                                       .sum())


def test_token_row_frame_and_summary(prepared):
    record = prepared.record
    preds = live.predict_layers(prepared, urlstate.ViewState(method="window", window=3,
                                                           global_tokens=()))
    frame = tables.token_row_frame(record, preds, 0, 3)
    assert len(frame) == record.num_heads * record.n_tokens
    summary = tables.token_row_summary(frame)
    gold_row = record.layers[0].gold[:, 3, :]
    assert summary.gold_edges.tolist() == gold_row.sum(-1).tolist()
    assert summary.predicted_edges.tolist() == [3] * record.num_heads
    expected = (gold_row & preds[0][:, 3, :]).sum(-1) / gold_row.sum(-1)
    assert np.allclose(summary.recall, expected.numpy())


def test_downloads_are_valid_csv_and_json(prepared):
    state = urlstate.ViewState(**RAW_DISTANCE, t=0.5)
    scores = live.score(prepared, live.predict_layers(prepared, state))
    frame = pd.read_csv(__import__("io").BytesIO(tables.to_csv(tables.metrics_frame(scores))))
    assert list(frame.columns) == ["layer", "head", "recall", "sparsity", "gold_sparsity",
                                   "precision", "exact_fraction", "mass_recall",
                                   "block_recall16", "block_recall64"]
    assert np.allclose(frame["exact_fraction"], scores.exact_fraction.numpy().ravel())
    report = json.loads(tables.to_json(tables.view_report(state, scores, "m", 1.5, 17)))
    assert report["state"]["method"] == "distance"
    assert set(report["summary"]) == {"head", "layer", "model"}
    assert len(report["per_head"]) == prepared.num_layers * prepared.num_heads


def test_highlight_html_marks_and_escapes():
    text = "a <b> & c"
    offsets = [(0, 0), (0, 1), (2, 5), (6, 7), (8, 9), (0, 0)]
    assert (tables.highlight_html(text, offsets, [2, 3])
            == "a <mark>&lt;b&gt;</mark> <mark>&amp;</mark> c")
    merged = tables.highlight_html(text, [(2, 4), (4, 5)], [0, 1])
    assert merged == "a <mark>&lt;b&gt;</mark> &amp; c"
    assert tables.highlight_html(text, offsets, [0, 5]) == "a &lt;b&gt; &amp; c"
    assert tables.highlight_html("x\ny", [(0, 1), (2, 3)], [1]) == "x<br><mark>y</mark>"


def test_heads_codes_stack_every_head(prepared):
    preds = live.predict_layers(prepared, urlstate.ViewState(method="window", window=3))
    record = prepared.record
    n = record.n_tokens
    for kind in ("gold", "predicted", "diff"):
        codes = tables.heads_codes(record, preds, kind)
        assert codes.shape == (record.num_layers, record.num_heads, n, n)
    diff = tables.heads_codes(record, preds, "diff")
    assert np.array_equal(diff[2, 5], tables.diff_codes(preds[2][5], record.layers[2].gold[5]))
    assert np.array_equal(tables.heads_codes(record, preds, "gold")[1, 3],
                          record.layers[1].gold[3].numpy())
    with pytest.raises(ValueError, match="kind"):
        tables.heads_codes(record, preds, "probs")


def test_token_column_frame_is_the_transposed_view(prepared):
    preds = live.predict_layers(prepared, urlstate.ViewState(method="window", window=3))
    record = prepared.record
    column = tables.token_row_frame(record, preds, 1, 4, direction="column")
    gold = record.layers[1].gold[:, :, 4]
    assert column["gold"].to_numpy().reshape(gold.shape).tolist() == gold.tolist()
    probs = record.layers[1].probs()[:, :, 4].numpy()
    assert np.allclose(column["gold_prob"].to_numpy().reshape(probs.shape), probs)
    with pytest.raises(ValueError, match="direction"):
        tables.token_row_frame(record, preds, 1, 4, direction="diagonal")
