"""The Pareto page's view-model: which curves it draws, how a clicked point becomes a view
state, and how its tables and "not swept" note read.

Forty curves on one chart are unreadable, so the page draws a curated few by default
(:data:`DEFAULT_CURVES`: the best calibrated method, the paper's Sparsefinder, three cheap
patterns and top-k by exact scores as a reference) and adds whole groups on request
(:data:`PAGE_GROUPS`, kept in the link as ``curves=group,group``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from sparsefinder.evaluation.curves import (
    CURVES,
    GROUPS,
    curve_display_name,
    curve_name,
    curve_spec,
)
from sparsefinder.explore.app_methods import APP_CALIBRATIONS, controls
from sparsefinder.explore.state import WINDOW_CHOICES
from sparsefinder.methods.registry import METHODS

#: Drawn by default: the app's default method (calibrated distance with a per-row floor) and
#: the calibrated distance alone, the paper's Sparsefinder (distance, alone and with a window
#: of 3), three baselines, top-k by exact scores (a reference).
DEFAULT_CURVES: tuple[str, ...] = (
    "distance-floor:budget", "distance:budget", "distance", "distance+window",
    "window", "bigbird", "longformer", "topk",
)
#: Curves that see the exact scores (they save no work): drawn as bounds, not as methods.
ORACLES = frozenset({"topk", "topp"})
#: Query parameter of the groups added to the default curves.
GROUPS_PARAM = "curves"
MISSING = "–"


def _page_groups() -> dict[str, tuple[str, ...]]:
    block = tuple(grid.name for grid in METHODS["block"].grids)  # learned=True's too
    groups = {
        "sparsefinder": (*GROUPS["sparsefinder"], "kmeans-top2", "kmeans-top2+window",
                         "distance-fine"),
        "calibrated": tuple(GROUPS["calibrated"]),
        "baselines": tuple(GROUPS["baselines"]),
        "long-context": tuple(GROUPS["long-context"]),
        "block": block,
    }
    grouped = {c for names in groups.values() for c in names}
    groups["other"] = tuple(c for c in CURVES if c not in grouped)
    return groups


#: Groups the page can add, each a tuple of curve names; "other" holds every curve no group
#: names, so every registered curve can be drawn.
PAGE_GROUPS: dict[str, tuple[str, ...]] = _page_groups()


def curve_label(curve: str) -> str:
    """The legend name of a curve: its display name, the one the menu, the CSVs and the CLI
    show (a reference computed from the exact scores says so: "Top-k by exact scores
    (reference)")."""
    return curve_display_name(curve)


def parse_groups(value: str | Sequence[str] | None) -> tuple[list[str], list[str]]:
    """The ``curves`` URL parameter → (known groups in :data:`PAGE_GROUPS` order, problems);
    an unknown name is dropped with a problem naming the choices (a link never raises)."""
    if value is not None and not isinstance(value, str):
        value = value[-1] if len(value) else None
    names = [s.strip() for s in (value or "").split(",") if s.strip()]
    unknown = [n for n in names if n not in PAGE_GROUPS]
    problems = [f"ignored URL parameter {GROUPS_PARAM}: unknown group(s) {', '.join(unknown)}; "
                f"choose from {', '.join(PAGE_GROUPS)}"] if unknown else []
    return [g for g in PAGE_GROUPS if g in names], problems


def chosen_curves(available: Iterable[str], groups: Sequence[str] = ()) -> list[str]:
    """The curves to draw: the default ones and those of ``groups``, among ``available`` (in
    registry order, so a curve keeps its place whatever is added)."""
    wanted = set(DEFAULT_CURVES).union(*(PAGE_GROUPS[g] for g in groups))
    return [c for c in available if c in wanted]


#: A ``--methods`` list longer than this many items is written ``all`` (one readable line).
MAX_COMMAND_ITEMS = 6


def _command_methods(names: Sequence[str]) -> str:
    """``--methods`` for ``names``: a CLI group stands for its curves when all are named, and
    a long list becomes ``all``."""
    left = list(names)
    parts: list[str] = []
    for group, members in GROUPS.items():
        if members and set(members) <= set(left):
            parts.append(group)
            left = [n for n in left if n not in members]
    items = [*parts, *left]
    return "all" if len(items) > MAX_COMMAND_ITEMS else ",".join(items)


def not_swept_line(skipped: Mapping[str, str]) -> str | None:
    """One line for the curves the app cannot sweep here, with the command that can; None
    when every curve runs."""
    if not skipped:
        return None
    reasons = list(skipped.values())
    needs = [need for need, hit in (
        ("learned projections", any("projections" in why for why in reasons)),
        ("train graphs", any("training" in why for why in reasons)),
        ("other projections", any("projections" not in why and "training" not in why
                                  for why in reasons)),
    ) if hit]
    count = f"{len(skipped)} method{'s' if len(skipped) > 1 else ''}"
    return (f"{count} not swept here (need {' or '.join(needs)}): run "
            f"`sparsefinder sweep --methods {_command_methods(list(skipped))} --out DIR`.")


def display_table(frame: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """A table as shown: numbers rounded to ``digits``, a missing value (None, NaN) as "–"."""
    def cell(value: Any) -> Any:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return MISSING
        if isinstance(value, float):
            return f"{value:.{digits}f}"
        return value

    return frame.astype(object).map(cell)


class NotInExplorer(ValueError):
    """A sweep point the Explorer's sliders cannot show (its message says why, in words)."""


def explorer_changes(curve: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`~sparsefinder.explore.state.ViewState` changes that show the sweep point
    ``(curve, params)`` in the Explorer: ``view.with_(**changes)`` then stands for the same
    predictor as :func:`~sparsefinder.evaluation.curves.curve_spec` (window and global tokens
    included). Raises :class:`NotInExplorer` for a point its sliders cannot reach."""
    spec = curve_spec(curve, dict(params))
    family, calibration, p = spec.method, spec.calibration, spec.param_dict
    name = curve_name(curve)
    changes: dict[str, Any] = {"window": spec.window, "global_tokens": spec.global_tokens}
    if family == "window" and calibration == "none":  # the app pins its own size to 0
        changes["window"] = int(p["window"])
    if changes["window"] not in WINDOW_CHOICES:
        raise NotInExplorer(f"{name}: the Explorer's window goes up to {WINDOW_CHOICES[-1]}, "
                            f"this point has {changes['window']}")
    offered = APP_CALIBRATIONS.get(family, ())
    form = dict(CURVES[curve_name(curve)].fixed)  # a form the family's sliders do not pick
    if form and offered:
        raise NotInExplorer(f"{name}: the Explorer offers {family} only in its plain form, "
                            f"not with {', '.join(f'{k}={v}' for k, v in form.items())}")
    if calibration not in offered:
        how = (f"only as {' / '.join(offered)}" if offered else "not at all")
        raise NotInExplorer(f"{name}: the Explorer offers {family} {how}")
    changes.update(method=family, calibration=calibration)
    if calibration != "none":
        changes["target_sparsity"] = float(p["target_sparsity"])
    else:  # the raw parameters: each control's value, in its state field or ``extra``
        extra: dict[str, Any] = {}
        for param, control in controls(family):
            value = param.kind(p[param.name])
            high = param.high if param.high is not None else param.app_high
            if high is not None and value > high:
                raise NotInExplorer(f"{name}: the Explorer's {param.name} goes up to "
                                    f"{high:g}, this point has {value:g}")
            if control.field:
                changes[control.field] = value
            else:
                extra[f"{family}.{param.name}"] = value
        if extra:
            changes["extra"] = tuple(sorted(extra.items()))
    return changes

