"""Projections: Eq. 7 training on synthetic graphs, negative sampling, files and errors."""

from __future__ import annotations

import pytest
import torch
from cluster_records import cluster_record
from tolerances import ADAM_STEP, bound, matmul_bound, tol_for, training_tol

from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.projections.centroids import fit_centroids
from sparsefinder.projections.heads import FORMAT_VERSION, HeadProjections, ProjectionsError
from sparsefinder.projections.hinge import train_projections
from sparsefinder.projections.pairs import _layer_pairs, sample_negatives

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

HEADS, D, LAYERS = 2, 8, 2


def _hinge_tols(w: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                n: torch.Tensor) -> tuple[float, float]:
    """(gradient, loss) tolerances of the hinge of Eq. 7 between two evaluations: each of its
    B·num terms is a product through W·Δ (d terms); a gradient term is at most
    ``2·|WΔ|·|Δ|`` for the positive and the negative each, a loss term ``1 + 2·r·|WΔ|²``."""
    deltas = torch.cat([(q - k)[:, :, None], q[:, :, None] - n], dim=2)  # (h, B, 1 + num, d)
    projected = float((w.abs()[:, None, None] @ deltas.abs()[..., None]).max())  # |W||Δ|
    terms = w.shape[-1] + deltas.shape[1] * (deltas.shape[2] - 1) + 2
    grad = bound(4 * projected * float(deltas.abs().max()), terms=terms, dtype=w.dtype)
    loss = bound(1 + 2 * w.shape[1] * projected**2, terms=terms + w.shape[1], dtype=w.dtype)
    return grad, loss


def _centring_tol(weight: torch.Tensor, bias: torch.Tensor, tokens: torch.Tensor) -> float:
    """How far from 0 a mean of projected tokens may land when the bias is minus that mean,
    computed elsewhere: two evaluations of N projections (d products and a bias) averaged."""
    scale = float((weight.abs() @ tokens.abs().transpose(-1, -2)).max() + bias.abs().max())
    return bound(scale, terms=2 * (weight.shape[-1] + tokens.shape[1] + 1))


def _record(gen: torch.Generator, n: int = 24, causal: bool = False) -> AttentionRecord:
    return cluster_record(gen, n, causal, uniform_probs=True)


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
    torch.testing.assert_close(proj.project(0, x), expected, rtol=0,  # d products and a bias
                               atol=matmul_bound(x, proj.weight[0].transpose(-1, -2))
                               + tol_for(proj.bias, terms=2)["atol"])
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
    from sparsefinder.bundle import bundle
    from sparsefinder.models.loading import DEFAULT_MODEL_ID

    projections = HeadProjections.load(bundle().path("projections.pt"), expected_model_id="default")
    assert projections.model_id == DEFAULT_MODEL_ID
    with pytest.raises(ProjectionsError, match="loaded model is other"):
        HeadProjections.load(bundle().path("projections.pt"), expected_model_id="other")


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
    from sparsefinder.projections.hinge import _step
    from sparsefinder.projections.pairs import _LayerPairs

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
    grad_err, loss_err = _hinge_tols(reference.detach(), q, k_table[k_rows], k_table[n_rows])
    torch.testing.assert_close(weight.grad, reference.grad, rtol=0, atol=grad_err)
    torch.testing.assert_close(loss, hinge.mean().detach(), rtol=0, atol=loss_err)


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


# ---------------------------------------------------------------- exact values and boundaries


def _fixed_record(golds: list[torch.Tensor], causal: bool, d: int = D) -> AttentionRecord:
    """A record whose gold graphs are given (heads, n, n); vectors are random but fixed."""
    gen = torch.Generator().manual_seed(5)
    heads, n = golds[0].shape[:2]
    layers = [LayerGraph(torch.randn(heads, n, d, generator=gen),
                         torch.randn(heads, n, d, generator=gen), g,
                         torch.ones(int(g.sum())), d**-0.5) for g in golds]
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=causal, layers=layers)


