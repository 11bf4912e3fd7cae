"""Sweep curves: the named hyperparameter grids of the registered families (paper §5–6).

A *curve* (:data:`CURVES`) is a grid over one predictor family of the method registry: a list
of :class:`~sparsefinder.methods.spec.PredictorSpec`, e.g. ``distance`` (the thresholds) or
``distance+window`` (the same ∪ a window of 3). Each family declares its curves in its catalog
entry (:attr:`Method.grids <sparsefinder.methods.registry.Method>`, with why each grid is what
it is, and one curve per calibration over its targets); this module only loops over
:data:`~sparsefinder.methods.registry.METHODS`, and follows a family registered later.
:func:`register_curve` adds a grid that is no family's own (a tool's narrower targets).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sparsefinder.methods.registry import (
    METHODS,
    Method,
    display_name,
    method_id,
    resolve_method,
)
from sparsefinder.methods.registry import WITH_WINDOW_SIZE as WITH_WINDOW_SIZE
from sparsefinder.methods.spec import PredictorSpec
from sparsefinder.projections.heads import HeadProjections

Params = dict[str, Any]


@dataclass(frozen=True)
class Curve:
    """A named grid of specs over one method (all share the method, so its inputs/fit)."""

    name: str
    specs: tuple[PredictorSpec, ...]
    #: parameters every point has that the curve's name says (not in a sweep's ``params``)
    fixed: tuple[tuple[str, Any], ...] = ()

    @property
    def method(self) -> str:
        """The family with its calibration, e.g. ``distance`` or ``distance:budget``."""
        return self.specs[0].method_id

    @property
    def needs_projections(self) -> bool:
        return self.specs[0].needs_projections

    @property
    def needs_training(self) -> bool:
        return self.specs[0].needs_training


#: Sweepable curves by name (``<method>`` and ``<method>+window`` variants, baselines…).
CURVES: dict[str, Curve] = {}


#: Named groups for ``--methods`` (each curve's declared groups); "all" is every curve.
GROUPS: dict[str, list[str]] = {}


def register_curve(name: str, method: str, grid: Iterable[Params], *, window: int = 0,
                   replace: bool = False, fixed: Params | None = None) -> Curve:
    """Add a sweep curve: ``method`` (a :data:`sparsefinder.methods.spec.METHODS` key) over
    ``grid``,
    each point united with ``Window(window)`` when ``window`` > 0; returns it."""
    if not name or "," in name:
        raise ValueError(f"curve name must be non-empty without commas, got {name!r}")
    if name in CURVES and not replace:
        raise ValueError(f"curve {name!r} is already registered; pass replace=True")
    fixed = dict(fixed or {})
    specs = tuple(PredictorSpec.of(method, {**fixed, **p}, window=window) for p in grid)
    if not specs:
        raise ValueError(f"curve {name!r} needs at least one parameter dict in its grid")
    CURVES[name] = Curve(name, specs, tuple(sorted(fixed.items())))
    return CURVES[name]


def _family_curves(method: Method, registered: bool = True) -> None:
    """Register (or, ``registered`` False, drop) the sweep curves a family declares."""
    for grid in method.curves:
        if not registered:
            CURVES.pop(grid.name, None)
            for names in GROUPS.values():
                if grid.name in names:
                    names.remove(grid.name)
            continue
        register_curve(grid.name, method_id(method.name, grid.calibration), grid.points,
                       window=grid.window, replace=True, fixed=grid.fixed)
        for group in grid.groups:
            names = GROUPS.setdefault(group, [])
            if grid.name not in names:
                names.append(grid.name)


def _register_defaults() -> None:
    for group in ("sparsefinder", "baselines", "long-context", "calibrated"):
        GROUPS.setdefault(group, [])
    for method in METHODS.values():
        _family_curves(method)
    if _family_curves not in METHODS.listeners:  # a family registered later gets its curves
        METHODS.listeners.append(_family_curves)


_register_defaults()
#: Keys per Quest page of its sweep curve (the declared default page size).
QUEST_PAGE = int(next(p.default for p in METHODS["quest"].params if p.name == "page_size"))


def curve_name(name: str) -> str:
    """A curve's name, with a curve named by an old method name (``distance-budget``) renamed
    to its family and calibration (``distance:budget``) and a FutureWarning saying so."""
    if name in CURVES:
        return name
    family, calibration = resolve_method(name)  # warns on an old name; raises on unknown
    return method_id(family, calibration)


def curve_display_name(name: str) -> str:
    """What a user reads for a curve: its method's :func:`display_name`, plus what sets the
    curve apart when it is not the method alone (``+ window 3``, or its own name, e.g.
    ``· kmeans-top2``). A name that is no curve is read as a method id, and one that is
    neither (a plug-in's curve in an old table) stays as it is."""
    curve = CURVES.get(name)
    if curve is None:
        try:
            return display_name(name)
        except ValueError:
            return name
    label = display_name(curve.method, curve.specs[0].param_dict)
    window = curve.specs[0].window
    if name == curve.method or (label != display_name(curve.method) and _names(name, curve)):
        return label  # (a form's old name, ``distance-floor:budget``: what its label says)
    base = name.removesuffix("+window")
    if base != name and window:  # the same curve united with a window
        return f"{curve_display_name(base) if base in CURVES else label} + window {window}"
    return f"{label} · {name}"


def _names(name: str, curve: Curve) -> bool:
    """Whether ``name`` is an old name of the curve's method (its form, its params set)."""
    try:
        return method_id(*resolve_method(name, warn=False)) == curve.method
    except ValueError:
        return False


def shown_params(name: str, spec: PredictorSpec) -> str:
    """The ``params`` column of a sweep row of curve ``name``: the spec's parameters less those
    the curve's name says (so a form's rows read as when it was a family of its own)."""
    curve = CURVES.get(name)
    return spec.params_json(omit=[k for k, _ in curve.fixed] if curve else ())


def with_labels(frame: Any) -> Any:
    """A sweep table with a last column ``label``: each row's :func:`curve_display_name`
    (the columns before it stay as they were, so older readers keep working)."""
    if "method" not in frame or "label" in frame:
        return frame
    return frame.assign(label=frame["method"].map(curve_display_name))


def resolve_methods(spec: str | Sequence[str]) -> list[str]:
    """``"sparsefinder"``, ``"all"`` or a comma list (groups allowed) → curve names; an old
    method name (``distance-budget``) is read as its new one (``distance:budget``)."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for item in (s.strip() for s in items):
        if not item:
            continue
        if item != "all" and item not in GROUPS and item not in CURVES:
            with contextlib.suppress(ValueError):  # unknown: reported below with the names
                item = curve_name(item)
        expanded = list(CURVES) if item == "all" else GROUPS.get(item, [item])
        for name in expanded:
            if name not in CURVES:
                known = ", ".join(["all", *GROUPS, *CURVES])
                raise ValueError(f"unknown method {name!r}; choose from: {known}")
            if name not in names:
                names.append(name)
    if not names:
        raise ValueError("no methods given; use 'sparsefinder', 'all' or a comma list")
    return names


def available_curves(projections: HeadProjections | None,
                     names: Sequence[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """Curves that can run with these projections, and why the others cannot.

    A curve is skipped when it needs projections and there are none, when it is learned from
    training graphs (the app has none at hand), or when a grid point cannot be built (e.g.
    k-means centroids for a B the file does not hold).
    """
    available: list[str] = []
    skipped: dict[str, str] = {}
    for name in names if names is not None else CURVES:
        curve = CURVES[name]
        if curve.needs_projections and projections is None:
            skipped[name] = "needs learned projections"
            continue
        if curve.needs_training:
            skipped[name] = "learned from training graphs (sparsefinder sweep --train-passages)"
            continue
        try:
            for spec in curve.specs:
                spec.build(projections, 0)
        except (ValueError, KeyError, RuntimeError) as error:
            skipped[name] = str(error).split(";")[0]
            continue
        available.append(name)
    return available, skipped


def curve_spec(name: str, params: Params) -> PredictorSpec:
    """The spec of curve ``name`` at ``params`` (a sweep row → the setting it stands for)."""
    curve = CURVES[curve_name(name)]
    first = curve.specs[0]
    return PredictorSpec.of(first.method, {**dict(curve.fixed), **params}, window=first.window,
                            global_tokens=first.global_tokens, calibration=first.calibration)
