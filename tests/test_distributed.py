"""Training and sweeps over shards on 2 gloo ranks (torchrun) = the same in one process."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from tolerances import bound, tol_for, training_tol

from sparsefinder.cli import main
from sparsefinder.data.shards import ShardedRecords
from sparsefinder.evaluation.sharded_sweep import sweep_streaming
from sparsefinder.evaluation.sweep import sweep
from sparsefinder.projections.centroids import fit_centroids
from sparsefinder.projections.data_parallel import train_projections_sharded
from sparsefinder.projections.distributed_centroids import fit_centroids_sharded
from sparsefinder.projections.heads import HeadProjections
from sparsefinder.projections.hinge import train_projections

WORKER = Path(__file__).with_name("distributed_worker.py")
_spec = importlib.util.spec_from_file_location("distributed_worker", WORKER)
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)
TEXTS, extract_args, torchrun = helpers.TEXTS, helpers.extract_args, helpers.torchrun
METHODS = "distance,quantization,window,longformer"


@pytest.fixture(scope="module")
def store(tiny_model_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(TEXTS * 2) + "\n", encoding="utf-8")
    assert main(extract_args(tiny_model_dirs["bert"], corpus, root, "--sharded")) == 0
    return root / "records-all"


@pytest.fixture(scope="module")
def ranks(store, tmp_path_factory):
    """ONE torchrun start for this module: the worker's data-parallel training and streamed
    sweep, then the ``train``/``sweep --records`` commands on the same 2 ranks."""
    out = tmp_path_factory.mktemp("ranks")
    run = torchrun([str(WORKER), str(store), str(out), "--commands"])
    assert run.returncode == 0, run.stdout + run.stderr
    return out


def test_one_shard_is_train_projections_step_for_step(store):
    records = ShardedRecords(store).load_all()
    plain = train_projections(records, batch_size=64, seed=3)
    sharded = train_projections_sharded([records], batch_size=64, seed=3)
    assert torch.equal(plain.weight, sharded.weight)  # same draws, same gradients
    # the bias, -W·mean(tokens): a float32 mean of N tokens in one, a float64 one in the other,
    # then d products: N + d + 1 terms at the magnitude of |W|·max|token|
    for layer in range(plain.weight.shape[0]):
        tokens = torch.cat([t for r in records for t in (r.layers[layer].queries,
                                                          r.layers[layer].keys)], dim=1)
        weight = plain.weight[layer].abs()
        scale = float((weight.sum(-1) * float(tokens.abs().max())).max())
        terms = tokens.shape[1] + weight.shape[-1] + 1
        torch.testing.assert_close(plain.bias[layer], sharded.bias[layer], rtol=0,
                                   atol=bound(scale, terms=terms))


def test_two_ranks_train_and_sweep_like_one_process(store, ranks):
    ranks = [torch.load(ranks / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    reader = ShardedRecords(store)
    shards = [list(reader.iter_records(r, 2)) for r in (0, 1)]
    single = train_projections_sharded(shards, batch_size=64, seed=3)  # one process, 2 shards
    # two ranks all-reduce their gradients where one process adds its two shards': rounding
    weight_err = training_tol(single.metadata, world=2)
    for got in ranks:
        assert got["world"] == 2
        torch.testing.assert_close(got["weight"], single.weight, rtol=0, atol=weight_err)
        torch.testing.assert_close(got["bias"], single.bias, rtol=0, atol=weight_err)
        # scores are bilinear in the weights and the hinge has slope ≤ 1: to first order the
        # loss moves by twice the weights' relative change (at their typical size)
        relative = 2 * weight_err / float(single.weight.abs().mean())
        assert got["loss_last"] == pytest.approx(single.metadata["loss_last"], rel=relative)
    # The sweep: per-(layer, head) sums all-reduced = one process over all records.
    records = reader.load_all()
    streamed = sweep_streaming(reader.iter_records(), single, records[0].num_layers, METHODS)
    reference = sweep(records, single, METHODS)
    assert list(reference["params"]) == list(streamed["params"])
    # one column set: the streamed sweep keeps the extra metrics the in-memory one writes
    assert list(streamed.columns) == list(reference.columns)
    for column in ("precision", "exact_fraction", "mass_recall", "block_recall16",
                   "block_recall64", "block_recall"):
        assert streamed[column].tolist() == pytest.approx(reference[column].tolist(),
                                                           abs=1e-12, nan_ok=True), column
    for frame in (streamed, *ranks):
        recall = frame["recall"] if isinstance(frame, dict) else frame["recall"].tolist()
        sparsity = frame["sparsity"] if isinstance(frame, dict) else frame["sparsity"].tolist()
        assert recall == pytest.approx(reference["recall"].tolist(), abs=1e-12)
        assert sparsity == pytest.approx(reference["sparsity"].tolist(), abs=1e-12)
    assert ranks[0]["gold"] == pytest.approx(reference.attrs["gold_sparsity"], abs=1e-12)
    assert ranks[0]["n_texts"] == [len(records)] * len(reference)


def test_train_command_reads_a_shard_store(store, tmp_path):
    assert main(["train", "--records", str(store), "--out", str(tmp_path), "--batch-size",
                 "64", "--seed", "3", "--clusters", "2", "--kmeans-n-init", "1"]) == 0
    saved = HeadProjections.load(tmp_path / "projections.pt")
    records = ShardedRecords(store).load_all()
    reference = train_projections_sharded([list(ShardedRecords(store).iter_records())],
                                          batch_size=64, seed=3)
    assert torch.equal(saved.weight, reference.weight) and 2 in saved.centroids
    assert saved.metadata["n_texts"] == len(records)


def test_centroids_sample_every_record_like_fit_centroids(store):
    """One process, records handed over in another order with their corpus positions."""
    records = ShardedRecords(store).load_all()
    projections = train_projections(records, batch_size=64, seed=3)
    reference = fit_centroids(copy.deepcopy(projections), records, [2, 3], max_points=40,
                              n_init=1, seed=5)
    order = list(range(len(records)))[::-1]
    got = fit_centroids_sharded(copy.deepcopy(projections), [records[i] for i in order],
                                order, [2, 3], max_points=40, n_init=1, seed=5)
    for b in (2, 3):  # the same points, summed per cluster (≤ max_points terms)
        torch.testing.assert_close(got.centroids[b], reference.centroids[b],
                                   **tol_for(reference.centroids[b], terms=40))
    with pytest.raises(ValueError, match="share a position"):
        fit_centroids_sharded(copy.deepcopy(projections), records[:2], [0, 0], [2])


def test_two_ranks_train_and_sweep_commands_match_one_process(store, ranks):
    """`sparsefinder train/sweep --records` on 2 torchrun ranks: centroids from BOTH ranks'
    chunks (subsampled across ranks), and the sweep's points = one process over all records.
    (`torchrun -m sparsefinder`, the entry point itself, is run by the atlas and shard tests.)"""
    saved = HeadProjections.load(ranks / "model" / "projections.pt")
    assert saved.metadata["kmeans_ranks"] == 2
    records = ShardedRecords(store).load_all()
    reference = fit_centroids(copy.deepcopy(saved), records, [2, 3], max_points=40, n_init=1,
                              seed=3)
    for b in (2, 3):  # the same points, summed per cluster (≤ max_points terms)
        torch.testing.assert_close(saved.centroids[b], reference.centroids[b],
                                   **tol_for(reference.centroids[b], terms=40))
    methods = helpers.COMMAND_METHODS
    points = pd.read_csv(ranks / "sweep" / "points.csv")
    with pytest.warns(UserWarning, match="no k-means centroids for B=4"):
        expected = sweep(records, saved, methods)  # B = 2, 3 only, like the 2-rank sweep
    assert list(points["params"]) == list(expected["params"])
    assert set(points["method"]) == {"distance", "kmeans", "window"}
    assert points["recall"].tolist() == pytest.approx(expected["recall"].tolist(), abs=1e-12)
    assert points["sparsity"].tolist() == pytest.approx(expected["sparsity"].tolist(),
                                                        abs=1e-12)
    summary = json.loads((ranks / "sweep" / "points.json").read_text())
    assert summary["ranks"] == 2 and summary["n_texts"] == len(records)
    assert summary["gold_sparsity"] == pytest.approx(expected.attrs["gold_sparsity"], abs=1e-12)
    assert (ranks / "sweep" / "pareto.html").is_file()


def test_sweep_command_on_records_refuses_what_it_cannot_do(store, tmp_path, capsys):
    out = ["--records", str(store), "--out", str(tmp_path)]
    assert main(["sweep", *out, "--methods", "sparsebert-dams"]) == 2
    assert "--records cannot sweep only sparsebert-dams" in capsys.readouterr().err
    assert main(["sweep", *out, "--accuracy", "--methods", "window"]) == 2
    assert "drop --records (or --accuracy)" in capsys.readouterr().err
