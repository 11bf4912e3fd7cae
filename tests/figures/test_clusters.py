"""Cluster figures: stacked bars that show exactly the tables they are given."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from sparsefinder.figures.clusters import (
    breakdown_figure,
    cluster_colors,
    order_tags,
    pos_recall_figure,
    queries_keys_figure,
)

PCT = pd.DataFrame(
    [[50.0, 50.0, 0.0], [0.0, 25.0, 75.0], [100.0, 0.0, 0.0]],
    index=pd.Index(["VERB", "ADJ", "SPECIAL"], name="tag"),
    columns=pd.RangeIndex(3, name="cluster"),
)


def test_order_tags_follows_upos_then_special_then_unknown():
    assert order_tags(["VERB", "ZZZ", "SPECIAL", "ADJ"]) == ["ADJ", "VERB", "SPECIAL", "ZZZ"]


def test_breakdown_figure_stacks_one_trace_per_cluster():
    fig = breakdown_figure(PCT, title="t", counts=pd.Series({"VERB": 4, "ADJ": 8, "SPECIAL": 2}))
    assert isinstance(fig, go.Figure) and fig.layout.barmode == "stack"
    assert [t.name for t in fig.data] == ["cluster 0", "cluster 1", "cluster 2"]
    assert list(fig.data[0].x) == ["ADJ", "VERB", "SPECIAL"]
    stacked = sum(pd.Series(t.y, index=t.x) for t in fig.data)
    assert stacked.tolist() == [100.0, 100.0, 100.0]
    assert list(fig.data[2].customdata) == [8, 4, 2]
    assert len(set(cluster_colors(30))) == 30


def test_queries_keys_figure_shares_one_legend():
    fig = queries_keys_figure(PCT, PCT.iloc[:2])
    assert len(fig.data) == 6
    assert sum(bool(t.showlegend) for t in fig.data) == 3
    assert {t.yaxis for t in fig.data} == {"y", "y2"}


def test_pos_recall_figure_groups_recall_and_sparsity():
    scores = pd.DataFrame(
        {"tokens": [3, 5], "recall": [0.5, 1.0], "sparsity": [0.8, 0.6]}, index=["VERB", "ADJ"]
    )
    fig = pos_recall_figure(scores)
    assert [t.name for t in fig.data] == ["recall", "sparsity"]
    assert list(fig.data[0].x) == ["ADJ", "VERB"] and list(fig.data[0].y) == [1.0, 0.5]
