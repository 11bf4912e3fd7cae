"""The Explorer on a SparseModernBERT-like model: its softmax layers are named in the grid."""

from __future__ import annotations

from apptest_helpers import assert_clean, figures, new_app


def test_softmax_layers_are_grey_and_named_in_the_overview(sparse_modernbert_dir,
                                                           without_projections):
    at = new_app(model=str(sparse_modernbert_dir), method="window", window="3").run()
    assert_clean(at)
    assert any("L1, L2 ran softmax (α = 1)" in c.value for c in at.caption)
    grids = [f for f in figures(at)
             if "L1 softmax" in list(f["layout"].get("yaxis", {}).get("ticktext", []))]
    assert len(grids) == 1
    assert list(grids[0]["layout"]["yaxis"]["ticktext"]) == ["L0", "L1 softmax",
                                                            "L2 softmax", "L3"]
