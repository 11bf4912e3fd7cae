"""sparsefinder.figures.graphs helpers that carry logic of their own (pooling, overlay policy)."""

from __future__ import annotations

import numpy as np
import pytest

from sparsefinder.figures import graphs as plots


def test_pool_keeps_every_edge_and_the_most_important_class():
    codes = np.zeros((5, 5), dtype=np.uint8)
    codes[0, 0], codes[0, 1] = 3, 2  # FP and FN in one 2×2 block: FN wins
    codes[4, 4] = 1  # a lone TP in the padded corner block survives
    pooled = plots.pool(codes, 2, [0, 2, 3, 1])
    assert pooled.shape == (3, 3)
    assert pooled[0, 0] == 2 and pooled[2, 2] == 1 and pooled.sum() == 3
    edges = np.eye(7, dtype=np.uint8)
    assert plots.pool(edges, 3, [0, 1]).diagonal().tolist() == [1, 1, 1]
    assert plots.pool(edges, 1, [0, 1]) is edges


def test_head_figure_pools_long_texts_and_keeps_integer_axes():
    n = 480
    labels = [f"{i} · t{i}" for i in range(n)]
    gold = np.eye(n, dtype=bool)
    pred = np.zeros((n, n), dtype=bool)
    codes = gold.astype(np.uint8) * 2  # all FN
    figure = plots.head_figure(gold, pred, codes, labels, "L0H0",
                               {"TP": 0, "FN": n, "FP": 0})
    images = [t for t in figure.to_dict()["data"] if t["type"] == "image"]
    assert [t["dx"] for t in images] == [2, 2, 2] and images[0]["x0"] == 0.5
    assert figure.layout.xaxis.range == (-0.5, n - 0.5)
    # 480 gold edges fit the hover budget: labelled overlay; the empty prediction has none
    names = [t["name"] for t in figure.to_dict()["data"] if t["type"] == "scattergl"]
    assert names == ["gold", "FN"]


def test_edge_hover_on_the_diff_panel_only_keeps_every_edge_there():
    n = 12
    labels = [f"{i} · t{i}" for i in range(n)]
    gold, pred = np.eye(n, dtype=bool), np.eye(n, k=1, dtype=bool)
    pred[3, 3] = True
    codes = np.zeros((n, n), dtype=np.uint8)
    codes[gold & pred], codes[gold & ~pred], codes[pred & ~gold] = 1, 2, 3
    counts = {"TP": 1, "FN": n - 1, "FP": n - 1}
    every = plots.head_figure(gold, pred, codes, labels, "L0H0", counts)
    diff = plots.head_figure(gold, pred, codes, labels, "L0H0", counts, edge_hover="diff")
    markers = [t for t in diff.data if t.type == "scattergl"]
    assert {t.xaxis for t in markers} == {"x3"}  # the diff panel's only
    assert sorted(t.name for t in markers) == ["FN", "FP", "TP"]
    shown = {(int(r), int(c)) for t in markers for r, c in zip(t.y, t.x, strict=True)}
    assert shown == set(zip(*np.nonzero(gold | pred), strict=True))  # every edge hovers
    assert [t for t in every.data if t.type == "scattergl" and t.xaxis == "x3"] == markers
    assert len([t for t in every.data if t.type == "scattergl"]) == 5
    assert [t.type for t in diff.data].count("image") == 3  # positions hover everywhere
    with pytest.raises(ValueError, match="edge_hover"):
        plots.head_figure(gold, pred, codes, labels, "L0H0", counts, edge_hover="gold")


def _outlined(n: int):
    labels = [f"{i} · t{i}" for i in range(n)]
    empty = np.zeros((n, n), dtype=bool)
    figure = plots.head_figure(empty, empty, np.zeros((n, n), dtype=np.uint8), labels, "L0H0",
                               {"TP": 0, "FN": 0, "FP": 0})
    edges = np.zeros((n, n), dtype=bool)
    edges[2, [3, 5]] = edges[7, 5] = True
    rows = np.zeros(n, dtype=bool)
    rows[[2, 7]] = True
    plots.outline_cluster(figure, edges, rows, 4, labels)
    for axis in ("xaxis", "xaxis2", "xaxis3"):  # the ticks at -1.5 are inside the range
        assert figure.layout[axis].range[0] < -1.5 < figure.layout[axis].range[1]
    for axis in ("yaxis", "yaxis2", "yaxis3"):
        assert figure.layout[axis].range[1] < -1.5 < figure.layout[axis].range[0]
    return [t for t in figure.data if t.name == "cluster 4"]


def test_a_cluster_outline_is_thin_and_on_long_texts_only_ticks():
    short = _outlined(20)
    assert len(short) == 6  # edges and query ticks on each of the three panels
    squares = [t for t in short if t.marker.symbol == "square-open"]
    assert len(squares) == 3 and len(squares[0].x) == 3
    assert squares[0].marker.line.width < 1 and "0.55" in squares[0].marker.color
    long = _outlined(512)
    assert len(long) == 6
    assert not [t for t in long if t.marker.symbol == "square-open"]  # no marker per edge
    keys = [t for t in long if t.marker.symbol == "triangle-down"]
    assert len(keys) == 3 and sorted(keys[0].x) == [3, 5]  # the keys its edges reach
    assert all(t.marker.size <= 6 for t in long)


def test_overview_greys_and_names_softmax_layers_and_keeps_every_cell_clickable():
    values = np.linspace(0, 1, 12).reshape(3, 4)
    fig = plots.overview_figure(values, "recall", (2, 3), softmax_layers=[1]).to_dict()
    entmax, softmax, outline = fig["data"]
    assert sorted(set(entmax["y"])) == [0, 2] and len(entmax["x"]) == 8
    assert list(entmax["marker"]["color"]) == [*values[0], *values[2]]
    assert set(softmax["y"]) == {1} and list(softmax["x"]) == [0, 1, 2, 3]
    assert softmax["marker"]["color"] == plots.SOFTMAX_CELL
    assert softmax["marker"]["symbol"] == "square-x" and "softmax" in softmax["hovertemplate"]
    assert list(softmax["customdata"]) == list(values[1])
    assert (list(outline["x"]), list(outline["y"])) == ([3], [2])
    assert list(fig["layout"]["yaxis"]["ticktext"]) == ["L0", "L1 softmax", "L2"]
    plain = plots.overview_figure(values, "recall", (0, 0)).to_dict()
    assert len(plain["data"]) == 2 and len(plain["data"][0]["x"]) == 12
    assert "softmax" not in " ".join(plain["layout"]["yaxis"]["ticktext"])


def test_a_panel_title_wider_than_its_panel_runs_left_not_over_the_next_title():
    """Thousands of edges on a narrow screen: the diff key line is wider than its panel, so
    it is set flush right (into the gap on its left), never centred over the neighbour."""
    share, left = 0.3, 0.7
    short = "<b>Diff</b><br><span style='color:red'>■</span>TP 8 FN 3 FP 3"
    wide = "<b>Diff</b><br>" + "■TP 184723 ■FN 30912 ■FP 31623"
    assert plots._title_place(short, left, share, 560) == {"x": left + share / 2,
                                                            "xanchor": "center"}
    assert plots._title_place(wide, left, share, 560) == {"x": left + share,
                                                           "xanchor": "right"}
    assert plots._title_place(wide, left, share, 2400)["xanchor"] == "center"  # room enough