def test_causal_negatives_include_the_diagonal_and_never_the_future() -> None:
    """Gold: key 0 only. Query i's non-edges are keys 1..i — its own position included."""
    n = 6
    gold = torch.zeros(HEADS, n, n, dtype=torch.bool)
    gold[..., 0] = True
    pairs = _layer_pairs([_fixed_record([gold], causal=True)], 0)
    query = pairs.q_row % n
    # Query 0 sees key 0 only, an edge: no negative, so its positive is dropped.
    assert sorted(query.tolist()) == sorted(list(range(1, n)) * HEADS)
    assert torch.equal(pairs.n_allowed, query + 1)
    negs = sample_negatives(pairs.gold_flat, pairs.gold_base, pairs.n_allowed, 300,
                            torch.Generator().manual_seed(0))
    assert (negs >= 1).all() and (negs <= query[:, None]).all()
    assert (negs[query == 1] == 1).all()  # the diagonal is query 1's only non-edge
    for i in range(2, n):  # uniform over 1..i: every key, the diagonal too, is drawn
        assert set(negs[query == i].reshape(-1).tolist()) == set(range(1, i + 1))
    full = _layer_pairs([_fixed_record([gold], causal=False)], 0)
    assert (full.n_allowed == n).all() and full.head.numel() == HEADS * n
    assert pairs.gold_edges.tolist() == [n] * HEADS


def test_causal_gold_edges_count_only_the_past() -> None:
    gold = torch.ones(HEADS, 4, 4, dtype=torch.bool)
    gold[:, :, 1] = False  # key 1 is a non-edge for queries 1..3
    causal = _layer_pairs([_fixed_record([gold], causal=True)], 0)
    assert causal.gold_edges.tolist() == [10 - 3] * HEADS  # 10 past pairs, 3 of them key 1
    assert sorted((causal.q_row % 4).unique().tolist()) == [1, 2, 3]
    plain = _layer_pairs([_fixed_record([gold], causal=False)], 0)
    assert plain.gold_edges.tolist() == [12] * HEADS


def test_layer_pairs_index_every_text_of_the_layer(records: list[AttentionRecord]) -> None:
    pairs = _layer_pairs(records[:2], 1)
    n = 24
    for p in (0, 7, int(pairs.head.numel()) - 1):
        h, qr, kr = int(pairs.head[p]), int(pairs.q_row[p]), int(pairs.k_row[p])
        text, i = divmod(qr - h * 2 * n, n)
        j = kr - h * 2 * n - text * n
        graph = records[text].layers[1]
        assert torch.equal(pairs.q_table[qr], graph.queries[h, i])
        assert torch.equal(pairs.k_table[kr], graph.keys[h, j])
        assert bool(graph.gold[h, i, j])
        assert int(pairs.k_base[p]) == h * 2 * n + text * n
        row = pairs.gold_flat[int(pairs.gold_base[p]): int(pairs.gold_base[p]) + n]
        assert torch.equal(row, graph.gold[h, i])


def test_training_metadata_and_defaults(records: list[AttentionRecord]) -> None:
    proj = train_projections(records[:2])
    meta = proj.metadata
    assert {k: meta[k] for k in ("rank", "margin", "lr", "epochs", "batch_size",
                                 "negatives_per_positive", "seed", "init", "n_records")} == {
        "rank": 4, "margin": 1.0, "lr": 0.01, "epochs": 1, "batch_size": 1024,
        "negatives_per_positive": 1, "seed": 0, "init": "discriminative", "n_records": 2}
    assert set(meta) == {"rank", "margin", "lr", "epochs", "batch_size",
                         "negatives_per_positive", "seed", "init", "n_records",
                         "positives_per_layer", "loss_first", "loss_last", "objective"}
    assert proj.model_id == "" and proj.alpha == 1.5 and proj.rank == 4
    assert meta["positives_per_layer"] == [int(_layer_pairs(records[:2], layer).head.numel())
                                          for layer in range(LAYERS)]
    assert len(meta["loss_first"]) == len(meta["loss_last"]) == LAYERS
    # Projected tokens are centred: the bias cancels the mean projected q/k of the layer.
    for layer in range(LAYERS):
        tokens = torch.cat([r.layers[layer].queries for r in records[:2]]
                           + [r.layers[layer].keys for r in records[:2]], dim=1)
        centred = proj.project(layer, tokens).mean(1)
        assert centred.abs().max() <= _centring_tol(proj.weight[layer], proj.bias[layer], tokens)


