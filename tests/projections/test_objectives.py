"""Projection objectives of issue 10: training-free low-rank (augmented) and logistic; files."""

from __future__ import annotations

import io

import pytest
import torch
from cluster_records import cluster_record
from tolerances import bound, tol_for

from sparsefinder.bundle import bundle
from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.projections.bilinear import refine_lowrank
from sparsefinder.projections.centroids import fit_centroids
from sparsefinder.projections.heads import HeadProjections, ProjectionsError
from sparsefinder.projections.hinge import train_projections
from sparsefinder.projections.logistic import logistic_step, train_logistic
from sparsefinder.projections.lowrank import (
    approximate_scores,
    fit_lowrank,
    fit_row_threshold,
    low_rank_factors,
)
from sparsefinder.projections.pairs import _layer_pairs
from sparsefinder.training import EarlyStop

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

HEADS, D, LAYERS, TRUE_RANK = 2, 8, 2, 3


def _record(gen: torch.Generator, n: int, causal: bool = False) -> AttentionRecord:
    """Scores ``qᵀk`` of rank 3 (queries live in a 3-d subspace); the gold graph keeps the
    pairs above a row threshold that is linear in the query, ``τ(q) = 0.5·q₀ + 1``."""
    basis = torch.linalg.qr(torch.randn(D, D, generator=torch.Generator().manual_seed(9)))[0]
    layers = []
    for _ in range(LAYERS):
        q = torch.randn(HEADS, n, TRUE_RANK, generator=gen) @ basis[:TRUE_RANK]
        k = torch.randn(HEADS, n, D, generator=gen)
        scores = q @ k.transpose(-1, -2)
        tau = 0.5 * q[..., :1] @ basis[:1, :1].T + 1.0  # depends on the query only
        gold = scores > tau
        if causal:
            gold &= torch.ones(n, n, dtype=torch.bool).tril()
        layers.append(LayerGraph(q, k, gold, torch.ones(int(gold.sum())), D**-0.5))
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=causal, layers=layers)


@pytest.fixture(scope="module")
def records() -> list[AttentionRecord]:
    gen = torch.Generator().manual_seed(0)
    return [_record(gen, n) for n in (20, 31, 26, 40)]


# ---------------------------------------------------------------- low rank


def test_low_rank_factors_are_exact_at_the_true_rank(records) -> None:
    graph = records[0].layers[0]
    q, k = graph.queries.double(), graph.keys.double()
    cq = q.transpose(1, 2) @ q / q.shape[1]
    ck = k.transpose(1, 2) @ k / k.shape[1]
    a, b, kept = low_rank_factors(cq, ck, TRUE_RANK)
    approx = (q @ a.transpose(1, 2)) @ (k @ b.transpose(1, 2)).transpose(1, 2)
    # the records hold the rank-3 q and k rounded to float32 (relative u each), which is all
    # that leaves the true rank; the float64 maths adds far less
    scale = float((q.abs() @ k.abs().transpose(1, 2)).max())
    torch.testing.assert_close(approx, q @ k.transpose(1, 2), rtol=0,
                               atol=bound(scale, terms=2 * D))
    assert torch.allclose(kept, torch.ones(HEADS, dtype=kept.dtype))
    a1, b1, kept1 = low_rank_factors(cq, ck, 1)
    assert (kept1 < 1).all()
    err1 = ((q @ a1.transpose(1, 2)) @ (k @ b1.transpose(1, 2)).transpose(1, 2)
            - q @ k.transpose(1, 2)).square().mean()
    assert err1 > 1e-3


