"""The methods the app offers: families, the calibrations offered for each, the menu's groups,
and the controls generated from each family's declared parameters.

The view state (:mod:`.state`) stores a family and a calibration; every family gets its
sliders and link keys from its :class:`~sparsefinder.methods.registry.Param` declarations,
shown as its catalog entry's ``app`` hint says (:class:`~sparsefinder.methods.registry.AppHint`,
:func:`controls`), so a new family appears in the Explorer by its catalog entry.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sparsefinder.calibration.curves import (
    DEFAULT_FLOOR,
    DEFAULT_FLOOR_SHARE,
    FLOOR_CURVE,
    FLOOR_FORM,
)
from sparsefinder.methods.grids import Control
from sparsefinder.methods.registry import (
    APP_GROUPS,
    CALIBRATION_LABELS,
    METHODS,
    alias_params,
    display_name,
    method_id,
    resolve_method,
)

#: The app's first method: ``distance:budget`` with each row's ``DEFAULT_FLOOR`` nearest keys
#: (capped by ``DEFAULT_FLOOR_SHARE``), read from the bundled calibration table. The view
#: state holds it as ``method="distance"``, ``floor`` > 0 (link key ``floor``); among the
#: app's methods it is named as its sweep curve and table entry are (``FLOORED_ID``), and the
#: method menu lists it before plain ``distance`` (menu entry ``FLOORED``).
FLOORED, FLOORED_ID = "distance+floor", FLOOR_CURVE
FLOORED_PARAMS = {"floor": DEFAULT_FLOOR, "floor_share": DEFAULT_FLOOR_SHARE}


class _Offered(Mapping[str, tuple[str, ...]]):
    """Family → the calibrations the app offers for it (its default first), read from each
    family's :class:`~sparsefinder.methods.registry.AppHint` at every look-up, so a family
    registered later is in the menu too. Menu order: by group, the group's ``first`` family
    first, then in catalog order."""

    def _table(self) -> dict[str, tuple[str, ...]]:
        offered = [(APP_GROUPS.index(m.app.group), not m.app.first, i, name, m.app.calibrations)
                   for i, (name, m) in enumerate(METHODS.items()) if m.app is not None]
        return {name: calibrations for *_, name, calibrations in sorted(offered)}

    def __getitem__(self, family: str) -> tuple[str, ...]:
        return self._table()[family]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


class _Families(Sequence[str]):
    """The app's families as a live tuple (a family registered later is in it)."""

    def _names(self) -> tuple[str, ...]:
        return tuple(APP_CALIBRATIONS)

    def __getitem__(self, index: Any) -> Any:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()


#: Families the app's sliders drive, each with the calibrations the app offers for it, its
#: default first: ``budget`` reads the bundled calibration table (a target sparsity),
#: ``none`` the raw parameters. Declared by each catalog entry's ``app`` hint.
APP_CALIBRATIONS: Mapping[str, tuple[str, ...]] = _Offered()
APP_METHODS: Sequence[str] = _Families()


class _Groups(Mapping[str, tuple[str, ...]]):
    """The method menu's groups, in menu order → their families (empty groups left out)."""

    def _table(self) -> dict[str, tuple[str, ...]]:
        groups = {g: tuple(f for f in APP_CALIBRATIONS if METHODS[f].app.group == g)
                  for g in APP_GROUPS}
        return {g: names for g, names in groups.items() if names}

    def __getitem__(self, group: str) -> tuple[str, ...]:
        return self._table()[group]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


METHOD_GROUPS: Mapping[str, tuple[str, ...]] = _Groups()


def menu_entries() -> list[str]:
    """The method menu's entries in menu order: the families, with the floored distance
    (:data:`FLOORED`) before plain ``distance``."""
    families = [f for names in METHOD_GROUPS.values() for f in names]
    return [e for f in families for e in ((FLOORED, f) if f == "distance" else (f,))]


def menu_entry(state: Any) -> str:
    """The menu entry of a view state (its family; :data:`FLOORED` for the floored one)."""
    return FLOORED if state.method_id == FLOORED_ID else state.method


def entry_calibrations(entry: str) -> tuple[str, ...]:
    """The calibrations the app offers for a menu entry (the floored distance: budget)."""
    return ("budget",) if entry == FLOORED else APP_CALIBRATIONS[entry]


