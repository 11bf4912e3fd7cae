"""The sparsity–recall figure: a frontier per curve, gold sparsity, star, offline HTML."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.evaluation.curves import resolve_methods
from sparsefinder.evaluation.sweep import sweep
from sparsefinder.figures.common import write_figure_html
from sparsefinder.figures.pareto import mark_current, pareto_figure


def _record(gen: torch.Generator, n: int, heads: int = 2, d: int = 8) -> AttentionRecord:
    layers = []
    for _ in range(2):
        q, k = torch.randn(heads, n, d, generator=gen), torch.randn(heads, n, d, generator=gen)
        scores = q @ k.transpose(-1, -2)
        gold = scores >= scores.topk(3, dim=-1).values[..., -1:]
        layers.append(LayerGraph(q, k, gold, torch.ones(int(gold.sum())) / 3, d**-0.5))
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=False, layers=layers)


@pytest.fixture(scope="module")
def points() -> pd.DataFrame:
    gen = torch.Generator().manual_seed(0)
    return sweep([_record(gen, 12), _record(gen, 16)], None, "window,topk,longformer,bigbird")


def test_figure_traces_vline_and_html(points: pd.DataFrame, tmp_path) -> None:
    fig = pareto_figure(points)
    frontier_names = {t.name for t in fig.data if t.mode == "lines+markers"}
    assert frontier_names == set(points["method"])
    assert len(fig.data) == 2 * points["method"].nunique()
    vlines = [s for s in fig.layout.shapes if s.line.dash == "dash"]
    assert len(vlines) == 1 and vlines[0].x0 == pytest.approx(points.attrs["gold_sparsity"])
    assert "window" in str(fig.data[0].customdata[0])
    path = write_figure_html(fig, tmp_path / "pareto.html")
    html = path.read_text(encoding="utf-8")
    assert '<script src="https://cdn.plot.ly' not in html  # plotly.js inlined
    assert len(html) > 1_000_000


def test_figure_has_a_curve_per_method(points: pd.DataFrame) -> None:
    fig = pareto_figure(points)
    curves = [t.name for t in fig.data if t.mode == "lines+markers"]
    assert sorted(curves) == sorted(resolve_methods("window,topk,longformer,bigbird"))


def test_mark_current_adds_one_star(points: pd.DataFrame) -> None:
    fig = mark_current(pareto_figure(points), 0.9, 0.5, "setting")
    star = fig.data[-1]
    assert star.marker.symbol == "star" and (star.x[0], star.y[0]) == (0.9, 0.5)


def test_seventeen_methods_get_seventeen_colours_and_room_for_the_legend() -> None:
    rows = [{"method": f"m{i}", "params": "{}", "sparsity": 0.5, "recall": 0.5}
            for i in range(17)]
    fig = pareto_figure(pd.DataFrame(rows))
    colours = {t.line.color for t in fig.data if t.mode == "lines+markers"}
    assert len(colours) == 17
    assert fig.layout.height >= 30 + 18 * 17
