"""The methods the app offers: families, the calibrations offered for each, the menu's groups,
and the controls generated from each family's declared parameters.

The view state (:mod:`.state`) stores a family and a calibration; the families listed in
:data:`GENERIC_FAMILIES` get their sliders and link keys from their
:class:`~sparsefinder.methods.registry.Param` declarations, so a new baseline appears in the
Explorer by being listed here.
"""

from __future__ import annotations

from typing import Any

from sparsefinder.methods.registry import (
    CALIBRATION_LABELS,
    METHODS,
    display_name,
    method_id,
    resolve_method,
)

#: Families the app's sliders drive (keys of the one registry,
#: :data:`sparsefinder.methods.registry.METHODS`), each with the calibrations the app offers
#: for it, its default first: ``budget`` reads the bundled calibration table (a target
#: sparsity), ``none`` the raw parameters.
APP_CALIBRATIONS: dict[str, tuple[str, ...]] = {
    "distance-floor": ("budget",),
    "distance": ("budget", "none"),
    "quantization": ("none",),
    "kmeans": ("none",),
    "rowfrac": ("budget", "none"),
    "kmeans-routed": ("budget",),
    "hashattention": ("none",),
    "quest": ("none",),
    "block": ("none",),
    "fixed": ("none",),
    "longformer": ("none",),
    "bigbird": ("none",),
    "reformer": ("none",),
    "routing": ("none",),
    "topk": ("none",),
    "topp": ("none",),
}
APP_METHODS: tuple[str, ...] = tuple(APP_CALIBRATIONS)
#: The method menu's groups, in menu order (families not listed: "Other predictors").
METHOD_GROUPS: dict[str, tuple[str, ...]] = {
    "Sparsefinder": ("distance-floor", "distance", "quantization", "kmeans", "rowfrac"),
    "Other predictors": ("kmeans-routed", "hashattention", "quest", "block"),
    "Fixed patterns": ("fixed", "longformer", "bigbird", "reformer", "routing"),
    "Oracles (bounds)": ("topk", "topp"),
}
#: Families whose controls are generated from their declared parameters
#: (:class:`~sparsefinder.methods.registry.Param`): their values live in
#: ``ViewState.extra`` and in the link under each parameter's ``url`` key.
GENERIC_FAMILIES: tuple[str, ...] = ("block", "longformer", "bigbird", "reformer", "routing",
                                     "topk", "topp", "rowfrac")


def method_group(family: str) -> str:
    """The menu group of a family."""
    return next((g for g, names in METHOD_GROUPS.items() if family in names),
                "Other predictors")


def menu_label(family: str) -> str:
    """A family as the method menu shows it: ``"Sparsefinder · Distance (t)"`` (its group,
    then its display name; the calibration radio below adds how its parameters are set)."""
    return f"{method_group(family)} · {display_name(family)}"


def generic_params(family: str) -> tuple[Any, ...]:
    """The declared raw parameters of a family whose controls are generated."""
    return METHODS[family].params if family in GENERIC_FAMILIES else ()


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


def old_method_name(text: str) -> tuple[tuple[str, str], str] | None:
    """An old method name of a link (``distance-budget``) → ((family, calibration), the note
    that says its new spelling); None when it is not one the app offers."""
    try:
        family, calibration = resolve_method(text, warn=False)
    except ValueError:
        return None
    if family not in APP_CALIBRATIONS or calibration not in APP_CALIBRATIONS[family]:
        return None
    return (family, calibration), (
        f"URL parameter method={text!r} is an old name: read as "
        f"{shown(method_id(family, calibration))}, method={family}&calibration={calibration}")