def test_augmentation_turns_distance_into_the_approximate_score(records) -> None:
    proj = fit_lowrank(records, rank=TRUE_RANK, row_threshold=False, model_id="synthetic")
    assert proj.kind == "augmented" and proj.dim == TRUE_RANK + 2
    assert proj.objective == "lowrank"
    graph = records[1].layers[1]
    scores = approximate_scores(proj, 1, graph.queries, graph.keys)
    # exact at the true rank; float32 on both sides: the projections (d products, rounded
    # factors) and their products (rank + 2), at the magnitude of Σ|q_i||k_i|
    q, k = graph.queries, graph.keys
    scale = float((q.abs() @ k.abs().transpose(1, 2)).max())
    torch.testing.assert_close(scores, (q @ k.transpose(1, 2)).double(), rtol=0,
                               atol=bound(scale, terms=2 * (D + TRUE_RANK + 2)))
    # |q~ - k~|^2 = Rq^2 + Rk^2 - 2 q^.k^, so a distance threshold is a score threshold
    qt, kt = proj.project_queries(1, graph.queries), proj.project_keys(1, graph.keys)
    q_hat = qt[..., :TRUE_RANK]
    radius = proj.query_radius[1][:, None].expand_as(qt[..., 0])
    # |[z, √(R² − |z|²), 0]| = R up to the rounding of r + 2 squares, a difference and roots
    torch.testing.assert_close(qt.norm(dim=-1), radius, **tol_for(radius, terms=TRUE_RANK + 6))
    assert (qt[..., -1] == 0).all() and (kt[..., -2] == 0).all()
    assert (q_hat.norm(dim=-1) <= proj.query_radius[1][:, None]).all()


def test_row_threshold_recovers_the_gold_rule(records) -> None:
    """With the row threshold q^.k^ ≈ s − τ(q): one threshold per head reproduces the gold graph."""
    coef = fit_row_threshold(records, 0)
    assert coef.shape == (HEADS, D + 1)
    with_tau = fit_lowrank(records, rank=TRUE_RANK)
    without = fit_lowrank(records, rank=TRUE_RANK, row_threshold=False)
    assert with_tau.rank == TRUE_RANK + 1
    agree_with, agree_without = [], []
    for record in records:
        graph = record.layers[0]
        for proj, out in ((with_tau, agree_with), (without, agree_without)):
            s = approximate_scores(proj, 0, graph.queries, graph.keys)
            # best single threshold per head, as a calibrated predictor would pick it
            levels = torch.linspace(0, 1, 101, dtype=s.dtype)
            best = max(float(((s > t) == graph.gold).double().mean())
                       for t in torch.quantile(s.flatten(), levels))
            out.append(best)
    assert min(agree_with) > 0.97
    assert sum(agree_with) > sum(agree_without)


def test_lowrank_file_round_trip_and_no_centroids(tmp_path, records) -> None:
    proj = fit_lowrank(records, rank=2, model_id="synthetic")
    with pytest.raises(ValueError, match="separate them"):
        fit_centroids(proj, records, clusters=(2, 3), n_init=1)
    with pytest.raises(ProjectionsError, match="use shared projections"):
        proj.kmeans(0, 2)
    path = proj.save(tmp_path / "p.pt")
    payload = torch.load(path, weights_only=True)
    assert payload["format_version"] == 2 and payload["kind"] == "augmented"
    assert payload["metadata"]["objective"] == "lowrank"
    loaded = HeadProjections.load(path, expected_model_id="synthetic")
    graph = records[0].layers[1]
    for side in ("query", "key"):
        x = graph.queries if side == "query" else graph.keys
        assert torch.equal(loaded.project(1, x, side=side), proj.project(1, x, side=side))
    with pytest.raises(ValueError, match="side='query' or side='key'"):
        loaded.project(1, graph.queries)
    q, k = loaded.project_record(records[0])[1]
    assert q.shape == (HEADS, 20, loaded.dim) and k.shape == (HEADS, 20, loaded.dim)
    payload["format_version"] = 3
    torch.save(payload, tmp_path / "future.pt")
    with pytest.raises(ProjectionsError, match="format version 3"):
        HeadProjections.load(tmp_path / "future.pt")


def test_bundled_file_still_loads_as_shared_paper_projections() -> None:
    proj = HeadProjections.load(bundle().path("projections.pt"))
    assert proj.kind == "shared" and proj.objective == "paper" and proj.dim == proj.rank
    x = torch.randn(proj.num_heads, 5, proj.head_dim)
    assert torch.equal(proj.project(0, x), proj.project_keys(0, x))
    assert torch.equal(proj.to_payload()["weight"], proj.weight)
    assert proj.to_payload()["format_version"] == 1 and "kind" not in proj.to_payload()


