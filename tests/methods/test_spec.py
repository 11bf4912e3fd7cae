"""sparsefinder.methods.spec: one registry of methods, PredictorSpec values, one prediction path."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.methods.registry import (
    INPUTS,
    METHODS,
    Method,
    Param,
    display_name,
    get_method,
    register_method,
)
from sparsefinder.methods.spec import PredictorSpec, RecordInputs, predict_record
from sparsefinder.predictors import Distance, GlobalTokens, TopK, Union, Window
from sparsefinder.projections.heads import HeadProjections

HEADS, D, R = 2, 6, 3


def _record(n: int = 7, layers: int = 2, causal: bool = False) -> AttentionRecord:
    gen = torch.Generator().manual_seed(n)
    graphs = []
    for _ in range(layers):
        q, k = torch.randn(HEADS, n, D, generator=gen), torch.randn(HEADS, n, D, generator=gen)
        gold = torch.rand(HEADS, n, n, generator=gen) < 0.3
        graphs.append(LayerGraph(q, k, gold, torch.ones(int(gold.sum())), D**-0.5))
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=causal, layers=graphs)


def _projections(layers: int = 2) -> HeadProjections:
    gen = torch.Generator().manual_seed(0)
    return HeadProjections(weight=torch.randn(layers, HEADS, R, D, generator=gen),
                           bias=torch.zeros(layers, HEADS, R), model_id="synthetic", alpha=1.5,
                           centroids={4: torch.randn(layers, HEADS, 4, R, generator=gen)})


def test_every_method_declares_what_it_reads_once():
    assert set(METHODS) >= {"distance", "quantization", "kmeans", "window", "topk",
                            "longformer", "bigbird", "reformer", "routing", "sparsebert",
                            "kmeans-routed"}
    # forms that were families of their own are parameters now (their old names are aliases)
    assert not {"sparsebert-dams", "sparsebert-damu", "distance-nodiag",
                "kmeans-routed-top", "block-learned", "block-keys", "fixed"} & set(METHODS)
    assert all(method.inputs in INPUTS for method in METHODS.values())
    assert METHODS["topk"].inputs == "original" and METHODS["topk"].oracle
    assert METHODS["window"].inputs == "shape" and not METHODS["window"].needs_projections
    assert METHODS["distance"].needs_projections and METHODS["kmeans"].needs_projections
    assert METHODS["sparsebert"].fit is not None
    with pytest.raises(ValueError, match="unknown method 'nope'.*distance"):
        get_method("nope")


def test_spec_is_a_hashable_value_and_validates_its_parameters():
    a = PredictorSpec.of("kmeans", {"top_k": 2, "n_clusters": 4}, window=3,
                         global_tokens=["last", "first"])
    b = PredictorSpec.of("kmeans", {"n_clusters": 4, "top_k": 2}, window=3,
                         global_tokens=("first", "last"))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a.params_json() == '{"n_clusters": 4, "top_k": 2}'
    assert a.label() == "kmeans n_clusters=4 top_k=2 ∪ window 3 ∪ global first+last"
    with pytest.raises(ValueError, match=r"missing \['threshold'\]"):
        PredictorSpec.of("distance", {})
    with pytest.raises(ValueError, match=r"unknown \['t'\]"):
        PredictorSpec.of("distance", {"threshold": 1.0, "t": 2})
    with pytest.raises(ValueError, match="window must be"):
        PredictorSpec.of("window", {"window": 0}, window=-1)
    with pytest.raises(ValueError, match="global_tokens"):
        PredictorSpec("window", (("window", 0),), 0, ("middle",))
    assert PredictorSpec.of("window", {"window": 0}).label() == "empty graph"


def test_an_optional_parameter_may_be_left_out_or_none():
    share = Param("share", float, None, low=0.0, high=1.0, low_open=True, optional=True)
    method = Method("opt", "Optional", (Param("t", float, 1.0), share), lambda p, c: None)
    method.check_params({"t": 1.0})
    method.check_params({"t": 1.0, "share": None})
    method.check_params({"t": 1.0, "share": 0.5})
    with pytest.raises(ValueError, match="share must be a number in"):
        method.check_params({"t": 1.0, "share": 0.0})
    with pytest.raises(ValueError, match=r"missing \['t'\]"):
        method.check_params({"share": 0.5})
    # a spec with the optional parameter None is the spec without it
    a = PredictorSpec.of("distance:budget", {"target_sparsity": 0.9, "floor": 5,
                                             "floor_share": None})
    b = PredictorSpec.of("distance:budget", {"target_sparsity": 0.9, "floor": 5})
    assert a == b and hash(a) == hash(b) and a.params == b.params
    assert "floor_share" not in a.label()


def test_build_unites_the_method_with_window_and_global_tokens():
    spec = PredictorSpec.of("distance", {"threshold": 0.5}, window=3, global_tokens=["first"])
    built = spec.build(None, 0)
    assert built == Union(Distance(0.5), Window(3), GlobalTokens(first=True, last=False))
    assert PredictorSpec.of("distance", {"threshold": 0.5}).build(None, 0) == Distance(0.5)
    assert PredictorSpec.of("window", {"window": 0}).build(None, 0) is None
    assert PredictorSpec.of("topk", {"k": 2}).build(None, 1) == TopK(2)


def test_learned_methods_without_projections_name_the_training_command():
    with pytest.raises(ValueError, match="sparsefinder train"):
        PredictorSpec.of("kmeans", {"n_clusters": 4, "top_k": 1}).build(None, 0)
    with pytest.raises(ValueError, match="sparsefinder train"):
        RecordInputs(_record()).projected(0)


def test_predict_record_gives_each_predictor_the_inputs_its_method_declares():
    record, projections = _record(), _projections()
    vectors = RecordInputs(record, projections)
    q, k = vectors.projected(1)
    assert q.shape == (HEADS, 7, R) and vectors.projected(1)[0] is q  # computed once
    assert vectors.get(1, "original")[0] is record.layers[1].queries
    spec = PredictorSpec.of("topk", {"k": 2})
    masks = predict_record(spec, spec.build_layers(projections, 2), vectors)
    layer = record.layers[0]
    assert torch.equal(masks[0], TopK(2).predict(layer.queries, layer.keys))  # original q/k
    spec = PredictorSpec.of("distance", {"threshold": 1.0})
    masks = predict_record(spec, spec.build_layers(projections, 2), vectors)
    assert torch.equal(masks[1], Distance(1.0).predict(*vectors.projected(1)))
    empty = PredictorSpec.of("window", {"window": 0})
    masks = predict_record(empty, empty.build_layers(projections, 2), vectors)
    assert all(m.dtype == torch.bool and not m.any() for m in masks)
    with pytest.raises(ValueError, match="predictors for 1 layers"):
        predict_record(spec, spec.build_layers(projections, 1), vectors)


def test_causal_records_get_causal_predictions():
    record = _record(causal=True)
    spec = PredictorSpec.of("window", {"window": 5})
    (first, _) = predict_record(spec, spec.build_layers(None, 2), RecordInputs(record))
    assert not first.triu(diagonal=1).any() and first.diagonal(dim1=-2, dim2=-1).all()


@pytest.mark.parametrize("shared", [False, True])
def test_predict_record_never_unpacks_the_gold_graphs(monkeypatch, shared):
    """A prediction needs the gold mask's shape, not its bits: unpacking every head's gold of
    every layer cost a long text's slider move ~0.3 s."""
    from sparsefinder.attention import packed_mask

    record = _record(causal=True)
    reads = []
    real = packed_mask.unpack_mask
    monkeypatch.setattr(packed_mask, "unpack_mask", lambda *a: reads.append(a) or real(*a))
    for spec in (PredictorSpec.of("window", {"window": 3}),
                 PredictorSpec.of("window", {"window": 0})):
        masks = predict_record(spec, spec.build_layers(None, 2), RecordInputs(record),
                               shared=shared)
        assert [m.shape for m in masks] == [(HEADS, 7, 7)] * 2
        assert all(m.dtype == torch.bool for m in masks)
    assert reads == []
    assert not masks[0].any()  # a window of 0 alone: the empty graph
    assert record.layers[0].gold.any()  # the gold itself still reads back (and is counted)
    assert len(reads) == 1


