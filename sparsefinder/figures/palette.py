"""One colour per method on every chart, and the markers that mean one thing everywhere.

A curve's colour depends only on its name (never on which other curves a chart draws), so
``distance:budget`` is the same blue on the recall chart, the accuracy chart and a CSV's HTML
plot. ``<method>+window`` shares ``<method>``'s colour and is drawn dotted; an oracle (a bound,
not a method) is grey and dashed.
"""

from __future__ import annotations

import plotly.colors as pc

from sparsefinder.evaluation.curves import CURVES
from sparsefinder.explore.pareto import DEFAULT_CURVES, ORACLES

#: Distinct hues, strongest first (plotly's Dark24, then Alphabet): the curated curves take
#: the first ones, every other registered method the next, in registry order.
_HUES = [c for c in (*pc.qualitative.Dark24, *pc.qualitative.Alphabet)
         if c.upper() not in {"#222A2A", "#AAA", "#AAAAAA"}]
ORACLE_COLOR = "#757575"
#: Your current setting (the sliders): a gold star, on every chart that shows it.
CURRENT_MARKER = {"symbol": "star", "size": 16, "color": "gold",
                  "line": {"color": "black", "width": 1}}
#: Full α-entmax (the reference every method approximates): a black diamond.
FULL_MARKER = {"symbol": "diamond", "size": 12, "color": "black"}


def _base(curve: str) -> str:
    return curve.split("+")[0]


def _assign() -> dict[str, str]:
    bases = dict.fromkeys(_base(c) for c in (*DEFAULT_CURVES, *CURVES) if c not in ORACLES)
    return {base: _HUES[i % len(_HUES)] for i, base in enumerate(bases)}


_COLORS = _assign()


def method_color(curve: str) -> str:
    """The colour of a curve (``<method>+window`` takes ``<method>``'s; oracles grey); an
    unregistered name takes the next free hue, and keeps it for the process."""
    if curve in ORACLES:
        return ORACLE_COLOR
    base = _base(curve)
    if base not in _COLORS:
        _COLORS[base] = _HUES[len(_COLORS) % len(_HUES)]
    return _COLORS[base]


def method_dash(curve: str) -> str:
    """Line style: dashed for a reference on the exact scores, dotted for ``+window``, else
    solid."""
    if curve in ORACLES:
        return "dash"
    return "dot" if "+" in curve else "solid"
