"""sparsefinder.figures.layout: the head figure's size follows the width, its tick labels the
cell size."""

from __future__ import annotations

import numpy as np
import pytest

from sparsefinder.figures import graphs as plots
from sparsefinder.figures import layout


@pytest.mark.parametrize("n", [1, 2, 7, 20, 33, 61, 64, 100, 131, 256, 300, 512, 2048])
@pytest.mark.parametrize("panel_px", [120, 220, 235, 300, 431, 600, 900])
def test_labelled_ticks_are_at_least_a_font_size_apart(n, panel_px):
    plan = layout.tick_plan(n, panel_px)
    assert layout.MIN_FONT <= plan.font <= layout.MAX_FONT
    assert plan.step * panel_px / n >= plan.font  # rotated labels one line high: no overlap
    positions = plan.positions(n)
    assert positions[0] == 0
    assert {b - a for a, b in zip(positions, positions[1:], strict=False)} <= {plan.step}


def test_ticks_label_every_token_when_cells_are_big_and_thin_out_when_small():
    assert layout.tick_plan(20, 431) == layout.TickPlan(1, layout.MAX_FONT)
    small = layout.tick_plan(512, 235)
    assert small.step in layout.NICE_STEPS and small.step > 10
    # the smallest step that keeps labels apart: half of it would overlap
    assert (small.step // 2) * 235 / 512 < layout.MIN_FONT or small.step == 1


def test_a_bad_size_is_refused_with_what_was_given():
    with pytest.raises(ValueError, match="n=0"):
        layout.tick_plan(0, 300)


def test_the_figure_is_taller_on_a_wider_page_and_has_no_empty_band():
    narrow, wide = layout.head_height(820, 131), layout.head_height(1460, 131)
    assert wide > narrow
    for width, height in ((820, narrow), (1460, wide)):  # panels, titles, labels: no more
        side = layout.panel_side(width)
        font = layout.tick_plan(131, side).font
        assert height == side + layout.TITLE_PX + layout.label_px(font) + layout.AXIS_TITLE_PX
    assert layout.head_height(None, 131) == narrow  # the default is a 1280-px screen
    assert layout.panel_side(10_000) == layout.MAX_SIDE and layout.panel_side(0) == \
        layout.MIN_SIDE


def _figure(n: int, width: float | None):
    labels = [f"{i} · tok{i}" for i in range(n)]
    gold = np.eye(n, dtype=bool)
    codes = gold.astype(np.uint8)
    return plots.head_figure(gold, gold, codes, labels, "L0H0", {"TP": n, "FN": 0, "FP": 0},
                             width=width)


def test_head_figure_follows_the_width_and_spaces_its_labels():
    narrow, wide = _figure(131, 820), _figure(131, 1460)
    assert wide.layout.height > narrow.layout.height
    for figure, width in ((narrow, 820), (wide, 1460)):
        plan = layout.tick_plan(131, layout.panel_side(width))
        axis = figure.layout.xaxis
        assert list(axis.tickvals) == plan.positions(131)
        assert axis.tickfont.size == plan.font
        assert figure.layout.yaxis.tickfont.size == plan.font


def test_each_panel_title_says_what_its_colour_means():
    titles = [a.text for a in _figure(10, None).layout.annotations]
    gold, pred, diff = titles
    assert "(p>0)" in gold and "rgb(33,33,33)" in gold
    assert "kept pairs" in pred and "rgb(25,118,210)" in pred
    assert all(f"{c} " in diff for c in ("TP", "FN", "FP"))


def test_panel_titles_fit_their_panel_at_any_edge_count():
    """Each title line fits the width of its panel (a 0.6-em average glyph at 11 px), even with
    six-digit counts at the narrowest panel: titles never run into the next panel's."""
    import re

    n = 512
    gold = np.ones((n, n), dtype=bool)
    codes = np.full((n, n), 3, dtype=np.uint8)
    counts = {"TP": 262144, "FN": 262144, "FP": 262144}
    figure = plots.head_figure(gold, gold, codes, [str(i) for i in range(n)], "L11H11", counts,
                               width=layout.MIN_SIDE * 3)
    side = layout.panel_side(layout.MIN_SIDE * 3)
    for annotation in figure.layout.annotations:
        lines = re.sub(r"<span[^>]*>|</span>|</?b>", "", annotation.text).split("<br>")
        assert len(lines) == 2  # the name, then the colour key with its counts
        assert all(0.6 * 11 * len(line) <= side for line in lines), (lines, side)