def test_projections_of_another_shape_are_refused_by_record_inputs():
    with pytest.raises(ValueError, match="expect"):
        RecordInputs(_record(layers=3), _projections(layers=2))


# ---------------------------------------------------------------- the registry, exactly

# name: (label, params, inputs, oracle, learned from graphs)
REGISTRY = {
    "distance": ("Distance (t)", ("threshold", "diag", "floor"), "projected", False, False),
    "quantization": ("Quantization (β)", ("bins",), "projected", False, False),
    "kmeans": ("k-means (B, k)", ("n_clusters", "top_k"), "projected", False, False),
    "window": ("Window (w)", ("window",), "shape", False, False),
    "longformer": ("Longformer", ("n_global",), "shape", False, False),
    "bigbird": ("BigBird", ("n_random",), "shape", False, False),
    "reformer": ("Reformer (LSH)", ("n_buckets",), "projected", False, False),
    "routing": ("Routing (k-means)", ("n_clusters",), "projected", False, False),
    "topk": ("Top-k by exact scores (reference)", ("k",), "original", True, False),
    "sparsebert": ("SparseBERT DAM (static)", ("target_sparsity", "kind"), "shape", False,
                   True),
    "kmeans-routed": ("Routed k-means (B, key budget or routes)",
                      ("n_clusters", "budget", "n_routes", "mode"), "original", False, False),
    "topp": ("Top-p of exact entmax (reference)", ("p",), "original", True, False),
    "quest": ("Quest pages (min/max key bounds)", ("page_size", "pages"), "original", False,
              False),
    "hashattention": ("HashAttention (learned bit codes)", ("max_distance",), "original", False,
                      True),
    "block": ("Block Sparsefinder (block, key blocks, single keys)",
              ("block", "n_blocks", "n_keys", "learned", "select"), "projected", False, False),
    "rowfrac": ("Nearest keys (row fraction)", ("fraction",), "projected", False, False),
}


