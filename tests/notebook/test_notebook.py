"""`sparsefinder.notebook.explore`: the live controls, the static fallback, the shared HTML,
and the example notebook executed in a real kernel (nbclient)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from sparsefinder.notebook import Explorer, explore

REPO = Path(__file__).resolve().parents[2]
TEXT = "The cat sat on the mat because it was warm. It purred, and the dog watched it."

pytestmark = pytest.mark.slow  # loads the default model


@pytest.fixture(scope="module")
def view(default_model) -> Explorer:
    return explore(default_model, TEXT)


def test_notebook_outside_a_kernel_falls_back_to_static_figures_saying_why(view) -> None:
    assert view.static_reason == "live controls need a Jupyter kernel (this is not one)"
    page = view.to_html(include_plotlyjs=False, reason=view.static_reason)
    assert "Static view: live controls need a Jupyter kernel" in page
    assert page.count("plotly-graph-div") == 2  # the head panels and the per-head grid


def test_notebook_controls_drive_the_view(view) -> None:
    view.static_reason = None  # build the widgets here (they need no kernel to exist)
    box = view.widget()
    assert [value for _, value in view._method.options] == view.session.methods
    assert view.session.state.method_id == "distance-floor:budget"  # calibrated (bundled)
    assert view._method.label == "distance:budget, floor=12"  # the default: floored
    before = view._headline.value
    view._layer.value, view._head.value = 2, 5
    assert (view.session.state.layer, view.session.state.head) == (2, 5)
    assert "L2H5" in view._head_fig.to_json()  # the panels show the chosen head
    view._method.value = "quest"
    assert view.session.state.method_id == "quest" and "Quest" in view._headline.value
    assert view._headline.value != before
    summary = view.session.summary()
    assert 0.0 <= summary["model"].recall <= 1.0 and 0.0 <= summary["model"].sparsity <= 1.0
    assert box.children[-1] is view._grid_fig
    view.set(method="distance:budget", layer=1, head=3)  # from code: controls follow
    assert view._method.value == "distance:budget"  # the plain calibrated distance
    view.set(method="distance-floor:budget", layer=1, head=3)  # its old name: the floored one
    assert (view._method.value, view._layer.value, view._head.value) == (
        "distance-floor:budget", 1, 3)


def test_notebook_save_html_is_one_self_contained_file(view, tmp_path) -> None:
    path = view.save_html(tmp_path / "view.html")
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.count("plotly-graph-div") == 2
    assert not re.search(r"<script[^>]+src=", page)  # plotly.js inline: no CDN, offline
    assert "Plotly.newPlot" in page


def test_notebook_of_a_model_without_a_bundle_offers_training_free_methods(
        tiny_model_dirs) -> None:
    plain = explore(str(tiny_model_dirs["bert"]), TEXT)
    methods = plain.session.methods
    assert "quest" in methods and not any(m.endswith(":budget") for m in methods)
    assert plain.session.state.method_id in methods


def test_notebook_rejects_an_empty_text(default_model) -> None:
    with pytest.raises(ValueError, match="text is empty"):
        explore(default_model, "  ")


def test_notebook_example_executes_in_a_kernel(tmp_path) -> None:
    notebook = nbformat.read(REPO / "docs" / "notebook.ipynb", as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    shown = notebook.cells[1].outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in shown)
    printed = "".join(o.get("text", "") for o in notebook.cells[3].outputs)
    assert printed.startswith("Quest") and "head L1H2: recall" in printed
    assert (tmp_path / "sparsefinder-view.html").stat().st_size > 1_000_000  # plotly.js inline
