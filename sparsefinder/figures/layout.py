"""Sizes of the head figure (gold | predicted | diff) from the width it is drawn in.

Plotly draws a figure at the height the server gives it, so a square panel only grows with the
page when the server knows the page's width: the app measures its main column and passes it
here (:func:`head_height`). Tick labels follow the cell size (:func:`tick_plan`): every k-th
token, at a font that fits, so rotated labels never overlap however many tokens are shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Width of the app's main column at 1280×800 with the sidebar open (CSS px): what a figure
#: is sized for until the browser reports the real width.
DEFAULT_WIDTH = 820
#: Horizontal gap between two panels, as a share of the figure's width.
PANEL_GAP = 0.04
PANELS = 3
#: Space above the panels for their titles (px).
TITLE_PX = 40
#: Space under the labels for the "key" axis title, and the y labels' share of the width.
AXIS_TITLE_PX = 22
Y_LABELS_PX = 70
#: Tick font sizes (px): never larger (a big cell gets a readable, not a huge, label) and
#: never smaller (smaller is unreadable: label fewer tokens instead).
MAX_FONT = 11
MIN_FONT = 7
#: Steps between labelled tokens, smallest first: round numbers read well on an axis.
NICE_STEPS = (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000)
#: Characters of a tick label at most (longer tokens end with "…").
TICK_CHARS = 10
#: Side of a panel at least and at most (px): small enough for a laptop's first screen,
#: large enough to read a short text.
MIN_SIDE = 220
MAX_SIDE = 900


@dataclass(frozen=True)
class TickPlan:
    """Label every ``step``-th token at ``font`` px: labels are at least ``font`` px apart."""

    step: int
    font: int

    def positions(self, n: int) -> list[int]:
        """The labelled token positions of an axis of ``n`` tokens."""
        return list(range(0, n, self.step))


def tick_plan(n: int, panel_px: float) -> TickPlan:
    """Which tokens to label, and how big, for ``n`` tokens on a side of ``panel_px`` pixels.

    A rotated label is one line of text high, so two labels ``step`` tokens apart do not
    overlap when ``step · cell ≥ font`` (cell = ``panel_px / n``). The step is the smallest
    round number that keeps labels of :data:`MIN_FONT` apart; the font then grows into the
    room the step leaves, up to :data:`MAX_FONT`.
    """
    if n < 1 or panel_px <= 0:
        raise ValueError(f"tick_plan needs n ≥ 1 tokens and a positive panel size, got n={n}, "
                         f"panel_px={panel_px}")
    cell = panel_px / n
    smallest = int(min(MAX_FONT, max(MIN_FONT, math.floor(cell))))
    need = smallest / cell
    step = next((s for s in NICE_STEPS if s >= need), math.ceil(need))
    # a round step leaves room: use it for a bigger font, as far as the labels stay apart
    return TickPlan(step, int(min(MAX_FONT, max(smallest, math.floor(step * cell)))))


def panel_side(width: float) -> int:
    """Side (px) of one square panel when the figure is ``width`` px wide."""
    share = (1 - (PANELS - 1) * PANEL_GAP) / PANELS
    side = (width - Y_LABELS_PX) * share
    return int(min(MAX_SIDE, max(MIN_SIDE, side)))


def label_px(font: int, chars: int = TICK_CHARS) -> int:
    """Height (px) a rotated tick label of ``chars`` characters takes under the axis."""
    return math.ceil(0.62 * font * chars) + 4


def head_height(width: float | None, n: int, chars: int = TICK_CHARS) -> int:
    """Height (px) of the head figure drawn ``width`` px wide (None: :data:`DEFAULT_WIDTH`)
    with ``n`` tokens per axis and labels of at most ``chars`` characters: the square panels,
    their titles and their labels, nothing more (no empty band under the panels)."""
    side = panel_side(width or DEFAULT_WIDTH)
    font = tick_plan(max(n, 1), side).font
    return side + TITLE_PX + label_px(font, chars) + AXIS_TITLE_PX