def test_augmented_validation() -> None:
    w = torch.zeros(1, 2, 3, 4)
    b = torch.zeros(1, 2, 3)
    with pytest.raises(ValueError, match="kind must be one of"):
        HeadProjections(weight=w, bias=b, model_id="m", alpha=1.5, kind="other")
    with pytest.raises(ValueError, match="key_weight of shape"):
        HeadProjections(weight=w, bias=b, model_id="m", alpha=1.5, kind="augmented")
    with pytest.raises(ValueError, match="only exist for kind='augmented'"):
        HeadProjections(weight=w, bias=b, model_id="m", alpha=1.5, key_weight=w)
    with pytest.raises(ValueError, match="rank must be an integer"):
        fit_lowrank([], rank=0)
    with pytest.raises(ValueError, match="radius_slack"):
        fit_lowrank([], rank=2, radius_slack=0.5)


# ---------------------------------------------------------------- logistic


def test_logistic_gradient_matches_autograd(records) -> None:
    pairs = _layer_pairs(records, 0)
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(HEADS, 2, D, generator=gen) * 0.3
    bias = torch.tensor([0.5, 1.5])
    ids = torch.randint(0, pairs.head.numel(), (HEADS, 16), generator=gen)
    q_rows, k_rows = pairs.q_row[ids], pairs.k_row[ids]
    n_rows = torch.randint(0, pairs.k_table.shape[0], (HEADS, 16, 2), generator=gen)

    class Keep(torch.optim.Optimizer):  # records the gradients instead of stepping
        def __init__(self, params):
            super().__init__(params, {})

        def step(self, closure=None):
            return None

    w1, b1 = weight.clone(), bias.clone()
    loss = logistic_step(pairs, q_rows, k_rows, n_rows, w1, b1, Keep([w1, b1]))
    w2, b2 = weight.clone().requires_grad_(), bias.clone().requires_grad_()
    q = pairs.q_table[q_rows]
    dp = q - pairs.k_table[k_rows]
    dn = q[:, :, None] - pairs.k_table[n_rows]
    zp = b2[:, None] - torch.einsum("hrd,hbd->hbr", w2, dp).square().sum(-1)
    zn = b2[:, None, None] - torch.einsum("hrd,hbnd->hbnr", w2, dn).square().sum(-1)
    ref = -(torch.nn.functional.logsigmoid(zp).mean(-1)
            + torch.nn.functional.logsigmoid(-zn).flatten(1).mean(-1))
    ref.sum().backward()
    # B·(1 + num) terms, each through W·Δ (d products, r squares): a loss term is at most
    # |z| + log 2, a weight-gradient term 2·|WΔ|·|Δ|, a bias-gradient term 1
    deltas = torch.cat([dp[:, :, None], dn], dim=2).detach()
    projected = float((weight.abs()[:, None, None] @ deltas.abs()[..., None]).max())
    terms = D + 2 + deltas.shape[1] * deltas.shape[2] + 2
    z = float(bias.abs().max()) + 2 * projected**2
    torch.testing.assert_close(loss, ref.mean().detach(), rtol=0,
                               atol=bound(z + 1, terms=terms))
    torch.testing.assert_close(w1.grad, w2.grad, rtol=0,
                               atol=bound(2 * projected * float(deltas.abs().max()), terms=terms))
    torch.testing.assert_close(b1.grad, b2.grad, rtol=0, atol=bound(1.0, terms=terms))


def _cluster_record(gen: torch.Generator, n: int = 24) -> AttentionRecord:
    return cluster_record(gen, n)