@pytest.fixture
def registered():
    """The default registrations, run again: the check covers the registering function
    itself (mutation testing forks after import), not only what import left behind."""
    from sparsefinder import catalog

    saved = dict(METHODS)
    METHODS._methods.clear()
    catalog._register_builtin()
    try:
        yield METHODS
    finally:
        METHODS._methods.clear()
        METHODS._methods.update(saved)


def test_default_registry_exactly(registered):
    assert list(registered) == list(REGISTRY)
    for name, (label, params, inputs, oracle, learned) in REGISTRY.items():
        method = registered[name]
        assert (method.name, method.label, method.param_names, method.inputs, method.oracle,
                method.fit is not None) == (name, label, params, inputs, oracle, learned), name
    calibrated = {name: registered[name].calibration_names for name in REGISTRY
                  if registered[name].calibrations}
    assert calibrated == CALIBRATED


#: Families whose parameters a target can set (fitted on TRAIN graphs), and the old method
#: name of each calibrated form (kept as an alias).
CALIBRATED = {
    "distance": ("none", "equal", "budget", "recall"),
    "quantization": ("none", "budget"),
    "kmeans": ("none", "budget"),
    "window": ("none", "budget"),
    "kmeans-routed": ("none", "budget"),
    "rowfrac": ("none", "equal", "budget"),
}
OLD_NAMES = {
    "distance-calibrated": ("distance", "equal"),
    "distance-budget": ("distance", "budget"),
    "distance-calibrated-recall": ("distance", "recall"),
    "rowfrac-calibrated": ("rowfrac", "equal"),
    "rowfrac-budget": ("rowfrac", "budget"),
    "window-budget": ("window", "budget"),
    "quantization-budget": ("quantization", "budget"),
    "kmeans-budget": ("kmeans", "budget"),
    "kmeans-routed-budget": ("kmeans-routed", "budget"),
}


