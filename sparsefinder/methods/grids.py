"""What a family declares besides its parameters: its sweep curves (:class:`SweepGrid`) and
how the app offers it (:class:`AppHint`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

#: The window united with each point of a family's ``+window`` sweep curves (``distance+window``).
WITH_WINDOW_SIZE = 3


@dataclass(frozen=True)
class SweepGrid:
    """One named sweep curve of a family: its grid of parameter dicts, under ``calibration``
    (a calibrated grid's points are targets), each point united with ``Window(window)`` when
    ``window`` > 0; ``groups``: the ``--methods`` groups that list it (``sparsefinder``,
    ``baselines``, ``long-context``; a calibration's grid is in ``calibrated``). ``fixed``:
    parameters every point has that the curve's name says (the form of the family:
    ``sparsebert-dams`` is ``kind="structured"``); a sweep's ``params`` column leaves them
    out, so it reads as it did when the form was a family of its own."""

    name: str
    points: tuple[Mapping[str, Any], ...]
    calibration: str = "none"
    window: int = 0
    groups: tuple[str, ...] = ()
    fixed: Mapping[str, Any] = field(default_factory=dict)


#: What a family (or a form of it) may be tagged with: ``cheap`` (no learned part, nothing
#: fitted), ``oracle`` (reads the full score matrix: a bound, saves no work), ``baseline`` (a
#: method of another paper), ``long-context`` (made for texts longer than the model's window).
TAGS: tuple[str, ...] = ("cheap", "oracle", "baseline", "long-context")
#: The ``--methods`` group a tag puts a raw curve in, whatever the curve declares (so a form
#: tagged long-context is listed with the long-context methods without saying so twice).
TAG_GROUPS: dict[str, str] = {"long-context": "long-context"}


def check_tags(tags: Sequence[str]) -> None:
    """A ValueError naming the unknown tags and the known ones."""
    if set(tags) - set(TAGS):
        raise ValueError(f"tags must be among {TAGS}, got {sorted(set(tags) - set(TAGS))}")


def tagged_grid(grid: SweepGrid, tags: Sequence[str]) -> SweepGrid:
    """``grid`` also in the groups its family's (or form's) ``tags`` imply (:data:`TAG_GROUPS`)."""
    extra = tuple(TAG_GROUPS[t] for t in tags if t in TAG_GROUPS
                  and TAG_GROUPS[t] not in grid.groups)
    return replace(grid, groups=grid.groups + extra) if extra else grid


def sweep_grids(name: str, points: Sequence[Mapping[str, Any]], *, window: bool = False,
                groups: tuple[str, ...] = (),
                fixed: Mapping[str, Any] | None = None) -> tuple[SweepGrid, ...]:
    """The curve ``name`` over ``points`` (each with ``fixed``), and with ``window`` its
    ``name+window`` twin (each point united with a window of :data:`WITH_WINDOW_SIZE`)."""
    grid = SweepGrid(name, tuple(points), groups=groups, fixed=dict(fixed or {}))
    if not window:
        return (grid,)
    return grid, SweepGrid(f"{name}+window", grid.points, window=WITH_WINDOW_SIZE, groups=groups,
                           fixed=grid.fixed)


#: The groups of the app's method menu, in menu order.
APP_GROUPS: tuple[str, ...] = ("Sparsefinder", "Other predictors", "Fixed patterns",
                               "Oracles (bounds)")


@dataclass(frozen=True)
class Control:
    """How the app shows one declared parameter of a family (every field may be left out:
    a slider over the ``Param``'s own range, label and help, its value in the link under the
    ``Param``'s ``url`` key).

    ``field``: the :class:`~sparsefinder.explore.state.ViewState` field that holds the value
    (the paper's families: their link keys ``t``, ``beta``, ``B``, ``k``, ``pages``, ``hd`` are
    in every link); empty: the state's per-family ``extra`` values. ``label`` / ``help``: the
    slider's words, where they say more than the ``Param``'s. ``range`` and ``default`` name a
    text-dependent hook of the app (``sparsefinder.explore.text_ranges``): the slider's range
    (e.g. the text's distance quantiles; the centroid counts the projections hold) and the
    value a text opens on (e.g. the β nearest the text's gold sparsity)."""

    field: str = ""
    label: str = ""
    help: str = ""
    range: str = ""
    default: str = ""


@dataclass(frozen=True)
class AppHint:
    """How the app offers a family: its menu ``group`` (one of :data:`APP_GROUPS`), the
    ``calibrations`` it offers (its default first), and ``first``: shown first in its group
    (the app's default method). Every family's sliders and link keys are generated from its
    declared parameters, shown as ``params`` says (:class:`Control`); whether it runs on a
    text is learned by building it at the values its sliders open on, with the parts it
    declared. ``pinned``: parameters the app holds at one value, without a
    slider or a link key (``window``'s own size is 0: the app's window control, united with
    every method, sets the window)."""

    group: str
    calibrations: tuple[str, ...] = ("none",)
    first: bool = False
    pinned: Mapping[str, Any] = field(default_factory=dict)
    #: how the app shows each parameter (by name; one left out: a plain generated slider)
    params: Mapping[str, Control] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.group not in APP_GROUPS:
            raise ValueError(f"app group must be one of {APP_GROUPS}, got {self.group!r}")
