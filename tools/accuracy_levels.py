"""``sparsefinder sweep`` with the calibrated curves' targets narrowed to the levels read.

The accuracy table reads each method at sparsity 0.75 / 0.90 / 0.95 (the configuration with
the highest output cosine at that sparsity or sparser). A calibrated curve sweeps 28 targets;
on a CPU each is one restricted run of the model over every text. This runs the same command
(``sparsefinder.cli.main``, same files and tables) with each calibrated curve's grid cut to
the targets at and just above the levels (``--levels-targets``), and optionally adds
``distance:budget`` curves at other floors (``--floors 1,2,8``: curves named
``distance-floor:budget@mN``; ``M:C`` adds the floor M capped at ``floor_share`` C, named
``distance-floor:budget@mMcC``; report them all, the floor of the sweep's own curve is the
one chosen on train).

    PYTHONPATH=$PWD .venv/bin/python tools/accuracy_levels.py --floors 2,8 -- sweep \\
        --split validation --train-passages 100 --methods distance:budget,topk ... --accuracy
"""

from __future__ import annotations

import argparse
import sys

from sparsefinder.cli import main
from sparsefinder.evaluation.curves import CURVES, GROUPS, register_curve

TARGETS = "0.75,0.76,0.77,0.9,0.91,0.92,0.95,0.96,0.97"


def narrow(targets: list[float], floors: list[int | tuple[int, float]]) -> list[str]:
    """Re-register every calibrated sparsity curve with only ``targets``; add floor curves
    (a floor m, or (m, c): m capped at ``floor_share`` c)."""
    added = []
    for name, curve in list(CURVES.items()):
        first = curve.specs[0]
        if first.calibration == "none" or "target_sparsity" not in first.param_dict:
            continue
        grid = [s.param_dict for s in curve.specs if s.param_dict["target_sparsity"] in targets]
        register_curve(name, first.method_id, grid, window=first.window, replace=True)
    for floor in floors:
        m, c = floor if isinstance(floor, tuple) else (floor, None)
        name = f"distance-floor:budget@m{m}" + ("" if c is None else f"c{c:g}")
        share = {} if c is None else {"floor_share": c}
        register_curve(name, "distance:budget",
                       [{"target_sparsity": t, "floor": m, **share} for t in targets],
                       replace=True)
        added.append(name)
    GROUPS["floors"] = added
    return added


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--levels-targets", default=TARGETS)
    parser.add_argument("--floors", default="")
    own, rest = parser.parse_known_args()
    narrow([float(t) for t in own.levels_targets.split(",")],
           [(int(f.split(":")[0]), float(f.split(":")[1])) if ":" in f else int(f)
            for f in own.floors.split(",") if f])
    sys.exit(main([a for a in rest if a != "--"]))
