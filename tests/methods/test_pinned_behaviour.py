"""Behaviour pinned before the family records were gathered: the same sweep CSV and the same
app links for every family and calibration the app offers.

The fixtures in ``tests/methods/data/`` were written by this module run as a script
(``python tests/methods/test_pinned_behaviour.py``) on the code before the refactor; a change
of a sweep number, a curve name or a link key fails here. Sweep rows are counts over boolean
masks averaged in float64, so they are compared to float64 rounding (1e-12).
"""

from __future__ import annotations

import io
import json
import math
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch

from sparsefinder.attention.masks import causal_mask
from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.evaluation.sweep import sweep
from sparsefinder.explore.app_methods import (
    FLOORED,
    entry_calibrations,
    entry_changes,
    menu_entries,
)
from sparsefinder.explore.state import ViewState, parse_view_state, to_spec, view_state_to_params
from sparsefinder.projections.heads import HeadProjections

DATA = Path(__file__).parent / "data"
SWEEP_CSV = DATA / "pinned_sweep.csv"
LINKS_JSON = DATA / "pinned_links.json"
HEADS, D, R, LAYERS = 3, 8, 4, 2
COLUMNS = ["method", "params", "recall", "sparsity", "precision", "mass_recall"]
#: the pinned curves: every family and calibration the sweep has (raw, +window and
#: calibrated), under the curve names the CSVs carry
CURVES = ("distance,distance+window,kmeans,kmeans-top2,quantization,window,"
          "longformer,bigbird,reformer,routing+window,topk,topp,sparsebert-dams,"
          "sparsebert-damu,distance-nodiag,distance:equal,distance:budget,distance:recall,"
          "distance-floor:budget,rowfrac,rowfrac:budget,kmeans:budget,quantization:budget,"
          "window:budget,quest,hashattention,block,block16,block+keys,block-keys,"
          "block-learned")


def _record(gen: torch.Generator, n: int, causal: bool) -> AttentionRecord:
    """Gold = each query's top-3 keys (of its non-future keys for a decoder)."""
    layers = []
    for _ in range(LAYERS):
        q = torch.randn(HEADS, n, D, generator=gen, dtype=torch.float64).float()
        k = torch.randn(HEADS, n, D, generator=gen, dtype=torch.float64).float()
        scores = q @ k.transpose(-1, -2)
        if causal:
            scores = scores.masked_fill(~causal_mask(n, n), -math.inf)
        gold = scores >= scores.topk(3, dim=-1).values[..., -1:]
        gold &= scores > -math.inf
        layers.append(LayerGraph(q, k, gold, torch.ones(int(gold.sum())) / 3, D**-0.5))
    return AttentionRecord(text="x", tokens=["t"] * n, offsets=[(0, 0)] * n,
                           special=[False] * n, causal=causal, layers=layers)


def current_sweep() -> pd.DataFrame:
    gen = torch.Generator().manual_seed(0)
    records = [_record(gen, n, causal) for n, causal in ((9, False), (40, False), (33, True))]
    train = [_record(gen, n, False) for n in (12, 18, 36)]
    centroids = {b: torch.randn(LAYERS, HEADS, b, R, generator=gen, dtype=torch.float64).float()
                 * 3 for b in (2, 4, 6, 8, 10, 12, 16, 20)}
    projections = HeadProjections(
        weight=torch.randn(LAYERS, HEADS, R, D, generator=gen, dtype=torch.float64).float(),
        bias=torch.zeros(LAYERS, HEADS, R), model_id="synthetic", alpha=1.5,
        centroids=centroids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = sweep(records, projections, CURVES, train_records=train)
    return frame[COLUMNS].reset_index(drop=True)


def current_links() -> dict[str, dict]:
    """Every entry of the method menu × calibration the app offers: its link, and the spec it
    stands for."""
    out: dict[str, dict] = {}
    for entry in menu_entries():
        for calibration in entry_calibrations(entry):
            state = ViewState(**{**entry_changes(entry), "calibration": calibration}, t=1.25,
                              clusters=8, bins=4, pages=4, target_sparsity=0.85)
            spec = to_spec(state)
            out[f"{entry}:{calibration}"] = {
                "link": view_state_to_params(state),
                "spec": {"method": spec.method_id, "params": spec.param_dict,
                         "window": spec.window},
            }
    return out


@pytest.mark.numerical
def test_sweep_csv_unchanged() -> None:
    want = pd.read_csv(SWEEP_CSV)
    got = pd.read_csv(io.StringIO(current_sweep().to_csv(index=False)))
    assert got["method"].tolist() == want["method"].tolist()
    assert got["params"].tolist() == want["params"].tolist()
    pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=0, atol=1e-12)


#: families the app offered that are a parameter of another now (pinned key → its new key,
#: the link's and the spec's changes): the old link opens the same view, read through the
#: alias with one note that names the new spelling
RENAMED = {"fixed:none": ("window:none", {"method": "window"},
                          {"method": "window", "params": {"window": 0}}),
           "distance-floor:budget": (f"{FLOORED}:budget", {"method": "distance", "floor": "12"},
                                     {"method": "distance:budget"})}


def test_app_links_unchanged() -> None:
    pinned = json.loads(LINKS_JSON.read_text())
    want = {key: entry for key, entry in pinned.items() if key not in RENAMED}
    for old, (new, link, spec) in RENAMED.items():
        want[new] = {"link": {**pinned[old]["link"], **link},
                     "spec": {**pinned[old]["spec"], **spec}}
    got = json.loads(json.dumps(current_links()))
    assert got == want
    for key, entry in pinned.items():  # each pinned link still opens the same view
        state, problems = parse_view_state(entry["link"])
        if key in RENAMED:
            old = entry["link"]["method"]
            assert len(problems) == 1 and f"method={old!r} is an old name" in problems[0]
        else:
            assert problems == []
        new = RENAMED[key][0] if key in RENAMED else key
        assert view_state_to_params(state) == want[new]["link"]
        spec = to_spec(state)
        assert {"method": spec.method_id, "params": spec.param_dict,
                "window": spec.window} == want[new]["spec"]


if __name__ == "__main__":  # writes the fixtures (run on the code whose behaviour is pinned)
    DATA.mkdir(exist_ok=True)
    current_sweep().to_csv(SWEEP_CSV, index=False)
    LINKS_JSON.write_text(json.dumps(current_links(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SWEEP_CSV} and {LINKS_JSON}", file=sys.stderr)
