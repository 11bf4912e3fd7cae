"""sparsefinder.explore.head_lines: the head view's window and edge payload."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.explore import head_lines, live
from sparsefinder.explore import state as urlstate


@pytest.mark.parametrize(("n", "center", "size", "expected"), [
    (100, 50, 40, (30, 70)),
    (100, 0, 40, (0, 40)),      # clipped at the start
    (100, 99, 40, (60, 100)),   # shifted back from the end
    (10, 5, 40, (0, 10)),       # shorter text than the window
    (100, 50, 1, (50, 51)),
])
def test_window_bounds_fit_the_text(n, center, size, expected):
    assert head_lines.window_bounds(n, center, size) == expected


def test_window_bounds_reject_bad_sizes():
    with pytest.raises(ValueError, match="window size"):
        head_lines.window_bounds(100, 5, head_lines.MAX_WINDOW + 1)
    with pytest.raises(ValueError, match="no tokens"):
        head_lines.window_bounds(0, 0, 10)


def test_edges_match_gold_and_prediction_inside_the_window(prepared):
    record = prepared.record
    preds = live.predict_layers(prepared, urlstate.ViewState(method="window", window=3,
                                                           global_tokens=()))
    layer, start, stop = 2, 3, 15
    lines = head_lines.head_lines(record, preds, layer, start, stop)
    gold = record.layers[layer].gold[:, start:stop, start:stop]
    pred = preds[layer][:, start:stop, start:stop]
    probs = record.layers[layer].probs()[:, start:stop, start:stop]
    assert lines.tokens == record.tokens[start:stop]
    assert lines.heads == list(range(record.num_heads))
    for h, rows in enumerate(lines.edges):
        got = {(q, k): (p, s) for q, k, p, s in rows}
        expected = torch.nonzero(gold[h] | pred[h]).tolist()
        assert set(got) == {(q, k) for q, k in expected}
        for (q, k), (p, s) in got.items():
            g, kept = bool(gold[h, q, k]), bool(pred[h, q, k])
            assert s == (1 if g and kept else 2 if g else 3)
            assert p == pytest.approx(float(probs[h, q, k]), rel=1e-6)
            assert (p > 0) == g


def test_out_of_window_counts_add_up_to_the_whole_row_and_column(prepared):
    record = prepared.record
    preds = live.predict_layers(prepared, urlstate.ViewState(method="window", window=3))
    layer, start, stop = 0, 4, 12
    lines = head_lines.head_lines(record, preds, layer, start, stop, heads=[1, 5])
    gold = record.layers[layer].gold
    for i, h in enumerate([1, 5]):
        inside = [sum(1 for q, k, _, s in lines.edges[i] if s != 3 and q == j)
                  for j in range(stop - start)]
        total = gold[h, start:stop, :].sum(-1).tolist()
        assert [a + b for a, b in zip(inside, lines.out_as_query[i], strict=True)] == total
        inside_k = [sum(1 for q, k, _, s in lines.edges[i] if s != 3 and k == j)
                    for j in range(stop - start)]
        assert [a + b for a, b in zip(inside_k, lines.out_as_key[i], strict=True)] == \
            gold[h, :, start:stop].sum(-2).tolist()
    assert lines.to_json()["heads"] == [1, 5]


def test_bad_windows_and_predictions_are_refused(prepared):
    record = prepared.record
    preds = live.predict_layers(prepared, urlstate.ViewState(method="window", window=3))
    with pytest.raises(ValueError, match="window"):
        head_lines.head_lines(record, preds, 0, 5, 5)
    with pytest.raises(ValueError, match="layer"):
        head_lines.head_lines(record, preds, record.num_layers, 0, 5)
    with pytest.raises(ValueError, match="does not match"):
        head_lines.head_lines(record, [p[:, :3, :3] for p in preds], 0, 0, 3)


def test_a_click_payload_becomes_a_token_and_a_direction():
    from sparsefinder.explore.head_lines import picked_token

    assert picked_token({"side": "query", "index": 4}, 10) == (4, "row")
    assert picked_token({"side": "key", "index": 0}, 10) == (0, "column")
    for bad in (None, [], {"side": "query"}, {"side": "x", "index": 1},
                {"side": "key", "index": 10}, {"side": "key", "index": -1},
                {"side": "query", "index": True}, {"side": "query", "index": "3"}):
        assert picked_token(bad, 10) is None, bad
