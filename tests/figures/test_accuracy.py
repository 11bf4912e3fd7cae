"""Sparsity–accuracy figure: one panel per measure, frontiers, full entmax star, gold line."""

from __future__ import annotations

import json

import pandas as pd

from sparsefinder.evaluation.accuracy_sweep import MEASURES
from sparsefinder.figures.accuracy import accuracy_figure


def test_accuracy_figure_panels_full_entmax_and_gold_line() -> None:
    rows = [("distance", 0.5, 0.99), ("distance", 0.9, 0.6), ("window", 0.7, 0.5)]
    df = pd.DataFrame([
        {"method": m, "params": json.dumps({"i": i}), "sparsity": s,
         **{measure: v for measure in MEASURES}}
        for i, (m, s, v) in enumerate(rows)
    ])
    fig = accuracy_figure(df, gold_sparsity=0.93, title="t")
    titles = [a.text for a in fig.layout.annotations]
    assert "retrieval top-1 agreement" in titles and "output cosine (token states)" in titles
    full = [t for t in fig.data if t.marker.symbol == "diamond"]
    assert len(full) == len(MEASURES) and full[0].x == (0.93,) and full[0].y == (1.0,)
    assert full[0].name == "full α-entmax"
    assert len([s for s in fig.layout.shapes if s.x0 == 0.93]) == len(MEASURES)
    frontier = [t for t in fig.data if t.name == "Distance (t)" and t.mode == "lines+markers"]
    assert len(frontier) == len(MEASURES) and list(frontier[0].x) == [0.5, 0.9]
