"""sparsefinder.explore: prepared texts (no Streamlit)."""

from __future__ import annotations

from sparsefinder.explore import prepared as prep


def test_round_up_and_distance_range(prepared):
    assert prep._round_up(0.37) == 0.5 and prep._round_up(3.2) == 5.0
    assert prep._round_up(10.0) == 10.0
    assert prepared.t_max > 0
