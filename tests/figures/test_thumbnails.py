"""The model view mosaic: every head a tile, every edge visible, clicks name the head."""

from __future__ import annotations

import numpy as np
import pytest

from sparsefinder.figures.thumbnails import TILE_PIXELS, heads_figure, mosaic


def test_mosaic_places_each_head_in_its_tile_with_grey_gaps():
    codes = np.zeros((2, 3, 5, 5), dtype=np.uint8)
    codes[1, 2, 4, 0] = 1  # one edge in layer 1, head 2
    image, tile = mosaic(codes, "gold")
    assert tile == 5 and image.shape == (2 * 5 + 3, 3 * 5 + 2 * 3)
    assert image[5:8].tolist() == [[4] * image.shape[1]] * 3  # the gap rows between layers
    assert np.argwhere(image == 1).tolist() == [[8 + 4, 2 * 8 + 0]]


def test_long_matrices_are_pooled_but_keep_every_edge():
    n = 512
    codes = np.zeros((1, 2, n, n), dtype=np.uint8)
    codes[0, 1, 300, 7] = 2  # a single missed gold edge (diff code FN)
    image, tile = mosaic(codes, "diff")
    assert tile <= TILE_PIXELS and (image == 2).sum() == 1


def test_heads_figure_hover_click_and_selection():
    codes = np.random.default_rng(0).integers(0, 4, (6, 12, 20, 20)).astype(np.uint8)
    values = np.linspace(0, 1, 72).reshape(6, 12)
    fig = heads_figure(codes, "diff", (3, 1), values, "recall").to_dict()
    image, points = fig["data"]
    assert image["type"] == "image" and image["source"].startswith("data:image/png")
    assert len(points["x"]) == 72 and points["text"][13] == "layer 1 · head 1<br>recall 0.183"
    assert [int(v) for v in points["customdata"][13]] == [1, 1]
    (outline,) = fig["layout"]["shapes"]
    assert outline["x0"] < 23 < outline["x1"] and outline["y0"] < 3 * 23 + 10 < outline["y1"]
    with pytest.raises(ValueError, match="kind"):
        heads_figure(codes, "probabilities", (0, 0))


def test_softmax_layers_are_greyed_and_named_in_the_model_view():
    codes = np.ones((3, 2, 10, 10), dtype=np.uint8)
    fig = heads_figure(codes, "gold", (0, 0), softmax_layers=[2]).to_dict()
    assert list(fig["layout"]["yaxis"]["ticktext"]) == ["L0", "L1", "L2 softmax"]
    veil, outline = fig["layout"]["shapes"]
    step = fig["layout"]["yaxis"]["tickvals"][1] - fig["layout"]["yaxis"]["tickvals"][0]
    assert veil["y0"] < 2 * step + 1 < veil["y1"] and "rgba" in veil["fillcolor"]
    assert outline["line"]["color"] == "crimson"
    text = fig["data"][1]["text"]
    assert "softmax" in text[4] and "softmax" in text[5] and "softmax" not in text[3]
    assert len(heads_figure(codes, "gold", (0, 0)).to_dict()["layout"]["shapes"]) == 1
