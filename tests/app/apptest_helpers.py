"""Helpers shared by the AppTest modules (conftest.py is not importable in importlib mode)."""

from __future__ import annotations

from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
MAIN = str(ROOT / "app" / "main.py")
TIMEOUT = 180  # first model load + gold graphs on a busy 2-core CPU


def new_app(**query_params: str):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    for key, value in query_params.items():
        at.query_params[key] = value
    return at


def metric(at, label: str) -> float:
    """Value of the st.metric with this label."""
    values = [m.value for m in at.metric if m.label == label]
    assert values, f"no metric {label!r}; have {[m.label for m in at.metric]}"
    return float(values[0])


def gold_sparsity(at, scope: str) -> float:
    """The Explorer's gold sparsity at ``scope`` ("Head", "Layer", "Model"): shown under the
    "<scope> sparsity" metric, as its delta ("gold 0.944")."""
    deltas = [m.proto.delta for m in at.metric if m.label == f"{scope} sparsity"]
    assert deltas, f"no metric '{scope} sparsity'; have {[m.label for m in at.metric]}"
    assert deltas[0].startswith("gold "), deltas[0]
    return float(deltas[0].removeprefix("gold "))


def assert_clean(at) -> None:
    """No exception element (Streamlit shows tracebacks there) and no error box."""
    assert not at.exception, [e.value for e in at.exception]


def random_projections(model_id: str, layers: int = 6, heads: int = 12, d: int = 32,
                       rank: int = 4, clusters: tuple[int, ...] = (2, 4, 8)):
    """Untrained projections with centroids: every code path, no training time."""
    from sparsefinder.projections.heads import HeadProjections

    gen = torch.Generator().manual_seed(0)
    return HeadProjections(
        weight=torch.randn(layers, heads, rank, d, generator=gen) / d**0.5,
        bias=torch.zeros(layers, heads, rank), model_id=model_id, alpha=1.5,
        centroids={b: torch.randn(layers, heads, b, rank, generator=gen) for b in clusters},
    )


def figures(at) -> list[dict]:
    """The plotly figures of the page as dicts (their JSON spec)."""
    import json

    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def assert_head_graphs(at) -> dict:
    """The Explorer's head figure is drawn: gold, predicted and diff panels as image traces."""
    heads = [f for f in figures(at)
             if any("Diff" in a.get("text", "") for a in f["layout"].get("annotations", []))]
    assert heads, "no gold/predicted/diff figure on the page"
    figure = heads[0]
    assert [t["type"] for t in figure["data"]].count("image") == 3
    titles = " ".join(a["text"] for a in figure["layout"]["annotations"])
    assert "Gold" in titles and "Predicted" in titles and "Diff" in titles
    return figure