def test_old_names_are_aliases_with_a_deprecation_note(registered):
    from sparsefinder.methods.registry import resolve_method

    assert {old: new for old, new in registered.aliases().items()
            if old not in FORMS} == OLD_NAMES
    for old, (family, calibration) in OLD_NAMES.items():
        with pytest.warns(FutureWarning, match=f"'{family}:{calibration}'"):
            spec = PredictorSpec.of(old, {"target_recall" if calibration == "recall"
                                          else "target_sparsity": 0.9})
        assert (spec.method, spec.calibration, spec.method_id) == (
            family, calibration, f"{family}:{calibration}")
        assert resolve_method(f"{family}:{calibration}") == (family, calibration)
    new = PredictorSpec.of("distance", {"target_sparsity": 0.9}, calibration="budget")
    with pytest.warns(FutureWarning):
        assert PredictorSpec.of("distance-budget", {"target_sparsity": 0.9}) == new
    # a calibrated form's old name: the family's calibration with the form's parameters (the
    # floored distance of the time before: its curves, links and tables keep the name)
    with pytest.warns(FutureWarning, match="use 'distance'.*floor=12"):
        old = PredictorSpec.of("distance-floor:budget", {"target_sparsity": 0.9,
                                                         "floor_share": 1.0})
    assert old == PredictorSpec.of("distance:budget", {"target_sparsity": 0.9, "floor": 12,
                                                       "floor_share": 1.0})
    assert display_name("distance-floor:budget") == display_name(
        "distance:budget", {"floor": 12}) == ("Distance (t) ∪ nearest keys per row (floor m), "
                                              "per head, sparsity budget across heads")
    assert display_name("distance:budget", {"floor": 0}) == display_name("distance:budget")
    assert PredictorSpec.of("distance:budget", {"target_sparsity": 0.9}) == new


#: families of the time before that are a form (a parameter) of another now
FORMS = {
    "distance-nodiag": ("distance", {"diag": False}, {"threshold": 0.5}),
    "distance-floor": ("distance", {"floor": 12}, {"threshold": 0.5}),
    "sparsebert-dams": ("sparsebert", {"kind": "structured"}, {"target_sparsity": 0.9}),
    "sparsebert-damu": ("sparsebert", {"kind": "unstructured"}, {"target_sparsity": 0.9}),
    "kmeans-routed-top": ("kmeans-routed", {"mode": "top"}, {"n_clusters": 8, "n_routes": 2}),
    "block-learned": ("block", {"learned": True}, {"block": 32, "n_blocks": 2}),
    "block-keys": ("block", {"select": "keys"}, {"block": 32, "n_keys": 4, "sub_block": 8}),
    "fixed": ("window", {"window": 0}, {}),
}