def test_one_step_per_batch_and_loss_windows(records: list[AttentionRecord]) -> None:
    """batch_size = all positives: one step an epoch; the loss windows are then exact."""
    pairs = _layer_pairs(records, 0)
    biggest = int(torch.bincount(pairs.head).max())
    one = train_projections(records, rank=2, batch_size=biggest, epochs=3, init="random")
    two = train_projections(records, rank=2, batch_size=biggest - 1, epochs=3, init="random")
    # 3 losses (one per epoch) → first/last windows of one step each; they differ.
    assert one.metadata["loss_first"][0] != one.metadata["loss_last"][0]
    assert one.metadata["loss_first"] != two.metadata["loss_first"]


def test_progress_bars_count_layers_and_fits(records: list[AttentionRecord], capsys,
                                            monkeypatch) -> None:
    import tqdm

    # No tqdm monitor thread: a thread holding tqdm's lock would deadlock a later fork
    # (mutation testing forks one process per mutant after running this test).
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)
    proj = train_projections(records[:2], rank=2, epochs=2, progress=True)
    err = capsys.readouterr().err
    assert "projections" in err and "4/4" in err and "layer·epoch" in err
    fit_centroids(proj, records[:2], clusters=(2, 3), n_init=1, progress=True)
    err = capsys.readouterr().err
    assert "k-means" in err and "4/4" in err and "fit" in err
    train_projections(records[:2], rank=2)
    fit_centroids(proj, records[:2], clusters=(2,), n_init=1)
    assert capsys.readouterr().err == ""


def test_fit_centroids_metadata_and_errors(records: list[AttentionRecord]) -> None:
    proj = train_projections(records[:2], rank=2)
    fit_centroids(proj, records[:2], clusters=(3, 2), n_init=2, max_points=50, seed=4)
    assert sorted(proj.centroids) == [2, 3] and proj.centroids[2].shape == (LAYERS, HEADS, 2, 2)
    assert {k: proj.metadata[k] for k in ("kmeans_max_points", "kmeans_n_init", "kmeans_seed",
                                          "clusters")} == {
        "kmeans_max_points": 50, "kmeans_n_init": 2, "kmeans_seed": 4, "clusters": [2, 3]}
    again = train_projections(records[:2], rank=2)
    fit_centroids(again, records[:2], clusters=(3, 2), n_init=2, max_points=50, seed=4)
    assert torch.equal(again.centroids[3], proj.centroids[3])  # seeded
    fit_centroids(again, records[:2], clusters=(1,), n_init=1)
    assert again.centroids[1].shape == (LAYERS, HEADS, 1, 2)
    with pytest.raises(ValueError, match=r"^fit_centroids needs at least one record$"):
        fit_centroids(proj, [], clusters=(2,))
    for bad in ((), (0,), (0, 2)):
        with pytest.raises(ValueError, match=r"^clusters must be integers >= 1, got "):
            fit_centroids(proj, records[:2], clusters=bad)


