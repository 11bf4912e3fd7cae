"""Sparsity–accuracy sweeps: frontiers and dominance by hand, and a sweep on a tiny BERT."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from tolerances import bound

from sparsefinder.evaluation.accuracy_sweep import (
    MEASURES,
    TABLE_COLUMNS,
    accuracy_sweep,
    accuracy_table,
    at_sparsity,
    dominance,
    frontier,
    write_outputs,
)
from sparsefinder.figures.accuracy import accuracy_figure
from sparsefinder.models.loading import LoadedModel
from sparsefinder.projections.heads import HeadProjections

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable


def _df(rows):
    return pd.DataFrame(
        [{"method": m, "params": json.dumps({"i": i}), "sparsity": s, "output_cosine": v}
         for i, (m, s, v) in enumerate(rows)]
    )


def test_frontier_keeps_undominated_points_per_method() -> None:
    df = _df([("distance", 0.5, 0.99), ("distance", 0.6, 0.995), ("distance", 0.9, 0.7),
              ("distance", 0.8, 0.6), ("window", 0.5, 0.9)])
    front = frontier(df, "output_cosine")
    assert front[front["method"] == "distance"]["sparsity"].tolist() == [0.6, 0.9]
    assert front[front["method"] == "window"]["sparsity"].tolist() == [0.5]
    at = at_sparsity(df, measures=["output_cosine"], levels=[0.55, 0.85, 0.95])
    row = at.set_index("method").loc["distance"]
    assert row["output_cosine@0.55"] == 0.995 and row["output_cosine@0.85"] == 0.7
    assert math.isnan(row["output_cosine@0.95"])


def test_accuracy_table_reports_one_configuration_per_level() -> None:
    """Each row is the point behind output_cosine@level, with all of ITS columns."""
    df = _df([("distance", 0.74, 0.999), ("distance", 0.76, 0.99), ("distance", 0.80, 0.995),
              ("distance", 0.91, 0.97), ("topk", 0.5, 1.0)])
    df["recall"] = [0.99, 0.97, 0.96, 0.8, 1.0]
    df["embedding_cosine"] = [0.9, 0.8, 0.7, 0.6, 1.0]
    table = accuracy_table(df, levels=(0.75, 0.9, 0.95))
    assert list(table.columns) == ["method", "level", "params", *TABLE_COLUMNS]
    row = table[(table["method"] == "distance") & (table["level"] == 0.75)].iloc[0]
    # the 0.80 point has the best output cosine at sparsity >= 0.75: its recall, not the best
    assert json.loads(row["params"]) == {"i": 2}
    assert (row["sparsity"], row["recall"], row["embedding_cosine"]) == (0.80, 0.96, 0.7)
    assert row["output_cosine"] == at_sparsity(df, ["output_cosine"], [0.75]).set_index(
        "method").loc["distance", "output_cosine@0.75"]
    assert math.isnan(row["mass_recall"])  # no recall-sweep column given: NaN, not a guess
    empty = table[(table["method"] == "distance") & (table["level"] == 0.95)].iloc[0]
    assert empty["params"] == "" and math.isnan(empty["output_cosine"])
    assert table[table["method"] == "topk"]["output_cosine"].isna().all()


def test_dominance_compares_the_best_sparsefinder_method_per_level() -> None:
    df = _df([
        ("distance", 0.6, 0.95), ("distance", 0.9, 0.80),
        ("kmeans+window", 0.7, 0.97),
        ("window", 0.6, 0.90), ("window", 0.9, 0.85),  # beats distance at 0.9
        ("bigbird", 0.6, 0.5),
    ])
    dom = dominance(df, measures=["output_cosine"], levels=[0.6, 0.7, 0.9])
    window = dom.set_index("baseline").loc["window"]
    assert window["levels_compared"] == 3 and window["levels_sparsefinder_ge"] == 2
    assert not window["dominates"] and window["worst_margin"] == pytest.approx(-0.05)
    bigbird = dom.set_index("baseline").loc["bigbird"]
    assert bigbird["levels_compared"] == 1 and bigbird["dominates"]


@pytest.fixture(scope="module")
def tiny(tiny_entmax_bert) -> LoadedModel:
    return tiny_entmax_bert


def test_accuracy_sweep_on_a_tiny_model(tiny: LoadedModel, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    projections = HeadProjections(
        weight=torch.randn(2, 4, 4, 8, generator=gen) * 0.3, bias=torch.zeros(2, 4, 4),
        model_id="tiny", alpha=1.5, centroids={2: torch.randn(2, 4, 2, 4, generator=gen)},
    )
    texts = ["Sparse attention keeps a few keys per query in long sentences.",
             "Entmax gives exact zeros.", "Another short passage about tokens and heads.",
             "Retrieval agreement needs several texts to rank."]
    df = accuracy_sweep(tiny, texts, projections, "distance,kmeans+window,window,bigbird",
                        batch_size=3)
    assert set(df["method"]) == {"distance", "kmeans+window", "window", "bigbird"}
    # kmeans has centroids for B=2 only: the other grid points are skipped, not failed.
    assert (df["method"] == "kmeans+window").sum() == 1
    for measure in MEASURES:
        assert df[measure].between(-1, 1 + 1e-9).all(), measure
    dense = df[(df["method"] == "window") & (df["params"] == '{"window": 251}')].iloc[0]
    # cosines of (nearly) equal float32 outputs: a dot product and two norms of d terms each
    assert dense["sparsity"] == 0 and dense["output_cosine"] == pytest.approx(
        1.0, abs=bound(1.0, terms=2 * tiny.model.config.hidden_size + 4))
    assert dense["retrieval_top1"] == 1.0 and dense["retrieval_ndcg10"] == 1.0
    narrow = df[(df["method"] == "window") & (df["params"] == '{"window": 1}')].iloc[0]
    assert narrow["output_cosine"] < 0.99 and narrow["sparsity"] > 0.8
    assert len(json.loads(narrow["layer_cosine"])) == 2
    empty = df[(df["method"] == "window") & (df["params"] == '{"window": 0}')].iloc[0]
    assert empty["repaired_rows"] == 1.0  # every row kept only its diagonal
    assert (df["predict_ms"] > 0).all()  # each point's prediction cost, beside its accuracy
    tables = write_outputs(df, tmp_path, gold_sparsity=0.6, summary={"n": 4})
    for name in ("accuracy_points.csv", "accuracy_frontier.csv", "accuracy_at_sparsity.csv",
                 "accuracy_dominance.csv", "accuracy.json"):
        assert (tmp_path / name).is_file(), name
    figure = accuracy_figure(tables["points"], 0.6, "t")  # what `sweep --accuracy` draws
    assert any(trace.name == "full α-entmax" and trace.marker.symbol == "diamond"
               for trace in figure.data)
    assert set(tables["frontier"]["measure"]) == set(MEASURES)
    payload = json.loads((tmp_path / "accuracy.json").read_text())
    assert payload["gold_sparsity"] == 0.6 and len(payload["points"]) == len(df)
    assert {"window", "bigbird"} <= set(tables["dominance"]["baseline"])
    # the table's columns are the points' own measures (the library's, not recomputed)
    table = pd.read_csv(tmp_path / "accuracy_table.csv")
    assert len(table) == 4 * 3 and payload["table"]
    at = tables["at_sparsity"].set_index("method")
    for _, row in table.dropna(subset=["output_cosine"]).iterrows():
        point = df[(df["method"] == row["method"]) & (df["params"] == row["params"])].iloc[0]
        for column in ("sparsity", *MEASURES):
            assert row[column] == pytest.approx(point[column]), column
        assert row["output_cosine"] == pytest.approx(
            at.loc[row["method"], f"output_cosine@{row['level']:g}"])