def test_forms_that_were_families_are_parameters_with_their_old_names_aliased(registered):
    for old, (family, fixed, given) in FORMS.items():
        assert registered.aliases()[old] == (family, "none")
        with pytest.warns(FutureWarning, match=f"use '{family}'.*" + ", ".join(
                f"{k}={v!r}" for k, v in fixed.items())):
            spec = PredictorSpec.of(old, given)
        assert spec == PredictorSpec.of(family, {**given, **fixed})
    # a link or a CSV gives the form as text
    assert PredictorSpec.of("distance", {"threshold": 0.5, "diag": "false"}) == \
        PredictorSpec.of("distance", {"threshold": 0.5, "diag": False})
    with pytest.raises(ValueError, match="kind must be one of structured / unstructured"):
        PredictorSpec.of("sparsebert", {"target_sparsity": 0.5, "kind": "dense"})
    # a form reads, needs and fits what it declares, not what the plain family does
    learned = PredictorSpec.of("block", {"block": 32, "n_blocks": 2, "learned": "true"})
    plain = PredictorSpec.of("block", {"block": 32, "n_blocks": 2, "n_keys": 0})
    assert (learned.inputs, learned.needs, learned.needs_training) == (
        "original", ("block_projections",), True)
    assert (plain.inputs, plain.needs, plain.needs_training) == ("projected", ("projections",),
                                                                 False)
    with pytest.raises(ValueError, match=r"unknown \['n_keys'\]"):  # the learned form has none
        PredictorSpec.of("block", {"block": 32, "n_blocks": 2, "n_keys": 4, "learned": True})
    keys = PredictorSpec.of("block", {"block": 32, "n_keys": 4, "sub_block": 8,
                                      "select": "keys"})
    assert (keys.inputs, keys.needs, keys.needs_training) == ("original", (), False)
    with pytest.raises(ValueError, match=r"unknown \['n_blocks'\]"):  # keys: no key blocks
        PredictorSpec.of("block", {"block": 32, "n_blocks": 2, "n_keys": 4, "sub_block": 8,
                                   "select": "keys"})
    # the empty window (once ``fixed``) builds nothing: only the spec's window and globals
    assert PredictorSpec.of("window", {"window": 0}).build(None, 0) is None
    assert PredictorSpec.of("window", {"window": 0}, window=3).label() == "window 3"


def test_a_calibration_a_family_does_not_take_is_refused_by_name(registered):
    with pytest.raises(ValueError, match=r"'quest' takes calibration none, got 'budget'"):
        PredictorSpec.of("quest", {"target_sparsity": 0.9}, calibration="budget")
    with pytest.raises(ValueError, match="takes calibration none / budget, got 'recall'"):
        PredictorSpec.of("window:recall", {"target_recall": 0.9})
    with pytest.raises(ValueError, match=r"'distance:budget' takes parameters "
                                         r"\['target_sparsity', 'floor', 'floor_share'\]"):
        PredictorSpec.of("distance", {"threshold": 1.0}, calibration="budget")
    with pytest.raises(ValueError, match="already names calibration 'budget'"):
        PredictorSpec.of("distance-budget", {"target_sparsity": 0.9}, calibration="equal")


def test_default_builders_pass_every_parameter_and_seed_by_layer(registered):
    from sparsefinder.catalog import BASELINE_WINDOW
    from sparsefinder.predictors import (
        BigBird,
        Distance,
        Longformer,
        NoDiagonal,
        Quantization,
        Reformer,
        Routing,
        TopK,
        Window,
    )

    def build(method, params, layer=2):
        return PredictorSpec.of(method, params).build(_projections(3), layer)

    assert build("distance", {"threshold": "1.5"}) == Distance(1.5)
    assert build("quantization", {"bins": 3.0}) == Quantization(3)
    assert build("window", {"window": 5.0}) == Window(5)
    assert build("longformer", {"n_global": 4.0}) == Longformer(BASELINE_WINDOW, 4, seed=2)
    assert build("bigbird", {"n_random": 6.0}) == BigBird(BASELINE_WINDOW, 6, seed=2)
    assert build("reformer", {"n_buckets": 8.0}) == Reformer(8, seed=2)
    routing = build("routing", {"n_clusters": 4.0}, layer=1)
    assert isinstance(routing, Routing) and (routing.n_clusters, routing.seed) == (4, 1)
    assert build("topk", {"k": 2.0}) == TopK(2)
    nodiag = build("distance-nodiag", {"threshold": 0.5})
    assert isinstance(nodiag, NoDiagonal) and nodiag.predictor == Distance(0.5)
    assert build("fixed", {}) is None
    assert isinstance(build("distance", {"threshold": 1}).threshold, float)
    assert isinstance(build("quantization", {"bins": 3.0}).bins, int)