def test_training_errors_name_the_problem(records: list[AttentionRecord]) -> None:
    with pytest.raises(ValueError, match=r"^train_projections needs at least one record "
                                         r"\(a text's gold graphs\)$"):
        train_projections([])
    bare = AttentionRecord(text="x", tokens=[], offsets=[], special=[], causal=False, layers=[])
    with pytest.raises(ValueError, match=r"^a record has no layers; extract it with "
                                         r"graphs.extract\(\)$"):
        train_projections([records[0], bare])
    one_layer = AttentionRecord(text="x", tokens=records[0].tokens, offsets=records[0].offsets,
                                special=records[0].special, causal=False,
                                layers=records[0].layers[:1])
    with pytest.raises(ValueError, match=r"^records come from differently shaped models: "
                                         r"\[\(1, 2, 8\), \(2, 2, 8\)\]$"):
        train_projections([records[0], one_layer])
    assert train_projections(records[:1], rank=D, batch_size=256).rank == D  # rank = d is fine
    with pytest.raises(ValueError, match=rf"^rank must be <= the head dimension {D}, got 9$"):
        train_projections(records[:1], rank=D + 1)
    for kwargs, message in (
        ({"rank": 0}, "rank must be an integer >= 1, got 0"),
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),
        ({"batch_size": True}, "batch_size must be an integer >= 1, got True"),
        ({"margin": True}, "margin must be a positive number, got True"),
        ({"lr": 0.0}, "lr must be a positive number, got 0.0"),
        ({"lr": float("inf")}, "lr must be finite, got inf"),
        ({"init": "pca"}, "init must be 'discriminative' or 'random', got 'pca'"),
    ):
        with pytest.raises(ValueError, match="^" + message.replace("(", r"\(") + "$"):
            train_projections(records[:1], **kwargs)
    # The smallest accepted values train.
    small = train_projections(records[:1], rank=1, epochs=1, batch_size=1, seed=0, lr=1e-3,
                              negatives_per_positive=1, margin=1e-3)
    assert small.rank == 1


def test_dense_and_empty_heads_messages(records: list[AttentionRecord]) -> None:
    gold = torch.zeros(HEADS, 5, 5, dtype=torch.bool)
    gold[0, :, 0] = True  # head 0: fine; head 1: no edge at all
    with pytest.raises(ValueError, match=r"^heads \[1\] have no gold edge at all in the "
                                         r"training records; train on more \(or longer\) "
                                         r"texts$"):
        train_projections([_fixed_record([gold, gold], causal=False)], rank=2)
    gold[1, :, :] = True  # head 1: every key, every row
    with pytest.raises(ValueError, match=r"^heads \[1\] attend to every key in every row of "
                                         r"the training records: they have no non-edge, and "
                                         r"the contrastive loss needs one \(a gold edge "
                                         r"against a non-edge of its row\); such heads are "
                                         r"dense at this α — raise α or train on texts where "
                                         r"they are sparse$"):
        train_projections([_fixed_record([gold, gold], causal=False)], rank=2)
    one = torch.zeros(HEADS, 5, 5, dtype=torch.bool)
    one[:, 2, 1] = True  # a single gold edge per head is enough
    assert train_projections([_fixed_record([one, one], causal=False)], rank=2).rank == 2
    # dense_heads="zero" (block projections): the dense head keeps a zero map, the other
    # head trains exactly as without it; a head without any edge is still an error
    zeroed = train_projections([_fixed_record([gold, gold], causal=False)], rank=2,
                               dense_heads="zero", init="random")
    assert zeroed.metadata["dense_heads"] == [[1], [1]]
    assert zeroed.weight[:, 1].abs().sum() == 0 and (zeroed.weight[:, 0].abs().sum(-1) > 0).all()
    empty = torch.zeros(HEADS, 5, 5, dtype=torch.bool)
    empty[0, :, 0] = True
    with pytest.raises(ValueError, match=r"^heads \[1\] have no gold edge at all"):
        train_projections([_fixed_record([empty, empty], causal=False)], rank=2,
                          dense_heads="zero")
    with pytest.raises(ValueError, match="dense_heads must be 'error' or 'zero', got 'skip'"):
        train_projections([_fixed_record([one, one], causal=False)], dense_heads="skip")


# ---------------------------------------------------------------- the file and its checks


def _tiny(centroids: dict | None = None, **kw) -> HeadProjections:
    return HeadProjections(weight=torch.ones(2, 3, 2, 4), bias=torch.zeros(2, 3, 2),
                           model_id="m", alpha=1.5, centroids=centroids or {}, **kw)


