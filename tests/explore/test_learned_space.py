"""The learned-space view-model: its plane is exact for r = 2 (PCA, a contraction, above), and
its decisions reproduce the real predictors' masks row by row, for every method it draws."""

from __future__ import annotations

import itertools

import pytest
import torch
from tolerances import bound, tol_for

from sparsefinder.bundle import bundle
from sparsefinder.calibration.table import CalibrationTable
from sparsefinder.explore import learned_space as ls
from sparsefinder.explore import live
from sparsefinder.explore import prepared as prep
from sparsefinder.methods.spec import PredictorSpec
from sparsefinder.projections.heads import HeadProjections

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

CELLS = [(0, 0), (2, 5), (5, 11)]  # (layer, head): first, middle, last


@pytest.fixture(scope="module")
def bundled(record):
    """The app's setting: the bundled projections (r = 4, centroids) and the calibration
    table with its own projections (augmented r = 8), on the test text."""
    table_path = bundle().path("calibration")
    table = CalibrationTable.load(table_path)
    return prep.prepare(record, HeadProjections.load(bundle().best("centroids")),
                        calibration=table, calibration_projections=table.own_projections(
                            table_path))


@pytest.fixture(scope="module")
def flat(record):
    """Random projections to r = 2 with B = 3 centroids: the plane is the space itself."""
    gen = torch.Generator().manual_seed(1)
    layers, heads, d = record.num_layers, record.num_heads, record.layers[0].queries.shape[2]
    weight = torch.randn(layers, heads, 2, d, generator=gen) / d**0.5
    projections = HeadProjections(weight=weight, bias=torch.zeros(layers, heads, 2),
                                  model_id="default", alpha=1.5,
                                  centroids={3: torch.randn(layers, heads, 3, 2, generator=gen)})
    return prep.prepare(record, projections)


def _rows(prepared, spec):
    """(space, the predictor's own mask row) of every query of the CELLS heads."""
    masks = live.predict(prepared, spec)
    for layer, head in CELLS:
        for query in range(prepared.n_tokens):
            yield ls.head_space(prepared, spec, layer, head, query), masks[layer][head, query]


def test_the_plane_of_a_2d_space_is_the_space_itself():
    keys = torch.randn(10, 2, generator=torch.Generator().manual_seed(0))
    plane = ls.fit_plane(keys)
    assert plane.exact and plane.explained == 1.0
    assert torch.equal(plane.apply(keys), keys.double())


def test_the_plane_of_a_larger_space_is_the_keys_pca_and_never_lengthens_a_distance():
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(200, 4, generator=gen) * torch.tensor([5.0, 3.0, 0.5, 0.2])
    plane = ls.fit_plane(keys)
    assert not plane.exact
    assert torch.allclose(plane.axes @ plane.axes.T, torch.eye(2, dtype=torch.float64))
    variance = (keys.double() - keys.double().mean(0)).square().sum(0)
    assert plane.explained == pytest.approx(float(variance[:2].sum() / variance.sum()), abs=0.01)
    points = torch.randn(30, 4, generator=gen) * 3
    flat_d = (plane.apply(points)[:, None] - plane.apply(points)[None]).norm(dim=-1)
    assert (flat_d <= (points[:, None] - points[None]).double().norm(dim=-1) + 1e-9).all()
    assert torch.equal(ls.fit_plane(keys).axes, plane.axes)  # fixed: no sign flips


def test_on_an_r2_space_the_map_and_its_distances_are_exact(flat):
    spec = PredictorSpec.of("distance", {"threshold": 1.0})
    space = ls.head_space(flat, spec, 1, 4, 6)
    assert space.plane.exact and space.plane.explained == 1.0
    assert torch.equal(space.keys_2d, space.keys.double())
    assert torch.equal(space.queries_2d, space.queries.double())
    on_plane = (space.keys_2d - space.queries_2d[6]).norm(dim=1)
    # distances of r-dimensional float32 vectors: r + 3 roundings at their magnitude
    torch.testing.assert_close(on_plane.float(), space.distances,
                               **tol_for(space.distances, terms=space.keys.shape[-1] + 3))


@pytest.mark.parametrize("quantile", [0.05, 0.2, 0.5])
def test_distance_keeps_a_key_iff_its_distance_is_within_t(bundled, quantile):
    t = float(torch.quantile(prep.distance_sample(
        [bundled.vectors.projected(layer) for layer in range(bundled.num_layers)]), quantile))
    spec = PredictorSpec.of("distance", {"threshold": t})
    for space, mask in _rows(bundled, spec):
        d = space.decision
        assert d.kind == ls.THRESHOLD and d.threshold == t
        assert torch.equal(d.keep, mask)
        assert torch.equal(space.distances <= t, d.keep)
        assert not d.keep[space.order].int().diff().gt(0).any()  # kept: a prefix of the sort


