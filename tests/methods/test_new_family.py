"""A new family is one predictor plus one registry entry: with no other edit it is in the app's
menu and links, the CLI's sweep curves and groups, and the docs table; unregistered, it is
gone from all of them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from sparsefinder.attention.masks import causal_mask
from sparsefinder.evaluation.curves import CURVES, GROUPS, resolve_methods
from sparsefinder.explore import app_methods
from sparsefinder.explore.state import ViewState, parse_view_state, to_spec, view_state_to_params
from sparsefinder.methods.docs_table import families_table
from sparsefinder.methods.registry import (
    AppHint,
    Method,
    Param,
    register_method,
    sweep_grids,
    unregister_method,
)
from sparsefinder.methods.spec import PredictorSpec


@dataclass
class EveryStride:
    """The toy family's predictor (its "one file"): key j is kept when ``j % stride == 0``."""

    stride: int

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        keep = (torch.arange(k.shape[1]) % self.stride == 0).expand(q.shape[0], q.shape[1], -1)
        return keep & causal_mask(q.shape[1], k.shape[1]) if causal else keep.clone()


STRIDE = Param("stride", int, 4, low=1, high=64, label="stride", url="stride")
TOY = Method("toy-stride", "Every s-th key (toy)", (STRIDE,),
             lambda p, c: EveryStride(int(p["stride"])), inputs="shape", tags=("cheap",),
             grids=sweep_grids("toy-stride", [{"stride": s} for s in (2, 4, 8)], window=True,
                               groups=("baselines",)),
             app=AppHint("Fixed patterns"))


@pytest.fixture
def toy():
    register_method(TOY)
    try:
        yield TOY
    finally:
        unregister_method(TOY.name)


def test_new_family_is_everywhere_with_one_entry(toy) -> None:
    # the CLI's sweep curves and groups
    assert resolve_methods("toy-stride,toy-stride+window") == ["toy-stride", "toy-stride+window"]
    assert [s.param_dict for s in CURVES["toy-stride"].specs] == [{"stride": s} for s in (2, 4, 8)]
    assert CURVES["toy-stride+window"].specs[0].window == 3
    assert {"toy-stride", "toy-stride+window"} <= set(GROUPS["baselines"])
    # the app's menu, its generated slider's parameter and its link
    assert "toy-stride" in app_methods.METHOD_GROUPS["Fixed patterns"]
    assert app_methods.APP_CALIBRATIONS["toy-stride"] == ("none",)
    assert app_methods.generic_params("toy-stride") == (STRIDE,)
    state = ViewState(method="toy-stride", calibration="none",
                      extra=(("toy-stride.stride", 8),))
    link = view_state_to_params(state)
    assert link["method"] == "toy-stride" and link["stride"] == "8"
    back, problems = parse_view_state(link)
    assert problems == [] and back == state
    assert to_spec(back) == PredictorSpec.of("toy-stride", {"stride": 8})
    bad, problems = parse_view_state({**link, "stride": "65"})
    assert len(problems) == 1 and "stride" in problems[0]  # the declared range, checked once
    # the docs table
    assert "| `toy-stride` | Every s-th key (toy) (cheap) |" in families_table()
    # and it predicts
    q = torch.zeros(2, 6, 4)
    mask = to_spec(back).build(None, 0).predict(q, q, causal=True)
    assert mask[0, 5].tolist() == [True, False, False, False, False, False]


def test_an_unregistered_family_is_gone_everywhere(toy) -> None:
    unregister_method(toy.name)
    try:
        assert "toy-stride" not in CURVES and "toy-stride+window" not in GROUPS["baselines"]
        assert "toy-stride" not in app_methods.APP_METHODS
        assert "toy-stride" not in families_table()
    finally:
        register_method(toy)  # the fixture unregisters it again