def test_constructor_messages() -> None:
    with pytest.raises(ValueError, match=r"^weight must be a tensor \(layers, heads, r, d\), "
                                         r"got \(2, 3, 4\)$"):
        HeadProjections(weight=torch.ones(2, 3, 4), bias=torch.zeros(2, 3), model_id="m",
                        alpha=1.5)
    with pytest.raises(ValueError, match=r"^weight must be a tensor .*, got list$"):
        HeadProjections(weight=[1.0], bias=torch.zeros(2, 3), model_id="m", alpha=1.5)
    with pytest.raises(ValueError, match=r"^bias must be a tensor \(layers, heads, r\) = "
                                         r"\(2, 3, 2\), got \(2, 3\)$"):
        HeadProjections(weight=torch.ones(2, 3, 2, 4), bias=torch.zeros(2, 3), model_id="m",
                        alpha=1.5)
    with pytest.raises(ValueError, match=r"^bias must be a tensor .*, got NoneType$"):
        HeadProjections(weight=torch.ones(2, 3, 2, 4), bias=None, model_id="m", alpha=1.5)
    with pytest.raises(ValueError, match=r"^centroids\[4\] must have shape \(2, 3, 4, 2\), "
                                         r"got \(2, 3, 5, 2\)$"):
        _tiny({4: torch.zeros(2, 3, 5, 2)})
    with pytest.raises(ValueError, match=r"^centroids\[4\] must have shape .*, got str$"):
        _tiny({4: "x"})
    ok = _tiny({4: torch.zeros(2, 3, 4, 2, dtype=torch.float64)})
    assert ok.weight.dtype == torch.float32 and ok.head_dim == 4 and ok.num_heads == 3


def test_project_checks_layer_and_shape() -> None:
    proj = _tiny()
    x = torch.ones(3, 5, 4)
    assert proj.project(1, x).shape == (3, 5, 2)
    assert torch.equal(proj.project(1, x), torch.full((3, 5, 2), 4.0))
    for layer in (-1, 2):
        with pytest.raises(ValueError, match=rf"^layer must be in \[0, 2\), got {layer}$"):
            proj.project(layer, x)
    for bad in (torch.ones(3, 5), torch.ones(2, 5, 4), torch.ones(3, 5, 3)):
        with pytest.raises(ValueError, match=r"^expected x of shape \(heads=3, n, d=4\), got "):
            proj.project(0, bad)
    meta = proj.project(0, torch.ones(3, 5, 4, device="meta"))
    assert meta.device.type == "meta"


def test_check_record_messages(records: list[AttentionRecord]) -> None:
    bare = AttentionRecord(text="x", tokens=[], offsets=[], special=[], causal=False, layers=[])
    with pytest.raises(ValueError, match=r"^the record has no layers$"):
        _tiny().check_record(bare)
    one = AttentionRecord(text="x", tokens=records[0].tokens, offsets=records[0].offsets,
                          special=records[0].special, causal=False,
                          layers=records[0].layers[:1])
    with pytest.raises(ProjectionsError, match=r"^projections for m expect \(layers, heads, "
                                               r"head_dim\) = \(2, 3, 4\), but the text's "
                                               r"attention has \(1, 2, 8\); train projections "
                                               r"for this model with `sparsefinder train "
                                               r"--model default"):
        _tiny().check_record(one)


def test_kmeans_from_stored_centroids_and_the_hint() -> None:
    centroids = torch.randn(2, 3, 4, 2, generator=torch.Generator().manual_seed(0))
    proj = _tiny({4: centroids})
    km = proj.kmeans(1, 4)
    assert km.top_k == 1 and torch.equal(km.centroids_, centroids[1])
    assert proj.kmeans(0, 4, top_k=2).top_k == 2
    with pytest.raises(ProjectionsError, match=r"^no k-means centroids for B=5 in these "
                                               r"projections \(stored: 4\); retrain with "
                                               r"`sparsefinder train --model m --out DIR "
                                               r"--clusters 5`$"):
        proj.kmeans(0, 5)
    with pytest.raises(ProjectionsError, match=r"\(stored: none\)"):
        _tiny().kmeans(0, 5)
    with pytest.raises(ProjectionsError, match=r"\(stored: 2, 4\)"):
        _tiny({4: centroids, 2: torch.zeros(2, 3, 2, 2)}).kmeans(0, 3)


