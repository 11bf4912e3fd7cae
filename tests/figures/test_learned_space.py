"""Figures of the learned-space view, on hand-made rows: what each decision draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sparsefinder.explore import learned_space as ls
from sparsefinder.explore.tables import diff_codes
from sparsefinder.figures import learned_space as figs
from sparsefinder.predictors import KMeans, Quantization

N = 12


def _space(r: int, decision_for) -> ls.HeadSpace:
    gen = torch.Generator().manual_seed(r)
    q, k = torch.randn(N, r, generator=gen), torch.randn(N, r, generator=gen)
    query = 3
    distances = (k - q[query]).norm(dim=1)
    decision = decision_for(q, k, distances, query)
    gold = torch.zeros(N, dtype=torch.bool)
    gold[[0, 3, 5, 8]] = True
    probs = torch.zeros(N)
    probs[gold] = torch.tensor([0.4, 0.3, 0.2, 0.1])
    predicted = decision.keep.clone()
    predicted[2] = True  # one key kept by the window
    return ls.HeadSpace(0, 1, query, q, k, ls.fit_plane(k), distances, gold, probs, predicted,
                        decision, torch.ones(N, dtype=torch.bool))


def _threshold(q, k, distances, query, t=1.2):
    return ls.Decision(ls.THRESHOLD, distances <= t, "kept iff d ≤ t", threshold=t)


def _kmeans(q, k, distances, query):
    centroids = torch.randn(3, k.shape[1], generator=torch.Generator().manual_seed(7))
    ids = KMeans.from_centroids(centroids[None], 1).assign(torch.cat([q, k])[None])[0]
    keep = torch.isin(ids[N:], ids[query]).any(1)
    return ls.Decision(ls.KMEANS, keep, "", centroids=centroids, query_clusters=ids[query],
                       key_clusters=ids[N:])


def _bins(q, k, distances, query):
    quant = Quantization(3)
    qb, kb = quant.assign(q[None])[0, query], quant.assign(k[None])[0]
    same = kb == qb
    low = torch.where(same, k.double(), torch.inf).min(0).values
    high = torch.where(same, k.double(), -torch.inf).max(0).values
    return ls.Decision(ls.QUANTIZATION, same.any(1), "", query_bins=qb, key_bins=kb,
                       bands=torch.stack([low, high], 1))


def _keys(figure) -> list[int]:
    return sorted(c[1] for t in figure.data if t.customdata is not None
                  for c in t.customdata if c[0] == "k" and t.type != "bar")


def test_key_codes_are_the_explorers_diff_codes():
    space = _space(4, _threshold)
    expected = diff_codes(space.predicted[None], space.gold[None])[0]
    assert np.array_equal(figs.key_codes(space), expected)


@pytest.mark.parametrize("r", [2, 4])
def test_threshold_draws_a_circle_exact_only_in_2d_and_a_line_on_the_row(r):
    space = _space(r, _threshold)
    labels = [f"{i} · t{i}" for i in range(N)]
    figure = figs.space_figure(space, labels)
    assert _keys(figure) == list(range(N))  # every key once, clickable
    (circle,) = [s for s in figure.layout.shapes if s.type == "circle"]
    assert circle.x1 - circle.x0 == pytest.approx(2 * 1.2)
    assert circle.line.dash == ("solid" if r == 2 else "dash")
    symbols = {c[1]: symbol for t in figure.data if t.name.startswith(("FP", "TP", "other"))
               for c, symbol in zip(t.customdata, t.marker.symbol, strict=True)}
    assert {key for key, s in symbols.items() if s == "diamond"} == {2}  # window-only key
    row = figs.row_figure(space, labels)
    assert _keys(row) == list(range(N))
    (line,) = [s for s in row.layout.shapes if s.y0 == 1.2]
    assert line.y1 == 1.2
    bars = [t for t in row.data if t.type == "bar"]
    assert sum(len(t.y) for t in bars) == 4  # the gold keys' probabilities
    order = space.order.tolist()
    fn = [t for t in row.data if t.name.startswith("FN") and t.type != "bar"]
    assert fn
    for trace in fn:  # a key sits at its rank, at its exact distance
        for x, y, (_, key) in zip(trace.x, trace.y, trace.customdata, strict=True):
            assert x == order.index(key)
            assert y == pytest.approx(float(space.distances[key]))


def test_kmeans_draws_centroids_and_on_an_exact_plane_its_region():
    labels = [str(i) for i in range(N)]
    exact = figs.space_figure(_space(2, _kmeans), labels)
    assert any(t.name == "the query's clusters" for t in exact.data)
    assert [t.type for t in exact.data].count("heatmap") == 1
    projected = figs.space_figure(_space(4, _kmeans), labels)
    assert [t.type for t in projected.data].count("heatmap") == 0


def test_quantization_bands_one_strip_per_dimension():
    space = _space(4, _bins)
    labels = [str(i) for i in range(N)]
    figure = figs.bands_figure(space, labels)
    assert list(figure.layout.yaxis.tickvals) == [0, 1, 2, 3]
    assert len(figure.layout.shapes) == 4
    for shape, (low, high) in zip(figure.layout.shapes, space.decision.bands.tolist(),
                                  strict=True):
        assert (shape.x0, shape.x1) == (low, high)
    assert len(figs.space_figure(_space(2, _bins), labels).layout.shapes) == 2
    with pytest.raises(ValueError, match="quantization"):
        figs.bands_figure(_space(4, _threshold), labels)


@pytest.mark.parametrize("r", [3, 11])
def test_around_the_query_the_circle_is_the_decision(r):
    """Each key sits at its exact distance (less ρ0) from the query: inside the solid circle
    exactly the keys with d ≤ t, whatever the plane keeps of the space."""
    space = _space(r, lambda q, k, d, query: _threshold(q, k, d, query,
                                                        t=float(d.median())))
    fig = figs.query_figure(space, [f"w{i}" for i in range(N)])
    ring = next(t for t in fig.data if t.mode == "lines" and t.name.startswith("t ="))
    radius = float(np.hypot(ring.x[0], ring.y[0]))
    inside = {}
    for trace in fig.data:
        if trace.mode != "markers" or trace.customdata is None:
            continue
        for (side, j), x, y in zip(trace.customdata, trace.x, trace.y, strict=True):
            if side == "k":
                inside[j] = float(np.hypot(x, y)) <= radius + 1e-9
    assert sorted(inside) == list(range(N))
    expected = (space.distances <= space.decision.threshold).tolist()
    assert [inside[j] for j in range(N)] == expected
    assert any(expected) and not all(expected)  # the test row has keys on both sides


def test_around_the_query_a_floor_beyond_t_gets_its_own_circle():
    def floor(q, k, distances, query):
        keep = distances <= 1.2
        keep[distances.argsort()[:6]] = True  # six nearest kept whatever t
        return ls.Decision(ls.THRESHOLD, keep, "", threshold=float(distances.min()))

    space = _space(4, floor)
    fig = figs.query_figure(space, [f"w{i}" for i in range(N)])
    names = [t.name for t in fig.data if t.mode == "lines"]
    assert len(names) == 2 and "floor" in names[1]
