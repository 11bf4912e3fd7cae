"""The sparsity–recall figure: a frontier per curve, gold sparsity, star, offline HTML."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.evaluation.accuracy_sweep import MEASURES
from sparsefinder.evaluation.curves import resolve_methods
from sparsefinder.evaluation.sweep import sweep
from sparsefinder.figures.accuracy import accuracy_figure
from sparsefinder.figures.common import write_figure_html
from sparsefinder.figures.palette import method_color
from sparsefinder.figures.pareto import clicked_point, mark_current, pareto_figure


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
    frontier_names = {t.meta for t in fig.data if t.mode == "lines+markers"}
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
    curves = [t.meta for t in fig.data if t.mode == "lines+markers"]
    assert sorted(curves) == sorted(resolve_methods("window,topk,longformer,bigbird"))


def test_the_oracle_is_a_dashed_bound_and_the_legend_sits_outside(points) -> None:
    fig = pareto_figure(points)
    lines = {t.meta: t for t in fig.data if t.mode == "lines+markers"}
    assert lines["topk"].name == "Top-k by exact scores (reference)"
    assert lines["topk"].line.dash == "dash"
    assert lines["window"].name == "Window (w)" and lines["window"].line.dash == "solid"
    assert fig.layout.legend.x > 1 and fig.layout.legend.xanchor == "left"


def test_the_figure_grows_so_a_long_legend_is_never_cut() -> None:
    """Plotly scrolls a legend taller than the plot area (an export then cuts it): the plot
    area holds every row (20 px each at 11 px font) and the legend's title."""
    for count in (3, 8, 20, 40):
        rows = [{"method": f"m{i}", "params": "{}", "sparsity": 0.5, "recall": 0.5}
                for i in range(count)]
        fig = mark_current(pareto_figure(pd.DataFrame(rows)), 0.5, 0.5, "s")
        area = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
        assert area >= 20 * (count + 1) + 30, count


def test_a_method_has_one_colour_on_both_charts(points: pd.DataFrame) -> None:
    """The recall chart and the accuracy chart colour a method alike, whatever else they
    draw; full entmax is not a star there (the star is your setting)."""
    recall = pareto_figure(points[points["method"].isin(["window", "bigbird"])])
    frame = points.assign(**{m: 0.5 for m in MEASURES})
    accuracy = accuracy_figure(frame[frame["method"].isin(["bigbird", "longformer"])], 0.9)
    colour = {t.meta: t.line.color for t in recall.data if t.mode == "lines+markers"}
    other = {t.legendgroup: t.line.color for t in accuracy.data if t.mode == "lines+markers"}
    assert colour["bigbird"] == other["bigbird"] == method_color("bigbird")
    assert len(set(colour.values())) == 2
    assert not any(t.marker.symbol == "star" for t in accuracy.data)


def test_a_click_names_the_curve_and_its_params(points: pd.DataFrame) -> None:
    fig = mark_current(pareto_figure(points), 0.9, 0.5, "setting")
    line = next(t for t in fig.data if t.meta == "window")
    point = {"customdata": list(line.customdata[0]), "x": line.x[0], "y": line.y[0]}
    curve, params = clicked_point(point)
    assert curve == "window" and set(params) == {"window"}
    assert clicked_point({"x": 0.9, "y": 0.5}) is None  # the star has no customdata


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