def test_logistic_training_learns_a_per_head_threshold() -> None:
    gen = torch.Generator().manual_seed(1)
    clusters = [_cluster_record(gen) for _ in range(6)]
    proj = train_logistic(clusters, rank=2, batch_size=64, epochs=8, lr=0.05, model_id="s")
    meta = proj.metadata
    assert meta["objective"] == "logistic" and proj.kind == "shared"
    assert all(b < a for a, b in zip(meta["loss_first"], meta["loss_last"], strict=True))
    biases = torch.tensor(meta["logistic_bias"])
    assert biases.shape == (LAYERS, HEADS) and (biases > 0).all()
    # the learned bias is the decision rule: d² < b_h separates edges from non-edges
    for record in clusters[:2]:
        graph = record.layers[1]
        d2 = torch.cdist(proj.project(1, graph.queries), proj.project(1, graph.keys)).square()
        pred = d2 < biases[1][:, None, None]
        tpr = (pred & graph.gold).sum() / graph.gold.sum()
        tnr = (~pred & ~graph.gold).sum() / (~graph.gold).sum()
        assert tpr > 0.9 and tnr > 0.9, (tpr, tnr)
    again = train_logistic(clusters, rank=2, batch_size=64, epochs=8, lr=0.05, model_id="s")
    assert torch.equal(again.weight, proj.weight)


# ---------------------------------------------------------------- low rank, refined


def test_refine_lowrank_trains_the_bilinear_logit(records) -> None:
    from sparsefinder.projections.bilinear import refine_lowrank

    start = fit_lowrank(records, rank=1, model_id="synthetic")  # under capacity: room to learn
    refined = refine_lowrank(start, records, lr=0.02, epochs=6, batch_size=64)
    meta = refined.metadata
    assert refined.kind == "augmented" and refined.objective == "lowrank-logistic"
    assert meta["rank"] == 1 and len(meta["logistic_bias"]) == LAYERS
    assert all(b < a for a, b in zip(meta["loss_first"], meta["loss_last"], strict=True))
    assert not torch.equal(refined.weight, start.weight)
    assert torch.equal(start.weight, fit_lowrank(records, rank=1).weight)  # input untouched
    for record in records:  # radii recomputed: train tokens stay inside them
        for layer, (q, k) in enumerate(refined.project_record(record)):
            # |[z, √(R² − |z|²), 0]| = R up to the rounding of r + 2 squares and roots
            for x, radius in ((q, refined.query_radius), (k, refined.key_radius)):
                expected = radius[layer][:, None].expand_as(x[..., 0])
                torch.testing.assert_close(x.norm(dim=-1), expected,
                                           **tol_for(expected, terms=meta["rank"] + 6))
    again = refine_lowrank(start, records, lr=0.02, epochs=6, batch_size=64)
    assert torch.equal(again.key_weight, refined.key_weight)
    with pytest.raises(ValueError, match="augmented projections"):
        refine_lowrank(HeadProjections.load(bundle().path("projections.pt")), records)


# ---------------------------------------------------------------- the registry


def test_fit_projections_runs_the_named_objective_with_its_options(records) -> None:
    from sparsefinder.projections.bilinear import refine_lowrank
    from sparsefinder.projections.hinge import train_projections
    from sparsefinder.projections.objectives import OBJECTIVES, fit_projections

    assert list(OBJECTIVES) == ["paper", "logistic", "lowrank", "lowrank-logistic",
                               "lowrank-mass", "lowrank-pairwise", "lowrank-listwise"]
    # One set of options for all (what `sparsefinder train` passes); each takes its own.
    options = {"rank": 2, "lr": None, "margin": 2.0, "epochs": 2, "batch_size": 64,
               "negatives_per_positive": 1, "seed": 1, "init": "random", "model_id": "m",
               "alpha": 1.5}
    expected = {
        "paper": train_projections(records, rank=2, margin=2.0, epochs=2, batch_size=64,
                                   seed=1, init="random", model_id="m"),
        "logistic": train_logistic(records, rank=2, epochs=2, batch_size=64, seed=1,
                                   model_id="m"),
        "lowrank": fit_lowrank(records, rank=2, model_id="m"),
        "lowrank-logistic": refine_lowrank(fit_lowrank(records, rank=2, model_id="m"),
                                           records, lr=3e-3, epochs=2, batch_size=64, seed=1),
    }
    for name, want in expected.items():
        got = fit_projections(records, name, **options)
        assert got.objective == name and got.metadata == want.metadata, name
        assert torch.equal(got.weight, want.weight) and torch.equal(got.bias, want.bias), name
    assert fit_projections(records, "lowrank-logistic", **options).metadata["lr"] == 3e-3
    assert fit_projections(records, "logistic", rank=2, lr=0.05).metadata["lr"] == 0.05
    assert "margin" in OBJECTIVES["paper"].hyperparameters
    assert "epochs" in OBJECTIVES["lowrank-logistic"].hyperparameters  # the refinement's
    assert "epochs" not in OBJECTIVES["lowrank"].hyperparameters
    with pytest.raises(ValueError, match="unknown objective 'hinge'; choose one of paper"):
        fit_projections(records, "hinge")
    with pytest.raises(TypeError, match=r"unknown hyperparameters \['epoch'\]"):
        fit_projections(records, "paper", epoch=3)


