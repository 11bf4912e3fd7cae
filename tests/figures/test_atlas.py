"""Atlas figures: the right cells, order, points and bars."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "analysis"))
from synthetic_heads import KINDS, synthetic_record  # noqa: E402

from sparsefinder.analysis.atlas import compute_atlas  # noqa: E402
from sparsefinder.figures import atlas as figures  # noqa: E402


@pytest.fixture(scope="module")
def atlas():
    records = [synthetic_record(n, layers=2, seed=s) for s, n in enumerate((12, 16, 20, 24))]
    return compute_atlas(lambda: records)


def test_grid_has_a_cell_per_head_and_fades_filtered_ones(atlas):
    keep = (atlas.heads["type"] == "sink").to_numpy()
    fig = figures.grid_figure(atlas, "diagonal", "mass on the token itself", (1, 2), keep)
    cells = fig.data[0]
    assert len(cells.x) == 2 * len(KINDS)
    assert list(np.asarray(cells.marker.opacity)).count(1.0) == keep.sum()
    assert (fig.data[1].x[0], fig.data[1].y[0]) == (2, 1)
    assert "pred" not in fig.data[0].marker.colorbar.title.text  # the label in words
    assert fig.data[0].marker.colorbar.title.text == "mass on the token itself"


def test_symbol_key_names_every_symbol_on_the_grid(atlas):
    key = figures.symbol_key()
    fig = figures.grid_figure(atlas, "diagonal", "mass on the token itself", (0, 0))
    for symbol in set(fig.data[0].text):
        assert f"**{symbol}** " in key
    assert "**S** first-token/sink" in key and "**←** previous token" in key


def test_similarity_is_drawn_in_cluster_order(atlas):
    fig = figures.similarity_figure(atlas)
    names = figures.head_names(atlas)
    assert list(fig.data[0].x) == [names[i] for i in atlas.order]
    assert np.asarray(fig.data[0].z).shape == (len(names), len(names))


def test_map_has_one_trace_per_type_and_the_selection(atlas):
    fig = figures.map_figure(atlas, (0, 0))
    assert {trace.name for trace in fig.data[:-1]} == set(KINDS)
    assert sum(len(trace.x) for trace in fig.data[:-1]) == len(atlas.heads)
    # only the selected head carries a label (labels on every point pile up)
    assert all(trace.mode == "markers" for trace in fig.data[:-1])
    assert list(fig.data[-1].text) == ["L0H0"]


def test_distributions_show_the_heads_histograms(atlas):
    fig = figures.distributions_figure(atlas, 0, KINDS.index("mixed"))
    assert sum(fig.data[0].y) == atlas.meta["n_texts"]
    assert sum(fig.data[1].y) == atlas.meta["n_rows"]
    assert list(fig.data[1].y).index(max(fig.data[1].y)) == 2  # two keys per row
