"""A family's sweep curves, declared in its catalog entry (:class:`SweepGrid`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The window united with each point of a family's ``+window`` sweep curves (``distance+window``).
WITH_WINDOW_SIZE = 3


@dataclass(frozen=True)
class SweepGrid:
    """One named sweep curve of a family: its grid of parameter dicts, under ``calibration``
    (a calibrated grid's points are targets), each point united with ``Window(window)`` when
    ``window`` > 0; ``groups``: the ``--methods`` groups that list it (``sparsefinder``,
    ``baselines``, ``long-context``; a calibration's grid is in ``calibrated``)."""

    name: str
    points: tuple[Mapping[str, Any], ...]
    calibration: str = "none"
    window: int = 0
    groups: tuple[str, ...] = ()


def sweep_grids(name: str, points: Sequence[Mapping[str, Any]], *, window: bool = False,
                groups: tuple[str, ...] = ()) -> tuple[SweepGrid, ...]:
    """The curve ``name`` over ``points``, and with ``window`` its ``name+window`` twin (each
    point united with a window of :data:`WITH_WINDOW_SIZE`)."""
    grid = SweepGrid(name, tuple(points), groups=groups)
    if not window:
        return (grid,)
    return grid, SweepGrid(f"{name}+window", grid.points, window=WITH_WINDOW_SIZE, groups=groups)
