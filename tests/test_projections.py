"""Projections: Eq. 7 training on synthetic graphs, negative sampling, files and errors."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.graphs import AttentionRecord, LayerGraph
from sparsefinder.projections import (
    FORMAT_VERSION,
    HeadProjections,
    ProjectionsError,
    _layer_pairs,
    fit_centroids,
    sample_negatives,
    train_projections,
)

HEADS, D, LAYERS = 2, 8, 2


def _record(gen: torch.Generator, n: int = 24, causal: bool = False) -> AttentionRecord:
    """Tokens of 3 latent clusters: a query attends exactly to keys of its own cluster."""
    centers = torch.randn(HEADS, 3, D, generator=gen) * 3
    layers = []
    for _ in range(LAYERS):
        label = torch.randint(0, 3, (HEADS, n), generator=gen)
        pick = centers.gather(1, label[..., None].expand(-1, -1, D))
        q = pick + 0.3 * torch.randn(HEADS, n, D, generator=gen)
        k = pick + 0.3 * torch.randn(HEADS, n, D, generator=gen)
        gold = label[:, :, None] == label[:, None, :]
        if causal:
            gold &= torch.ones(n, n, dtype=torch.bool).tril()
        probs = gold.float() / gold.sum(-1, keepdim=True).clamp(min=1)
        layers.append(LayerGraph(q, k, gold, probs[gold], scaling=D**-0.5))
    return AttentionRecord(
        text="x", tokens=["t"] * n, offsets=[(0, 0)] * n, special=[False] * n,
        causal=causal, layers=layers,
    )


@pytest.fixture(scope="module")
def records() -> list[AttentionRecord]:
    gen = torch.Generator().manual_seed(1)
    return [_record(gen) for _ in range(6)]


def test_loss_decreases_from_random_init(records: list[AttentionRecord]) -> None:
    proj = train_projections(records, rank=2, batch_size=64, epochs=3, init="random")
    first, last = proj.metadata["loss_first"], proj.metadata["loss_last"]
    assert all(b < 0.5 * a for a, b in zip(first, last, strict=True)), (first, last)


def test_projection_separates_positives(records: list[AttentionRecord]) -> None:
    proj = train_projections(records, rank=2, batch_size=64)
    graph = records[0].layers[1]
    q, k = proj.project(1, graph.queries), proj.project(1, graph.keys)
    dist = torch.cdist(q, k)
    assert dist[graph.gold].mean() * 3 < dist[~graph.gold].mean()


def test_deterministic_under_seed(records: list[AttentionRecord]) -> None:
    a = train_projections(records, rank=2, batch_size=32, seed=3)
    b = train_projections(records, rank=2, batch_size=32, seed=3)
    c = train_projections(records, rank=2, batch_size=32, seed=4, init="random")
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    assert not torch.equal(a.weight, c.weight)


def test_project_shapes_and_record(records: list[AttentionRecord]) -> None:
    proj = train_projections(records, rank=3, batch_size=64)
    assert proj.weight.shape == (LAYERS, HEADS, 3, D) and proj.bias.shape == (LAYERS, HEADS, 3)
    pairs = proj.project_record(records[0])
    assert len(pairs) == LAYERS and pairs[0][0].shape == (HEADS, 24, 3)
    x = records[0].layers[0].queries
    expected = torch.einsum("hrd,hnd->hnr", proj.weight[0], x) + proj.bias[0][:, None]
    torch.testing.assert_close(proj.project(0, x), expected)
    with pytest.raises(ValueError, match="expected x of shape"):
        proj.project(0, x[..., :3])


def test_negatives_are_true_non_edges() -> None:
    gen = torch.Generator().manual_seed(0)
    gold = torch.rand(5, 40, generator=gen) < 0.7
    gold[:, 0] = False  # every row has a non-edge
    gold[4] = True
    gold[4, 17] = False  # a row with a single non-edge: exact fallback must find it
    allowed = torch.full((5,), 40)
    base = torch.arange(5) * 40
    cols = sample_negatives(gold.reshape(-1), base, allowed, 50, gen)
    assert cols.shape == (5, 50)
    assert not gold.gather(1, cols).any()
    assert (cols[4] == 17).all()
    assert len(set(cols[:4].reshape(-1).tolist())) > 10  # not stuck on one column
    easy = sample_negatives(torch.zeros(40, dtype=torch.bool), base[:1], allowed[:1], 3, gen)
    assert easy.shape == (1, 3)  # no edge at all: rejection never fails


def test_negatives_past_only_for_causal() -> None:
    gen = torch.Generator().manual_seed(2)
    rec = _record(gen, n=30, causal=True)
    pairs = _layer_pairs([rec], 0)
    negs = sample_negatives(pairs.gold_flat, pairs.gold_base, pairs.n_allowed, 4, gen)
    n = 30
    query = (pairs.q_row % n)[:, None]
    head = pairs.head[:, None].expand_as(negs)
    assert (negs <= query).all(), "a negative lies in the future"
    assert not rec.layers[0].gold[head, query.expand_as(negs), negs].any()
    # rows whose every past key is an edge (e.g. query 0) have no negative: skipped
    assert (pairs.n_allowed > rec.layers[0].gold.sum(-1)[pairs.head, pairs.q_row % n]).all()


def test_save_load_round_trip(tmp_path, records: list[AttentionRecord]) -> None:
    proj = train_projections(records, rank=2, batch_size=64, model_id="tiny/model", alpha=1.5)
    fit_centroids(proj, records, clusters=(2, 3), n_init=1)
    path = proj.save(tmp_path / "sub" / "projections.pt")
    loaded = HeadProjections.load(path, expected_model_id="tiny/model")
    assert torch.equal(loaded.weight, proj.weight) and torch.equal(loaded.bias, proj.bias)
    assert loaded.model_id == "tiny/model" and loaded.alpha == 1.5 and loaded.rank == 2
    assert sorted(loaded.centroids) == [2, 3]
    assert loaded.centroids[3].shape == (LAYERS, HEADS, 3, 2)
    assert loaded.metadata["loss_last"] == proj.metadata["loss_last"]
    assert loaded.format_version == FORMAT_VERSION
    km = loaded.kmeans(1, 3, top_k=2)
    assert km.predict(*loaded.project_record(records[0])[1]).shape == (HEADS, 24, 24)
    with pytest.raises(ProjectionsError, match="no k-means centroids for B=5"):
        loaded.kmeans(0, 5)


def test_wrong_model_id(tmp_path, records: list[AttentionRecord]) -> None:
    path = train_projections(records, rank=2, model_id="model-a").save(tmp_path / "p.pt")
    with pytest.raises(ProjectionsError) as info:
        HeadProjections.load(path, expected_model_id="model-b")
    message = str(info.value)
    assert "trained for model model-a" in message and "loaded model is model-b" in message
    assert "sparsefinder train --model model-b" in message


def test_default_alias_accepts_the_bundled_file() -> None:
    from sparsefinder.models import DEFAULT_MODEL_ID
    from sparsefinder.resources import BUNDLED_PROJECTIONS

    projections = HeadProjections.load(BUNDLED_PROJECTIONS, expected_model_id="default")
    assert projections.model_id == DEFAULT_MODEL_ID
    with pytest.raises(ProjectionsError, match="loaded model is other"):
        HeadProjections.load(BUNDLED_PROJECTIONS, expected_model_id="other")


def test_heads_without_non_edges_are_named_as_dense(records: list[AttentionRecord]) -> None:
    dense = [
        AttentionRecord(text=r.text, tokens=r.tokens, offsets=r.offsets, special=r.special,
                        causal=r.causal, layers=[
                            LayerGraph(g.queries, g.keys, torch.ones_like(g.gold),
                                       torch.ones(g.gold.numel()), g.scaling)
                            for g in r.layers])
        for r in records
    ]
    with pytest.raises(ValueError, match=r"heads \[0, 1\] attend to every key.*no non-edge"):
        train_projections(dense, rank=2)
    empty = [
        AttentionRecord(text=r.text, tokens=r.tokens, offsets=r.offsets, special=r.special,
                        causal=r.causal, layers=[
                            LayerGraph(g.queries, g.keys, torch.zeros_like(g.gold),
                                       torch.ones(0), g.scaling)
                            for g in r.layers])
        for r in records
    ]
    with pytest.raises(ValueError, match="no gold edge at all"):
        train_projections(empty, rank=2)


def test_corrupt_and_foreign_files(tmp_path, records: list[AttentionRecord]) -> None:
    good = train_projections(records, rank=2, model_id="m").save(tmp_path / "good.pt")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:200])
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file at all")
    for bad in (truncated, garbage):
        with pytest.raises(ProjectionsError, match=f"{bad.name}.*sparsefinder train"):
            HeadProjections.load(bad)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weight": torch.zeros(1)}, foreign)
    with pytest.raises(ProjectionsError, match="not a Sparsefinder projections file"):
        HeadProjections.load(foreign)
    future = tmp_path / "future.pt"
    payload = HeadProjections.load(good).to_payload()
    torch.save({**payload, "format_version": 99}, future)
    with pytest.raises(ProjectionsError, match="format version 99"):
        HeadProjections.load(future)
    with pytest.raises(FileNotFoundError, match="sparsefinder train"):
        HeadProjections.load(tmp_path / "missing.pt")


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"rank": 0}, "rank"), ({"rank": 99}, "rank"), ({"margin": 0}, "margin"),
        ({"lr": -1.0}, "lr"), ({"lr": float("nan")}, "lr"), ({"epochs": 0}, "epochs"),
        ({"batch_size": 0}, "batch_size"), ({"negatives_per_positive": 0}, "negatives"),
        ({"seed": -1}, "seed"), ({"init": "pca"}, "init"), ({"rank": 2.5}, "rank"),
    ],
)
def test_bad_hyperparameters(records: list[AttentionRecord], kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        train_projections(records, **kwargs)


def test_no_records() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        train_projections([])


def test_manual_gradient_matches_autograd() -> None:
    from sparsefinder.projections import _LayerPairs, _step

    gen = torch.Generator().manual_seed(0)
    heads, tokens, d, r, size, num = 3, 50, 8, 4, 16, 2
    q_table, k_table = torch.randn(heads * tokens, d, generator=gen), torch.randn(
        heads * tokens, d, generator=gen
    )
    pairs = _LayerPairs(q_table, k_table, *([None] * 8))
    q_rows, k_rows = (torch.randint(0, heads * tokens, (heads, size), generator=gen)
                      for _ in range(2))
    n_rows = torch.randint(0, heads * tokens, (heads, size, num), generator=gen)
    w0 = torch.randn(heads, r, d, generator=gen) * 0.5

    class NoStep:
        def step(self) -> None:
            pass

    weight = w0.clone()
    loss = _step(pairs, q_rows, k_rows, n_rows, weight, NoStep(), 1.0)
    reference = w0.clone().requires_grad_()
    q = q_table[q_rows]
    pos = (torch.einsum("hrd,hbd->hbr", reference, q - k_table[k_rows]) ** 2).sum(-1)
    neg = (torch.einsum("hrd,hbkd->hbkr", reference, q[:, :, None] - k_table[n_rows]) ** 2)
    hinge = torch.relu(1.0 + pos[..., None] - neg.sum(-1)).mean((1, 2))
    hinge.sum().backward()
    torch.testing.assert_close(weight.grad, reference.grad)
    torch.testing.assert_close(loss, hinge.mean().detach())


def test_corrupt_message_has_no_torch_internals_and_size_is_checked_first(
    tmp_path, records: list[AttentionRecord]
) -> None:
    good = train_projections(records, rank=2, model_id="m").save(tmp_path / "good.pt")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:200])
    with pytest.raises(ProjectionsError) as info:
        HeadProjections.load(truncated)
    message = str(info.value)
    assert message.startswith("truncated.pt is corrupt or truncated")
    assert str(tmp_path) not in message and "PytorchStreamReader" not in message
    size = good.stat().st_size
    assert HeadProjections.load(good, max_bytes=size).rank == 2
    with pytest.raises(ProjectionsError, match="good.pt is too large for a projections file"):
        HeadProjections.load(good, max_bytes=size - 1)
