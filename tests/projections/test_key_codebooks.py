"""Key codebooks for routed k-means: fit, save/load, the bundled asset, sweep registration."""

from __future__ import annotations

import pytest
import torch
from entmax import entmax15

from sparsefinder.bundle import bundle
from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.evaluation.curves import CURVES
from sparsefinder.evaluation.sweep import sweep
from sparsefinder.methods.registry import METHODS
from sparsefinder.models.loading import DEFAULT_MODEL_ID
from sparsefinder.predictors.routed_kmeans import RoutedKMeans
from sparsefinder.projections.heads import HeadProjections
from sparsefinder.projections.key_codebooks import (
    CodebooksError,
    KeyCodebooks,
    bundled_codebooks,
    fit_codebooks,
)

LAYERS, HEADS, D = 2, 3, 8


def _records(n_texts: int = 4, n: int = 30, layers: int = LAYERS, heads: int = HEADS,
             d: int = D) -> list[AttentionRecord]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n_texts):
        graphs = []
        for _ in range(layers):
            q, k = torch.randn(heads, n, d, generator=gen), torch.randn(heads, n, d, generator=gen)
            probs = entmax15(q @ k.transpose(-1, -2) * d**-0.5, dim=-1)  # gold = its support
            gold = probs > 0
            graphs.append(LayerGraph(q, k, gold, probs[gold], d**-0.5))
        out.append(AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                                   special=[False] * n, causal=False, layers=graphs))
    return out


def test_fit_save_load_roundtrip(tmp_path):
    books = fit_codebooks(_records(), (4, 6), model_id="synthetic", alpha=1.5)
    assert sorted(books.centroids) == [4, 6]
    assert books.centroids[6].shape == (LAYERS, HEADS, 6, D)
    path = books.save(tmp_path / "books.pt")
    loaded = KeyCodebooks.load(path, expected_model_id="synthetic")
    assert torch.equal(loaded.centroids[4], books.centroids[4])
    assert loaded.metadata["n_texts"] == 4
    predictor = loaded.predictor(1, 6, budget=0.2)
    assert isinstance(predictor, RoutedKMeans) and predictor.budget == 0.2
    assert torch.equal(predictor.centroids_, books.centroids[6][1])


def test_load_errors_say_how_to_fix(tmp_path):
    books = fit_codebooks(_records(), (4,), model_id="synthetic", alpha=1.5)
    path = books.save(tmp_path / "books.pt")
    with pytest.raises(CodebooksError, match="fit-codebooks"):
        KeyCodebooks.load(path, expected_model_id="other/model")
    with pytest.raises(CodebooksError, match="fit-codebooks"):
        KeyCodebooks.load(tmp_path / "missing.pt")
    torch.save({"format": "something else"}, tmp_path / "bad.pt")
    with pytest.raises(CodebooksError, match="not a key codebooks file"):
        KeyCodebooks.load(tmp_path / "bad.pt")
    with pytest.raises(CodebooksError, match="B=5"):
        books.predictor(0, 5)


def test_bundled_codebooks_match_the_default_model():
    path = bundle().path("key codebooks")
    assert path.is_file(), "run `sparsefinder fit-codebooks --out assets/...`"
    books = bundled_codebooks()
    assert books.model_id == DEFAULT_MODEL_ID
    assert books.metadata["split"] == "train"
    for b, c in books.centroids.items():
        assert c.shape == (6, 12, b, 32) and torch.isfinite(c).all()


def test_registered_for_sweeps_and_sweepable():
    for name in ("kmeans-routed", "topp"):
        assert METHODS[name].inputs == "original" and name in CURVES
    assert CURVES["kmeans-routed-top"].method == "kmeans-routed"  # mode="top", the curve's name
    assert METHODS["topp"].oracle and not METHODS["kmeans-routed"].oracle
    # records shaped like the default model (6 layers × 12 heads, d = 32): bundled codebooks
    records = _records(n_texts=2, n=20, layers=6, heads=12, d=32)
    projections = HeadProjections(weight=torch.randn(6, 12, 4, 32), bias=torch.zeros(6, 12, 4),
                                  model_id=DEFAULT_MODEL_ID, alpha=1.5)
    df = sweep(records, projections, "kmeans-routed,topp")
    routed = df[df["method"] == "kmeans-routed"]
    assert len(routed) == len(CURVES["kmeans-routed"].specs)
    assert routed["recall"].between(0, 1).all() and routed["sparsity"].between(0, 1).all()
    topp = df[df["method"] == "topp"]
    # p = 1: the entmax support = gold, up to float rounding of borderline tiny probabilities
    assert topp["recall"].max() > 0.999
    # codebooks of another model are not used: the configurations are skipped with a reason
    other = HeadProjections(weight=torch.randn(6, 12, 4, 32), bias=torch.zeros(6, 12, 4),
                            model_id="other/model", alpha=1.5)
    with pytest.warns(UserWarning, match="fit-codebooks"), pytest.raises(ValueError):
        sweep(records, other, "kmeans-routed")