def test_payload_and_atomic_save(tmp_path) -> None:
    proj = _tiny({2: torch.zeros(2, 3, 2, 2)}, metadata={"a": 1})
    payload = proj.to_payload()
    assert payload["rank"] == 2 and payload["model_id"] == "m" and payload["alpha"] == 1.5
    assert payload["metadata"] == {"a": 1} and list(payload["centroids"]) == [2]
    assert payload["format"] == "sparsefinder-projections"
    path = proj.save(tmp_path / "a" / "b" / "p.pt")
    assert path == tmp_path / "a" / "b" / "p.pt" and sorted(p.name for p in path.parent.iterdir()) \
        == ["p.pt"]  # the temporary file is renamed away
    loaded = HeadProjections.load(str(path))
    assert loaded.metadata == {"a": 1} and loaded.rank == 2


def test_load_messages(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"^projections file .*missing.pt not found; "
                                                r"create it with `sparsefinder train --model "
                                                r"x/y"):
        HeadProjections.load(tmp_path / "missing.pt", expected_model_id="x/y")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"")
    with pytest.raises(ProjectionsError, match=r"garbage.pt is corrupt or truncated: it is not "
                                               r"a readable Sparsefinder projections file; "
                                               r"regenerate it with `sparsefinder train "
                                               r"--model default"):
        HeadProjections.load(garbage)
    good = _tiny().save(tmp_path / "good.pt")
    damaged = tmp_path / "damaged.pt"
    payload = torch.load(good, weights_only=True)
    del payload["bias"]
    torch.save(payload, damaged)
    with pytest.raises(ProjectionsError, match=r"damaged.pt is damaged \('bias'\); regenerate"):
        HeadProjections.load(damaged)
    with pytest.warns(UserWarning, match=r"trained at alpha=1.5, the model runs at alpha=2.0; "
                                         r"predictions will be less accurate"):
        HeadProjections.load(good, expected_alpha=2.0)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert HeadProjections.load(good, expected_alpha=1.5 + 1e-12).alpha == 1.5


def test_explicit_cpu_device_is_the_default(records: list[AttentionRecord]) -> None:
    a = train_projections(records, rank=2, seed=3)
    b = train_projections(records, rank=2, seed=3, device="cpu")
    assert torch.equal(a.weight, b.weight)


@pytest.mark.cuda
def test_training_on_cuda_matches_the_cpu(records: list[AttentionRecord]) -> None:
    cpu = train_projections(records, rank=2, seed=3)
    gpu = train_projections(records, rank=2, seed=3, device="cuda")
    assert gpu.weight.device.type == "cpu"  # results come back to the CPU
    torch.testing.assert_close(gpu.weight, cpu.weight, rtol=0, atol=training_tol(cpu.metadata))


# ---------------------------------------------------------------- the hinge's init and edges


@pytest.mark.parametrize("scale", [0.01, 3.0])
def test_discriminative_init_solves_the_generalised_eigenproblem(scale: float) -> None:
    """Rows w: C_P-orthonormal up to margin/rank (with the documented ridge) and spanning the
    top generalised eigenvalues of C_N v = λ C_P v, found here without a Cholesky factor."""
    from sparsefinder.projections.hinge import _solve_init

    gen = torch.Generator().manual_seed(3)
    heads, d, rank, margin = 2, 5, 2, 3.0
    a, b = (torch.randn(heads, d, 2 * d, generator=gen, dtype=torch.float64) for _ in range(2))
    c_pos, c_neg = scale * a @ a.transpose(1, 2) / d, b @ b.transpose(1, 2) / d
    w = _solve_init(c_pos, c_neg, rank, margin).double()
    assert w.shape == (heads, rank, d) and _solve_init(c_pos, c_neg, rank, margin).dtype \
        == torch.float32
    ridge = 1e-4 * c_pos.diagonal(dim1=-2, dim2=-1).mean(-1)
    b_mat = c_pos + ridge[:, None, None] * torch.eye(d, dtype=torch.float64)
    lam = torch.linalg.eigvals(torch.linalg.solve(b_mat, c_neg)).real.sort(-1).values
    for h in range(heads):
        # w comes back rounded to float32 (relative u per entry); the products here are
        # float64: each entry of w·M·wᵀ moves by ≤ 2u·(|w|·|M|·|w|ᵀ) (and float64 rounding)
        for got, matrix, expected in (
                (w[h] @ b_mat[h] @ w[h].T, b_mat[h],
                 margin / rank * torch.eye(rank, dtype=torch.float64)),
                (w[h] @ c_neg[h] @ w[h].T, c_neg[h],
                 margin / rank * torch.diag(lam[h, -rank:]))):
            scale = float((w[h].abs() @ matrix.abs() @ w[h].abs().T).max())
            atol = bound(scale, terms=2) + bound(scale, terms=2 * d + 2, dtype=torch.float64)
            torch.testing.assert_close(got, expected, rtol=0, atol=atol)


