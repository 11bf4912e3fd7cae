"""The notebook explorer: live controls redraw the panels, a tile click opens its head, the
saved file is self-contained, and without widgets it says why."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from sparsefinder.notebook import explorer, session
from sparsefinder.notebook.explorer import Explorer

pytestmark = pytest.mark.slow


def test_notebook_controls_redraw_head_headline_and_grid(prepared):
    ex = Explorer(prepared, widgets=True)
    before = ex.headline.value
    ex.controls["layer"].value = 3
    ex.controls["head"].value = 1
    assert "Gold L3H1" in ex.head_widget.layout.annotations[0].text
    assert "L3H1" in ex.headline.value and ex.headline.value != before
    ex.controls["method"].value = "kmeans"
    assert ex.controls["target"].disabled  # k-means has no target sparsity
    expected = session.compute(prepared, session.state_for("kmeans", 0.9, 3, 1))
    assert ex.view.summary["model"].recall == expected.summary["model"].recall
    assert ex.view.label.startswith("k-means")
    outline = ex.grid_widget.layout.shapes[-1]
    assert outline.y0 + 1.5 == pytest.approx(3 * (outline.x0 + 1.5))


def test_notebook_target_slider_moves_the_sparsity(prepared):
    ex = Explorer(prepared, method="distance:budget", widgets=True)
    ex.controls["target"].value = 0.5
    low = ex.view.summary["model"].sparsity
    ex.controls["target"].value = 0.95
    assert ex.view.summary["model"].sparsity > low


def test_notebook_tile_click_opens_that_head(prepared):
    ex = Explorer(prepared, widgets=True)
    heads = prepared.num_heads
    ex._on_tile(None, SimpleNamespace(point_inds=[2 * heads + 5]), None)
    assert (ex.view.state.layer, ex.view.state.head) == (2, 5)


def test_notebook_save_html_is_one_offline_file(prepared, tmp_path):
    ex = Explorer(prepared, method="kmeans", layer=1, widgets=False)
    text = ex.save_html(tmp_path / "view.html").read_text(encoding="utf-8")
    assert "<script src=\"http" not in text and "cdn" not in text.lower().split("plotly.js")[0]
    assert text.count("Plotly.newPlot") == 2  # the head and the grid
    assert len(text) > 1_000_000  # plotly.js itself is inlined
    assert "k-means" in text and "L1H0" in text


def test_notebook_unknown_method_is_refused_naming_the_choices(prepared):
    with pytest.raises(ValueError, match="choose one of: distance-floor:budget"):
        Explorer(prepared, method="no-such-method", widgets=False)


def test_notebook_without_a_kernel_says_why_figures_are_static():
    assert "not running in a Jupyter kernel" in explorer.widget_support()


def test_notebook_without_ipywidgets_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)
    reason = explorer.widget_support()
    assert reason.startswith("ipywidgets is not installed (pip install ipywidgets")
