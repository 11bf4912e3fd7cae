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


def _halves(rows: list[tuple[int, float | None, float, float, float, float, float]]
            ) -> pd.DataFrame:
    """(m, c, target, short sparsity, short cosine, long sparsity, long cosine) rows, as the
    tool writes them with ``--lengths`` (20 texts in each half)."""
    short = _table([(m, c, t, s, cos) for m, c, t, s, cos, _, _ in rows]).assign(
        texts="short", n_texts=20)
    long = _table([(m, c, t, s, cos) for m, c, t, _, _, s, cos in rows]).assign(
        texts="long", n_texts=20)
    return pd.concat([short, long], ignore_index=True)


def test_with_length_halves_a_level_counts_only_where_both_halves_reach_it() -> None:
    rows = [
        # the uncapped floor: fine on long texts, too dense for 0.95 on short ones
        (5, None, 0.75, 0.75, 0.999, 0.75, 0.999), (5, None, 0.9, 0.90, 0.99, 0.90, 0.99),
        (5, None, 0.95, 0.93, 0.99, 0.967, 0.97),
        (8, 1.0, 0.75, 0.75, 0.998, 0.75, 0.998), (8, 1.0, 0.9, 0.90, 0.98, 0.90, 0.98),
        (8, 1.0, 0.95, 0.95, 0.90, 0.95, 0.96),
    ]
    result = choose_floor.choose(_halves(rows), TARGETS)
    assert result["winners"] == {0.75: (5, 0.0), 0.9: (5, 0.0), 0.95: (8, 1.0)}
    assert result["qualify_all"] == [(8, 1.0)]
    assert result["chosen"] == (8, 1.0) and result["how"] == "best mean"
    # pooled over all the texts alone (the short half's 0.93 averaged away) the uncapped
    # floor would have qualified at 0.95 and won it
    pooled = _table([(m, c, t, (s1 + s2) / 2, (c1 + c2) / 2)
                     for m, c, t, s1, c1, s2, c2 in rows])
    assert choose_floor.choose(pooled, TARGETS)["winners"][0.95] == (5, 0.0)


def test_the_halves_cosine_is_weighted_by_their_text_counts() -> None:
    rows = [(m, None, t, t, cs, t, cl) for m, cs, cl in [(4, 0.90, 1.00), (5, 1.00, 0.94)]
            for t in TARGETS]
    table = _halves(rows)
    table.loc[table["texts"] == "long", "n_texts"] = 60  # three times the short half
    # m = 4: (20 · 0.90 + 60 · 1.00) / 80 = 0.975; m = 5: (20 · 1.00 + 60 · 0.94) / 80 = 0.955
    assert choose_floor.choose(table, TARGETS)["chosen"] == (4, 0.0)
    table["n_texts"] = 20  # equal halves: 0.95 against 0.97
    assert choose_floor.choose(table, TARGETS)["chosen"] == (5, 0.0)


def test_the_slack_is_a_parameter() -> None:
    rows = [(5, None, t, t - 0.004, 0.99) for t in TARGETS]
    assert choose_floor.choose(_table(rows), TARGETS)["chosen"] == (5, 0.0)
    assert choose_floor.choose(_table(rows), TARGETS, slack=0.002)["chosen"] is None