def test_kmeans_builder_reads_the_layer_centroids_and_top_k(registered):
    projections = _projections(3)
    km = PredictorSpec.of("kmeans", {"n_clusters": 4.0, "top_k": 2.0}).build(projections, 2)
    assert (km.n_clusters, km.top_k) == (4, 2) and isinstance(km.n_clusters, int)
    assert torch.equal(km.centroids_, projections.centroids[4][2])
    one = PredictorSpec.of("kmeans", {"n_clusters": 4, "top_k": 1}).build(projections, 0)
    assert one.top_k == 1 and torch.equal(one.centroids_, projections.centroids[4][0])
    with pytest.raises(ValueError, match=r"^k-means needs learned projections for this model; "
                                         r"train them with `sparsefinder train --model NAME "
                                         r"--out DIR` and pass the projections file$"):
        PredictorSpec.of("kmeans", {"n_clusters": 4, "top_k": 1}).build(None, 0)


def test_static_masks_are_fitted_per_layer_and_retargeted(registered):
    from sparsefinder.predictors import StaticMask

    train = [_record(n=9, layers=3, causal=True), _record(n=8, layers=3, causal=True)]
    spec = PredictorSpec.of("sparsebert-dams", {"target_sparsity": 0.8})
    assert spec.needs_training and not spec.needs_projections
    fitted = spec.fit(train)
    assert len(fitted) == 3 and all(isinstance(m, StaticMask) for m in fitted)
    assert all(m.kind == "structured" and m.causal_ is True for m in fitted)
    unstructured = PredictorSpec.of("sparsebert-damu", {"target_sparsity": 0.5}).fit(train)
    assert all(m.kind == "unstructured" for m in unstructured)
    built = spec.build_layers(None, 3, fitted)
    assert [m.target_sparsity for m in built] == [0.8, 0.8, 0.8]
    assert all(b is not f for b, f in zip(built, fitted, strict=True))
    assert [m.target_sparsity for m in fitted] == [0.5, 0.5, 0.5]  # the fitted ones untouched
    assert built[1].frequency_ is fitted[1].frequency_  # a shallow copy: shared tensors
    with pytest.raises(ValueError, match=r"^sparsebert \(structured\) masks are fitted on "
                                         r"training graphs; pass train_records=\.\.\.$"):
        spec.fit([])
    with pytest.raises(ValueError, match=r"^this method is learned from training graphs; "
                                         r"pass train_records=\.\.\.$"):
        spec.build(None, 0)
    with pytest.raises(ValueError, match="target"):
        PredictorSpec.of("sparsebert-dams", {"target_sparsity": 1.5}).build(None, 0, fitted)
    assert PredictorSpec.of("distance", {"threshold": 1}).fit(train) is None


def test_register_method_refuses_bad_names_and_inputs():
    build = lambda p, c: None  # noqa: E731
    with pytest.raises(ValueError, match=r"^inputs must be one of \('projected', 'original', "
                                         r"'shape'\), got 'pixels'$"):
        register_method(Method("x-test", "X", (), build, inputs="pixels"))
    for bad in ("", "a,b", "a+b"):
        with pytest.raises(ValueError, match=r"^method name must be non-empty without ',' or "
                                             r"'\+', got "):
            register_method(Method(bad, "X", (), build))
    with pytest.raises(ValueError, match=r"^method 'distance' is already registered; pass "
                                         r"replace=True$"):
        register_method(Method("distance", "X", (), build))
    assert "x-test" not in METHODS and METHODS["distance"].label == "Distance (t)"
    with pytest.raises(ValueError, match=r"^unknown method 'nope'; choose from: distance, "):
        get_method("nope")