# ---------------------------------------------------------------- on the one training loop


@pytest.fixture(scope="module")
def clustered() -> list[AttentionRecord]:
    gen = torch.Generator().manual_seed(1)
    return [cluster_record(gen, 24) for _ in range(6)]


def _roundtrip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_hinge_stops_early_on_held_out_records(clustered) -> None:
    rule = EarlyStop(held_out=0.34, min_delta=1e9)  # every 3rd record held out; stops at 2
    proj = train_projections(clustered, rank=2, batch_size=32, epochs=10, early_stop=rule)
    meta = proj.metadata
    assert meta["epochs_run"] == [2, 2] and len(meta["held_out_loss"][0]) == 2
    # Layer 0 restored to epoch 1 = training on the other records for one epoch (the
    # held-out pairs have their own generator: the training draws are unchanged; layer 1
    # differs, its draws follow layer 0's second epoch on the one generator).
    fit, _ = rule.split(clustered)
    one = train_projections(fit, rank=2, batch_size=32, epochs=1)
    assert torch.equal(proj.weight[0], one.weight[0])
    assert "epochs_run" not in one.metadata and proj.metadata["n_records"] == len(clustered)


@pytest.mark.parametrize("fit", ["paper", "logistic", "lowrank-logistic"])
def test_resumed_objectives_write_the_same_projections(clustered, fit) -> None:
    def run(**loop):
        if fit == "paper":
            return train_projections(clustered, rank=2, batch_size=32, epochs=3, **loop)
        if fit == "logistic":
            return train_logistic(clustered, rank=2, batch_size=32, epochs=3, **loop)
        return refine_lowrank(start, clustered, batch_size=32, epochs=3, lr=0.02, **loop)

    start = fit_lowrank(clustered, rank=2) if fit == "lowrank-logistic" else None
    states: list[dict] = []
    full = run(checkpoint=states.append)
    assert len(states) == LAYERS * 3
    for done in (2, 3, 5):  # epochs done: mid layer 0, end of layer 0, mid layer 1
        later: list[dict] = []
        again = run(resume=_roundtrip(states[done - 1]), checkpoint=later.append)
        assert len(later) == LAYERS * 3 - done  # only the epochs left are trained
        for name in ("weight", "bias", "key_weight", "key_bias", "query_radius"):
            if getattr(full, name, None) is not None:
                assert torch.equal(getattr(again, name), getattr(full, name)), name
        assert again.metadata == full.metadata


def test_resumed_hash_codes_are_the_same() -> None:
    from sparsefinder.projections.hash_fit import fit_hash_codes

    gen = torch.Generator().manual_seed(2)
    records = [cluster_record(gen, 24) for _ in range(3)]
    states: list[dict] = []
    full = fit_hash_codes(records, bits=4, steps=5, seed=1, checkpoint=states.append)
    assert [s["layer"] for s in states] == [0, 1]
    again = fit_hash_codes(records, bits=4, steps=5, seed=1, resume=_roundtrip(states[0]))
    for (wq, wk), (wq_full, wk_full) in zip(again, full, strict=True):
        assert torch.equal(wq, wq_full) and torch.equal(wk, wk_full)