@pytest.mark.parametrize("method", ["distance:budget", "rowfrac:budget"])
def test_calibrated_thresholds_reproduce_their_predictor(bundled, method):
    spec = PredictorSpec.of(method, {"target_sparsity": 0.9})
    kept_some = False
    for space, mask in _rows(bundled, spec):
        d = space.decision
        assert d.kind == ls.THRESHOLD
        assert space.keys.shape[1] == 11  # the table's own (augmented) space, not the app's
        assert torch.equal(d.keep, mask)
        if d.keep.any():
            kept_some = True
            assert torch.equal(space.distances <= d.threshold, d.keep)
    assert kept_some


@pytest.mark.parametrize("bins", [2, 4, 7])
def test_quantization_bins_and_bands_reproduce_the_mask(bundled, bins):
    spec = PredictorSpec.of("quantization", {"bins": bins})
    for space, mask in _rows(bundled, spec):
        d = space.decision
        assert d.kind == ls.QUANTIZATION
        same = d.key_bins == d.query_bins
        assert torch.equal(d.keep, mask)
        assert torch.equal(same.any(1), d.keep)
        low, high = d.bands[:, 0], d.bands[:, 1]
        inside = (space.keys.double() >= low) & (space.keys.double() <= high)
        assert torch.equal(inside, same)  # the shaded interval is exactly the query's bin


@pytest.mark.parametrize(("clusters", "top_k"), list(itertools.product([2, 4, 8], [1, 2])))
def test_kmeans_clusters_reproduce_the_mask(bundled, clusters, top_k):
    spec = PredictorSpec.of("kmeans", {"n_clusters": clusters, "top_k": top_k})
    for space, mask in _rows(bundled, spec):
        d = space.decision
        assert d.kind == ls.KMEANS and d.centroids.shape == (clusters, 4)
        assert torch.equal(d.keep, mask)
        assert torch.equal(torch.isin(d.key_clusters, d.query_clusters).any(1), d.keep)


def test_the_kmeans_region_of_an_exact_plane_holds_exactly_the_kept_keys(flat):
    spec = PredictorSpec.of("kmeans", {"n_clusters": 3, "top_k": 1})
    space = ls.head_space(flat, spec, 3, 2, 5)
    region = [bool(ls.kmeans_region(space, k[:1], k[1:])[0, 0]) for k in space.keys]
    assert region == space.decision.keep.tolist()
    assert 0 < sum(region) < len(region)
    assert ls.kmeans_region(ls.head_space(flat, PredictorSpec.of("distance", {"threshold": 1.0}),
                                          3, 2, 5), space.keys[0, :1], space.keys[0, 1:]) is None


@pytest.mark.parametrize("method", ["distance", "quantization", "kmeans", "distance:budget",
                                    "quest", "window"])
def test_the_full_prediction_is_the_apps(bundled, method):
    """Window and global tokens included: the row the Explorer's diff shows."""
    state, _ = live.clamp(live.ViewState(method=method, window=3), bundled)
    spec = live.spec_for(state, bundled)
    masks = live.predict(bundled, spec)
    for layer, head in CELLS:
        for query in (0, 4, bundled.n_tokens - 1):
            space = ls.head_space(bundled, spec, layer, head, query)
            assert torch.equal(space.predicted, masks[layer][head, query])
            assert not (space.by_pattern & space.decision.keep).any()
            assert space.missed_mass == pytest.approx(
                float(space.probs[space.gold & ~space.predicted].sum()))
            # a row of float32 probabilities summed: ≤ 2n roundings of values ≤ 1
            assert space.gold_mass == pytest.approx(1.0, abs=bound(1.0, terms=2 * bundled.n_tokens))
            if space.reach() is not None:
                assert space.kept_within(space.reach()) >= int(space.gold.sum())
            assert len(ls.reasons(space)) == bundled.n_tokens
    if method in ("quest", "window"):
        assert space.decision.kind == ls.OUTSIDE


def test_reasons_name_the_margin_and_the_shared_bucket(bundled):
    t = 1.0
    space = ls.head_space(bundled, PredictorSpec.of("distance", {"threshold": t}), 2, 5, 4)
    why = ls.reasons(space)
    for j in range(len(why)):
        gap = float(space.distances[j]) - t
        assert why[j] == f"d − t = {gap:+.3g}" + (" (within t)" if gap <= 0 else " (beyond t)")
    space = ls.head_space(bundled, PredictorSpec.of("kmeans", {"n_clusters": 4, "top_k": 1}),
                          2, 5, 4)
    chosen = f"c{int(space.decision.query_clusters[0])}"
    for j, text in enumerate(ls.reasons(space)):
        assert text.startswith("shares cluster " + chosen) == bool(space.decision.keep[j])


def test_bad_selection_and_missing_projections_are_clear_errors(bundled, record):
    spec = PredictorSpec.of("distance", {"threshold": 1.0})
    with pytest.raises(ValueError, match="query must be in"):
        ls.head_space(bundled, spec, 0, 0, bundled.n_tokens)
    with pytest.raises(ValueError, match="needs projections"):
        ls.head_space(prep.prepare(record), spec, 0, 0, 0)