def test_spec_values_labels_and_build_layers():
    spec = PredictorSpec.of("distance", {"threshold": 0.25}, window=3, global_tokens=["first"])
    assert spec.params_json() == '{"threshold": 0.25}'
    assert spec.label() == "distance threshold=0.25 ∪ window 3 ∪ global first"
    assert PredictorSpec.of("window", {"window": 0}).label() == "empty graph"
    assert PredictorSpec.of("window", {"window": 0}, window=1).label() == "window 1"
    layers = spec.build_layers(_projections(3), 3)
    assert len(layers) == 3
    assert PredictorSpec.of("window", {"window": 0}).build_layers(None, 2) == [None, None]
    with pytest.raises(ValueError, match=r"^window must be an integer >= 0, got -1$"):
        PredictorSpec("distance", (("threshold", 1.0),), -1)
    with pytest.raises(ValueError, match=r"^global_tokens must be among \('first', 'last'\), "
                                         r"got \['middle'\]$"):
        PredictorSpec("window", (("window", 0),), 0, ("middle",))
    with pytest.raises(ValueError, match=r"unknown \['bins'\]"):
        PredictorSpec.of("distance", {"threshold": 1, "bins": 2})


def test_spec_edges_single_training_record_and_messages():
    from sparsefinder.predictors import GlobalTokens

    one = PredictorSpec.of("sparsebert-damu", {"target_sparsity": 0.5}).fit([_record(n=6)])
    assert len(one) == 2  # one mask per layer, from a single training record
    spec = PredictorSpec.of("window", {"window": 0}, window=1, global_tokens=["last"])
    union = spec.build(None, 0)
    assert isinstance(union, Union) and Window(1) in union.predictors
    assert GlobalTokens(first=False, last=True) in union.predictors
    assert PredictorSpec.of("distance", {"threshold": 0.123456}).label() == (
        "distance threshold=0.1235")
    with pytest.raises(ValueError, match=r"^window must be an integer >= 0, got 2.5$"):
        PredictorSpec("window", (("window", 0),), 2.5)
    kmeans = PredictorSpec.of("kmeans", {"n_clusters": 4, "top_k": 1})
    assert len(kmeans.build_layers(_projections(2), 2)) == 2
    with pytest.raises(ValueError, match=r"^this method needs learned projections for this "
                                         r"model; train them with `sparsefinder train --model "
                                         r"NAME --out DIR` and pass the projections file$"):
        RecordInputs(_record()).get(0, "projected")


def test_predict_record_spends_per_row_budgets_inside_a_local_window():
    """Top-k on a local layer: the k keys are chosen inside the window, not cut from it."""
    g = torch.Generator().manual_seed(0)
    n, window = 30, 5
    q, k = torch.randn(2, n, 4, generator=g), torch.randn(2, n, 4, generator=g)
    gold = torch.eye(n, dtype=torch.bool).expand(2, n, n).clone()
    local = LayerGraph(q, k, gold, torch.ones(int(gold.sum())), 1.0, sliding_window=window)
    full = LayerGraph(q, k, gold, torch.ones(int(gold.sum())), 1.0)
    record = AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                             special=[False] * n, causal=True, layers=[full, local])
    spec = PredictorSpec.of("topk", {"k": 3})
    masks = predict_record(spec, spec.build_layers(None, 2), RecordInputs(record))
    rows = torch.arange(n) + 1
    assert torch.equal(masks[0].sum(-1)[0], rows.clamp(max=3))
    assert torch.equal(masks[1].sum(-1)[0], rows.clamp(max=3))  # 3 of the 5 window keys
    assert not (masks[1] & ~torch.ones(n, n, dtype=torch.bool).tril().triu(-window + 1)).any()


