"""The notebook's computations are the app's live path, checked against the masks themselves."""

from __future__ import annotations

import pytest

from sparsefinder.notebook import session

pytestmark = pytest.mark.slow


@pytest.mark.numerical
def test_notebook_view_recall_is_the_share_of_gold_edges_kept(prepared):
    view = session.compute(prepared, session.state_for("distance-floor:budget", 0.9, 2, 3))
    gold = prepared.record.layers[2].gold_of(3).double()
    pred = view.preds[2][3].double()
    expected = float((gold * pred).sum() / gold.sum())
    assert view.summary["head"].recall == pytest.approx(expected, abs=1e-6)
    assert view.state.layer == 2 and view.state.head == 3


def test_notebook_methods_of_the_bundled_model_include_the_learned_ones(prepared):
    methods = [m for _, m in session.method_choices(prepared)]
    assert methods[0] == "distance-floor:budget"
    assert {"distance", "kmeans", "fixed"} <= set(methods)


def test_notebook_model_without_a_bundle_offers_training_free_methods(tiny_model_dirs):
    loaded = session.open_model(str(tiny_model_dirs["bert"]))
    prepared = session.prepare_text(loaded, "a short text about cats and dogs")
    methods = {m for _, m in session.method_choices(prepared)}
    assert not methods & {"distance", "kmeans", "distance-floor:budget", "distance:budget"}
    assert {"fixed", "topk"} <= methods
    view = session.compute(prepared, session.state_for("topk", 0.9, 1, 0))
    figure = session.head_figure(prepared, view)
    assert "Gold L1H0" in figure.layout.annotations[0].text
    assert 0.0 <= view.summary["model"].recall <= 1.0


def test_notebook_grid_outlines_the_selected_head(prepared):
    view = session.compute(prepared, session.state_for("kmeans", 0.9, 4, 2))
    figure = session.grid_figure(prepared, view)
    outline = figure.layout.shapes[-1]  # x0 = head * step - 1.5, y0 = layer * step - 1.5
    assert outline.line.color == "crimson"
    assert outline.y0 + 1.5 == pytest.approx(2 * (outline.x0 + 1.5))
