"""The block overview figure: one point per block with an edge, recall colour, window box."""

from __future__ import annotations

import torch

from sparsefinder.explore.long_view import block_overview
from sparsefinder.figures.blocks import block_overview_figure


def test_points_hover_data_and_window_outline():
    n = 128
    gold = torch.zeros(n, n, dtype=torch.bool)
    gold[10, 5] = gold[100, 40] = True
    pred = gold.clone()
    pred[100, 40] = False
    pred[64, 64] = True
    figure = block_overview_figure(block_overview(gold, pred, block=16), (32, 96)).to_dict()
    with_gold, only_pred = figure["data"]
    assert sorted(zip(with_gold["y"], with_gold["x"], strict=True)) == [(0, 0), (6, 2)]
    assert list(with_gold["marker"]["color"]) == [1.0, 0.0]
    assert list(zip(only_pred["y"], only_pred["x"], strict=True)) == [(4, 4)]
    first = with_gold["customdata"][0]
    assert first[:5] == [0, 0, 15, 0, 15] and first[5:] == [1, 1]  # queries, keys, counts
    (box,) = figure["layout"]["shapes"]
    assert (box["x0"], box["x1"]) == (32 / 16 - 0.5, 96 / 16 - 0.5)