def entry_changes(entry: str) -> dict[str, Any]:
    """The view state fields a menu entry sets: its family, its default calibration, and
    for ``distance`` the floor (0 for plain distance)."""
    if entry == FLOORED:
        return {"method": "distance", "floor": DEFAULT_FLOOR, "calibration": "budget"}
    return {"method": entry, "calibration": APP_CALIBRATIONS[entry][0],
            **({"floor": 0} if entry == "distance" else {})}


def method_group(family: str) -> str:
    """The menu group of a family."""
    method = METHODS.get(family)
    return method.app.group if method is not None and method.app else "Other predictors"


def menu_label(family: str) -> str:
    """A menu entry as the method menu shows it: ``"Sparsefinder · Distance (t)"`` (its group,
    then its display name; the calibration radio below adds how its parameters are set)."""
    if family == FLOORED:
        return f"{method_group('distance')} · {display_name(FLOOR_FORM)}"
    return f"{method_group(family)} · {display_name(family)}"


def controls(family: str) -> tuple[tuple[Any, Any], ...]:
    """The app's sliders of ``family``'s raw form, as (declared ``Param``, its
    :class:`~sparsefinder.methods.grids.Control`) pairs: every declared parameter but one that
    picks a form of the family (``block``'s ``learned``: its plain form), one the app pins
    (``window``'s own size) and an optional one left out by default (``distance``'s floor)."""
    method = METHODS.get(family)
    if method is None or method.app is None:
        return ()
    hint = method.app
    return tuple((p, hint.params.get(p.name, Control())) for p in method.params
                 if not p.choices and p.name not in hint.pinned
                 and not (p.optional and p.default is None))


def generic_params(family: str) -> tuple[Any, ...]:
    """The declared parameters of ``family`` whose values live in the view state's ``extra``
    (every control without a state field of its own), under their ``url`` link keys."""
    return tuple(p for p, control in controls(family) if not control.field)


def field_controls() -> tuple[tuple[str, Any, Any], ...]:
    """(family, ``Param``, ``Control``) of every control held in a view-state field of its
    own, in catalog order (``kmeans``' B before its k, whose range reads B)."""
    return tuple((family, p, c) for family in METHODS for p, c in controls(family)
                 if c.field)


def pinned_params(family: str) -> dict[str, Any]:
    """The parameters the app holds at one value for ``family`` (no slider, no link key)."""
    method = METHODS.get(family)
    return dict(method.app.pinned) if method is not None and method.app else {}


def extra_value(state: Any, family: str, param: Any) -> Any:
    """The value of a generated control (the declared default until the user moves it)."""
    value = dict(state.extra).get(f"{family}.{param.name}", param.default)
    return param.kind(value) if param.kind in (int, float) else value


def with_extra(state: Any, family: str, name: str, value: Any) -> tuple:
    """``state.extra`` with one generated control of ``family`` set to ``value``."""
    extra = dict(state.extra)
    extra[f"{family}.{name}"] = value
    return tuple(sorted(extra.items()))


def method_label(method: str) -> str:
    """The display name of a family, or of a family with its calibration, e.g.
    ``"Distance (t)"``, ``"Distance (t), per head, sparsity budget across heads"``."""
    return display_name(method)


def shown(method: str) -> str:
    """A method in a message about a link: ``Distance (t) (`distance`)``: the name a user
    reads, and the id a link spells."""
    return f"{display_name(method)} (`{method}`)"


def calibration_label(calibration: str) -> str:
    """How a calibration sets the parameters, in words."""
    return CALIBRATION_LABELS[calibration]


def old_method_name(text: str, calibration: str | None = None
                    ) -> tuple[tuple[str, str], dict[str, Any], str] | None:
    """An old method name of a link (``distance-budget``; ``distance-floor`` with the link's
    ``calibration``) → ((family, calibration), the parameters it fixes, the note that says
    its new spelling); None when it is not one the app offers."""
    try:
        family, written = resolve_method(text, warn=False)
    except ValueError:
        return None
    held = {k: v for k, v in alias_params(text).items() if k == "floor"}  # the state holds
    if written == "none" and held:  # the floored distance: the app offered it calibrated
        written = calibration or "budget"
    if family not in APP_CALIBRATIONS or written not in APP_CALIBRATIONS[family]:
        return None
    keys = "".join(f"&{k}={v}" for k, v in held.items())
    new = method_id(family, written)
    label = display_name(method_id(text.split(":")[0], written) if held else new)
    return (family, written), held, (
        f"URL parameter method={text!r} is an old name: read as {label} (`{new}`), "
        f"method={family}&calibration={written}{keys}")


