"""tools/choose_floor.py: the rule that reads its train table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd

TOOL = Path(__file__).resolve().parents[2] / "tools" / "choose_floor.py"
spec = importlib.util.spec_from_file_location("choose_floor", TOOL)
choose_floor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(choose_floor)

TARGETS = [0.75, 0.9, 0.95]


def _table(rows: list[tuple[int, float | None, float, float, float]]) -> pd.DataFrame:
    """(m, c or None, target, in-run sparsity, output cosine) rows, as the tool writes them."""
    out = []
    for m, c, t, s, cos in rows:
        params = {"floor": m, "target_sparsity": t, **({} if c is None else {"floor_share": c})}
        out.append({"method": choose_floor.curve_name(m, c), "params": json.dumps(params),
                    "sparsity": s, "output_cosine": cos})
    out.append({"method": "distance:budget@train", "params": json.dumps({"target_sparsity": 0.9}),
                "sparsity": 0.9, "output_cosine": 1.0})
    return pd.DataFrame(out)


def test_one_setting_winning_every_level_is_chosen() -> None:
    table = _table([
        (5, None, 0.75, 0.75, 0.990), (5, None, 0.9, 0.90, 0.950), (5, None, 0.95, 0.94, 0.99),
        (4, 0.5, 0.75, 0.75, 0.991), (4, 0.5, 0.9, 0.897, 0.960), (4, 0.5, 0.95, 0.95, 0.93),
    ])
    # the uncapped floor is 0.01 below 0.95 (out): the capped one wins every level
    result = choose_floor.choose(table, TARGETS)
    assert result["winners"] == {0.75: (4, 0.5), 0.9: (4, 0.5), 0.95: (4, 0.5)}
    assert result["chosen"] == (4, 0.5) and result["how"] == "one winner at every level"
    assert "m = 4, c = 0.5 (one winner at every level)" in choose_floor.describe(result)


def test_else_the_best_mean_among_the_settings_qualifying_everywhere() -> None:
    table = _table([
        (5, None, 0.75, 0.75, 0.990), (5, None, 0.9, 0.90, 0.950), (5, None, 0.95, 0.95, 0.90),
        (4, 0.5, 0.75, 0.75, 0.991), (4, 0.5, 0.9, 0.897, 0.960), (4, 0.5, 0.95, 0.95, 0.93),
        (8, 1.0, 0.75, 0.75, 0.999), (8, 1.0, 0.9, 0.894, 0.990), (8, 1.0, 0.95, 0.95, 0.94),
    ])
    # m = 8 wins 0.75 but is 0.006 below 0.90 (out there): no single winner; of the two
    # settings qualifying everywhere, m = 4, c = 0.5 has the higher mean
    result = choose_floor.choose(table, TARGETS)
    assert result["winners"] == {0.75: (8, 1.0), 0.9: (4, 0.5), 0.95: (8, 1.0)}
    assert result["qualify_all"] == [(5, 0.0), (4, 0.5)]
    assert result["chosen"] == (4, 0.5) and result["how"] == "best mean"


def test_ties_go_to_the_uncapped_reference_then_the_smaller_setting() -> None:
    rows = [(m, c, t, t, 0.99) for m, c in [(6, 0.5), (5, None), (4, 1.0), (4, 0.5)]
            for t in TARGETS]
    result = choose_floor.choose(_table(rows), TARGETS)
    assert result["chosen"] == (5, 0.0)
    assert "m = 5, uncapped" in choose_floor.describe(result)
    rows = [r for r in rows if r[1] is not None]
    assert choose_floor.choose(_table(rows), TARGETS)["chosen"] == (4, 0.5)


def test_a_level_no_setting_reaches() -> None:
    table = _table([(5, None, t, t - 0.02, 0.99) for t in TARGETS])
    result = choose_floor.choose(table, TARGETS)
    assert result["winners"] == {0.75: None, 0.9: None, 0.95: None}
    assert result["chosen"] is None


def test_the_markdown_table() -> None:
    table = _table([(5, None, t, t, 0.99) for t in TARGETS]
                   + [(4, 0.5, t, t, 0.98) for t in TARGETS])
    text = choose_floor.table(table, TARGETS)
    assert "| 5 | — | 0.9900 (0.7500) | 0.9900 (0.9000) | 0.9900 (0.9500) |" in text
    assert "| 4 | 0.5 | 0.9800 (0.7500)" in text
    assert "| `distance:budget` | — | — | 1.0000 (0.9000) | — |" in text