def test_bidirectional_local_layers_get_predictions_cut_to_their_window(
        sparse_modernbert_records):
    """ModernBERT's local layers (W = 5: keys |i - j| <= 4): every prediction is cut to the
    band on both sides; top-k spends its k keys inside it; global layers are not cut."""
    record = sparse_modernbert_records[1]
    n = record.n_tokens
    band = (torch.arange(n)[:, None] - torch.arange(n)[None]).abs() <= 4
    everything = PredictorSpec.of("window", {"window": 4 * n})
    masks = predict_record(everything, everything.build_layers(None, 4), RecordInputs(record))
    assert masks[0].all() and masks[3].all()
    for local in (1, 2):
        assert torch.equal(masks[local], band.expand_as(masks[local]))
    topk = PredictorSpec.of("topk", {"k": 3})
    masks = predict_record(topk, topk.build_layers(None, 4), RecordInputs(record))
    assert (masks[1].sum(-1) == 3).all() and not masks[1][:, ~band].any()
    assert (masks[0].sum(-1) == 3).all()



def _by_hand_allowed(n: int, m: int, causal: bool, window: int | None) -> torch.Tensor:
    """Allowed pairs written out: key j ≤ query i's position when causal (keys aligned to the
    end, as a decoder's cache), within the window (0 ≤ i−j < W causal, |i−j| < W not)."""
    i = torch.arange(n)[:, None] + (m - n)
    j = torch.arange(m)[None, :]
    allowed = torch.ones(n, m, dtype=torch.bool)
    if causal:
        allowed &= j <= i
    if window:
        allowed &= ((i - j) < window) & ((i - j) >= 0) if causal else (i - j).abs() < window
    return allowed


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize(("n", "m"), [(9, 9), (6, 11)])
def test_predict_layer_shares_one_cut_pattern_over_the_heads(causal, window, n, m):
    """``shared=True``: a shape-only predictor's mask is one (n, m) pattern, cut to the
    layer's allowed pairs and broadcast over the heads (stride 0), equal to the per-head path."""
    from sparsefinder.methods.spec import predict_layer

    gen = torch.Generator().manual_seed(n + m)
    q, k = torch.randn(3, n, D, generator=gen), torch.randn(3, m, D, generator=gen)
    predictor = Union(Window(5), GlobalTokens(first=True, last=False))
    shared = predict_layer(predictor, q, k, causal=causal, sliding_window=window, shared=True)
    alone = predict_layer(predictor, q, k, causal=causal, sliding_window=window)
    assert shared.shape == (3, n, m) and shared.dtype == torch.bool
    assert shared.stride(0) == 0
    assert torch.equal(shared, alone)
    assert not (shared & ~_by_hand_allowed(n, m, causal, window)).any()
    if window is None and not causal:  # nothing to cut: every pattern edge is there
        assert torch.equal(shared[0], Window(5).predict(q, k)[0] | GlobalTokens(
            first=True, last=False).predict(q, k)[0])


@pytest.mark.parametrize("causal", [False, True])
def test_predict_layer_cuts_a_local_layer_to_its_window_whatever_the_predictor(causal):
    """A sliding-window layer: a predictor that knows the window (top-k) spends its budget in
    it, one that does not (distance) is cut afterwards; neither keeps a key outside it, and
    a learned predictor is never shared (it reads q/k)."""
    from sparsefinder.methods.spec import predict_layer

    gen = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, 12, D, generator=gen), torch.randn(2, 12, D, generator=gen)
    allowed = _by_hand_allowed(12, 12, causal, 4)
    topk = predict_layer(TopK(3), q, k, causal=causal, sliding_window=4)
    assert not (topk & ~allowed).any()
    per_row = topk.sum(-1)
    assert bool((per_row == torch.clamp(allowed.sum(-1), max=3)).all())  # budget inside it
    far = predict_layer(Distance(1e9), q, k, causal=causal, sliding_window=4, shared=True)
    assert torch.equal(far, allowed.expand(2, -1, -1))  # every allowed pair, nothing more
    assert far.stride(0) != 0  # distance reads q/k: not a shared pattern
    plain = predict_layer(Distance(1e9), q, k, causal=causal)
    assert torch.equal(plain, _by_hand_allowed(12, 12, causal, None).expand(2, -1, -1))
