"""The block overview figure: recall heatmap, predicted-only heatmap, a clickable strip of
query blocks, window outline."""

from __future__ import annotations

import json

import numpy as np
import plotly.io as pio
import torch

from sparsefinder.explore.long_view import block_overview
from sparsefinder.figures.blocks import STRIP_TRACE, STRIP_X, block_overview_figure


def _figure():
    n = 128
    gold = torch.zeros(n, n, dtype=torch.bool)
    gold[10, 5] = gold[100, 40] = gold[101, 41] = True
    pred = gold.clone()
    pred[100, 40] = False
    pred[64, 64] = pred[65, 70] = True
    return block_overview_figure(block_overview(gold, pred, block=16), (32, 96))


def test_cells_are_recall_and_predicted_only_heatmaps_blank_elsewhere():
    with_gold, only_pred, _ = _figure().data
    assert with_gold.type == only_pred.type == "heatmap"
    recall, counts = with_gold.z, with_gold.customdata
    assert recall.shape == (8, 8)
    assert recall[0, 0] == 1.0 and recall[6, 2] == 0.5  # one of two gold edges kept
    assert counts[0, 0] == 1 and counts[6, 2] == 2
    assert np.isnan(recall).sum() == 62  # every block without a gold edge is blank
    grey = only_pred.z
    assert grey[4, 4] == 2 and np.isnan(grey).sum() == 63  # two predicted pairs, no gold
    assert (with_gold.zmin, with_gold.zmax) == (0.0, 1.0)


def test_strip_carries_each_query_blocks_first_position_and_the_window_is_outlined():
    figure = _figure()
    strip = figure.data[STRIP_TRACE]
    assert strip.type == "scatter"  # selectable in Streamlit (a heatmap is not)
    assert strip.customdata.tolist() == [16 * i for i in range(8)]
    assert strip.y.tolist() == list(range(8)) and set(strip.x.tolist()) == {STRIP_X}
    (box,) = figure.layout.shapes
    assert (box.x0, box.x1) == (32 / 16 - 0.5, 96 / 16 - 0.5)
    assert figure.layout.xaxis.range[0] < STRIP_X  # the strip is in view


def test_serialises_compactly_for_the_browser():
    """numpy arrays go out as base64 typed arrays, not lists of numbers: a 128 × 128 grid
    with an edge in every block stays a few hundred KB."""
    n = 4096
    gold = torch.rand(n, n, generator=torch.Generator().manual_seed(0)) < 0.02
    figure = block_overview_figure(block_overview(gold, gold | gold.T, block=32), (0, 256))
    text = pio.to_json(figure, validate=False)
    data = json.loads(text)["data"]
    assert data[0]["z"]["dtype"] == "f4" and data[0]["customdata"]["dtype"] == "u2"
    assert len(text) < 400_000, len(text)