def test_discriminative_init_puts_positives_at_the_margin(records: list[AttentionRecord]) -> None:
    """With a negligible learning rate the weights are the init: the mean projected squared
    distance of the positives is the margin (up to the ridge and repeated sample rows)."""
    for init, near in (("discriminative", True), ("random", False)):
        proj = train_projections(records, rank=2, margin=50.0, lr=1e-9, batch_size=4096,
                                 init=init)
        for layer in range(LAYERS):
            pairs = _layer_pairs(records, layer)
            delta = pairs.q_table[pairs.q_row] - pairs.k_table[pairs.k_row]
            w = proj.weight[layer][pairs.head]  # (P, r, d)
            sq = (w @ delta[..., None]).square().sum((1, 2))
            means = torch.stack([sq[pairs.head == h].mean() for h in range(HEADS)])
            assert bool(((means - 50.0).abs() < 5.0).all()) == near, (init, means)
    # ... and the learning rate given is the one the steps use: more epochs barely move layer
    # 0 (layer 1's random init is drawn after layer 0's epochs, so it differs)
    longer = train_projections(records, rank=2, margin=50.0, lr=1e-9, batch_size=4096,
                               init="random", epochs=4)
    # 3 more epochs of Adam steps of at most ADAM_STEP·lr each (and their rounding)
    meta = longer.metadata
    steps = 3 * -(-max(meta["positives_per_layer"]) // meta["batch_size"])
    moved = steps * ADAM_STEP * 1e-9 + tol_for(proj.weight[0], terms=2 * steps)["atol"]
    assert (longer.weight[0] - proj.weight[0]).abs().max() <= moved


def test_random_init_is_drawn_from_the_seeded_generator(records: list[AttentionRecord]) -> None:
    a = train_projections(records, rank=2, batch_size=64, seed=5, init="random")
    b = train_projections(records, rank=2, batch_size=64, seed=5, init="random")
    assert torch.equal(a.weight, b.weight)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_manual_gradient_in_double_precision_and_at_an_exact_tie(dtype: torch.dtype) -> None:
    from sparsefinder.projections.hinge import _hinge_grad
    from sparsefinder.projections.pairs import _LayerPairs

    gen = torch.Generator().manual_seed(4)
    heads, tokens, d, r, size, num = 2, 30, 6, 3, 15, 3  # 2 / (size·num) is no binary fraction
    q_table = torch.randn(heads * tokens, d, generator=gen, dtype=dtype)
    k_table = torch.randn(heads * tokens, d, generator=gen, dtype=dtype)
    pairs = _LayerPairs(q_table, k_table, *([None] * 8))
    q_rows, k_rows = (torch.randint(0, heads * tokens, (heads, size), generator=gen)
                      for _ in range(2))
    n_rows = torch.randint(0, heads * tokens, (heads, size, num), generator=gen)
    w0 = torch.randn(heads, r, d, generator=gen, dtype=dtype) * 0.5
    grad, loss = _hinge_grad(pairs, q_rows, k_rows, n_rows, w0, 1.0)
    reference = w0.clone().requires_grad_()
    q = q_table[q_rows]
    pos = (torch.einsum("hrd,hbd->hbr", reference, q - k_table[k_rows]) ** 2).sum(-1)
    neg = (torch.einsum("hrd,hbkd->hbkr", reference, q[:, :, None] - k_table[n_rows]) ** 2)
    hinge = torch.relu(1.0 + pos[..., None] - neg.sum(-1)).mean((1, 2))
    hinge.sum().backward()
    grad_err, _ = _hinge_tols(reference.detach(), q, k_table[k_rows], k_table[n_rows])
    torch.testing.assert_close(grad, reference.grad, rtol=0, atol=grad_err)
    assert grad.dtype == dtype
    # A hinge exactly at 0 (q = k_P, ‖W Δ_N‖² = ω) is inactive: no gradient, as relu'(0) = 0.
    tie = _LayerPairs(torch.zeros(1, 2, dtype=dtype),
                      torch.tensor([[0.0, 0.0], [1.0, 0.0]], dtype=dtype), *([None] * 8))
    row0 = torch.zeros(1, 1, dtype=torch.long)
    grad, loss = _hinge_grad(tie, row0, row0, torch.ones(1, 1, 1, dtype=torch.long),
                             torch.eye(2, dtype=dtype)[None], 1.0)
    assert torch.equal(grad, torch.zeros(1, 2, 2, dtype=dtype)) and float(loss) == 0.0


def test_softmax_layers_are_left_untrained_and_listed(records: list[AttentionRecord]) -> None:
    from dataclasses import replace

    mixed = [replace(r, layers=[r.layers[0], replace(r.layers[1], alpha=1.0)]) for r in records]
    proj = train_projections(mixed, rank=2, batch_size=64)
    meta = proj.metadata
    assert meta["softmax_layers"] == [1] and meta["objective"] == "paper"
    assert torch.equal(proj.weight[1], torch.zeros(HEADS, 2, D))
    assert torch.equal(proj.bias[1], torch.zeros(HEADS, 2))
    assert meta["positives_per_layer"] == [int(_layer_pairs(mixed, 0).head.numel()), 0]
    assert proj.weight[0].abs().sum() > 0
    assert "softmax_layers" not in train_projections(records, rank=2, batch_size=64).metadata


def test_bias_centres_every_record_also_the_held_out_ones(records: list[AttentionRecord]) -> None:
    from sparsefinder.training import EarlyStop

    proj = train_projections(records, rank=2, batch_size=32, epochs=2,
                             early_stop=EarlyStop(held_out=0.34, min_delta=1e9))
    for layer in range(LAYERS):
        tokens = torch.cat([r.layers[layer].queries for r in records]
                           + [r.layers[layer].keys for r in records], dim=1)
        centred = proj.project(layer, tokens).mean(1).abs().max()
        assert centred <= _centring_tol(proj.weight[layer], proj.bias[layer], tokens)


def test_hinge_objective_defaults_refuse_dense_heads_and_centre_its_records(
        records: list[AttentionRecord]) -> None:
    from sparsefinder.projections.hinge import HingeObjective
    from sparsefinder.training import Trainer

    def objective(recs: list[AttentionRecord]) -> HingeObjective:
        return HingeObjective(recs, heads=HEADS, batch_size=64, negatives_per_positive=1,
                              seed=0, rank=2, d=D, margin=1.0, init="random")

    done = Trainer(epochs=1).fit(objective(records[:3]), LAYERS)
    for layer, result in enumerate(done):
        tokens = torch.cat([r.layers[layer].queries for r in records[:3]]
                           + [r.layers[layer].keys for r in records[:3]], dim=1)
        centred = result["weight"] @ tokens.mean(1)[..., None] + result["bias"][..., None]
        assert centred.abs().max() <= _centring_tol(result["weight"], result["bias"], tokens)
    dense = [AttentionRecord(text=r.text, tokens=r.tokens, offsets=r.offsets, special=r.special,
                             causal=r.causal, layers=[
                                 LayerGraph(g.queries, g.keys, torch.ones_like(g.gold),
                                            torch.ones(g.gold.numel()), g.scaling)
                                 for g in r.layers]) for r in records[:3]]
    with pytest.raises(ValueError, match=r"attend to every key"):
        Trainer(epochs=1).fit(objective(dense), LAYERS)


def test_training_prints_nothing_by_default(records: list[AttentionRecord], capsys) -> None:
    train_projections(records[:2], rank=2, batch_size=64)
    assert capsys.readouterr().err == ""
