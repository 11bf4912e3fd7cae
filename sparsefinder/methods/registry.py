"""The method registry: what a predictor family is, and the table that names them.

This module holds no entries. Every built-in family is registered by one catalog module
(:mod:`sparsefinder.catalog`), loaded the first time the table is read, the way
transformers' auto mappings load a model family's module only when it is asked for. So the
registry sits low in the package (predictor specs, sweeps and calibration read it) while the
catalog, which needs the fitting code of every family, sits above all of them.

A family declares each parameter once (:class:`Param`: type, range, default, label, URL key),
in the spirit of scikit-learn's ``_parameter_constraints``; validation, sweep grids and the
app's controls read that one declaration.

Calibration is a way to *set* a family's parameters, not another family: ``distance`` with
``calibration="budget"`` takes a target sparsity and fits one threshold per head on TRAIN
graphs (:class:`Calibration`). A family with its calibration is written ``family:calibration``
(``distance:budget``; plain ``distance`` is ``calibration="none"``) in sweep curves, CSVs and
the app. The names of the time before (``distance-budget``, ``rowfrac-calibrated``, …) are
aliases (:func:`resolve_method`): accepted everywhere a method is named, with a
:class:`FutureWarning` naming the new spelling.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sparsefinder.methods.forms import INPUTS as INPUTS
from sparsefinder.methods.forms import BuildContext as BuildContext
from sparsefinder.methods.forms import Builder as Builder
from sparsefinder.methods.forms import Calibration as Calibration
from sparsefinder.methods.forms import Fitter as Fitter
from sparsefinder.methods.forms import Form as Form
from sparsefinder.methods.forms import Inputs as Inputs
from sparsefinder.methods.forms import Params as Params
from sparsefinder.methods.forms import Variant as Variant
from sparsefinder.methods.grids import APP_GROUPS as APP_GROUPS
from sparsefinder.methods.grids import TAGS as TAGS
from sparsefinder.methods.grids import WITH_WINDOW_SIZE as WITH_WINDOW_SIZE
from sparsefinder.methods.grids import AppHint as AppHint
from sparsefinder.methods.grids import SweepGrid as SweepGrid
from sparsefinder.methods.grids import check_tags, tagged_grid
from sparsefinder.methods.grids import sweep_grids as sweep_grids
from sparsefinder.methods.param import Param as Param
from sparsefinder.methods.parts import NEEDS as NEEDS
from sparsefinder.methods.parts import Parts as Parts
from sparsefinder.methods.parts import check_needs

#: The module that registers every built-in family (imported by name on first use).
CATALOG_MODULE = "sparsefinder.catalog"

#: The ways to set a family's parameters: ``none`` (the raw parameters), ``equal`` (each head
#: meets the target sparsity on its own), ``budget`` (the heads share a sparsity budget, the
#: mean recall highest) and ``recall`` (each head meets a target recall).
CALIBRATIONS: tuple[str, ...] = ("none", "equal", "budget", "recall")
CALIBRATION_LABELS: dict[str, str] = {
    "none": "raw parameters",
    "equal": "per head, equal target sparsity",
    "budget": "per head, sparsity budget across heads",
    "recall": "per head, target recall",
}


class MethodUnavailable(ValueError):
    """A method cannot be built here (e.g. the projections lack its k-means size, or its
    bundled codebooks are for another model); sweeps skip the point and record this reason."""


def method_id(family: str, calibration: str = "none") -> str:
    """The one spelling of a family under a calibration: ``distance``, ``distance:budget``."""
    return family if calibration == "none" else f"{family}:{calibration}"


@dataclass(frozen=True)
class Method:
    """One predictor family: its declared parameters, its builder and what it reads.

    ``inputs``: ``"projected"`` (the learned low-dimensional q/k: Sparsefinder, Reformer,
    Routing), ``"original"`` (the model's own q/k: oracles, Quest, routed k-means) or
    ``"shape"`` (only the sizes: window, Longformer, BigBird, static masks). ``fit`` runs once
    on training records; its result is handed to ``build`` in the :class:`Parts` field
    ``fits`` names. ``needs``: the learned parts ``build`` reads (among :data:`NEEDS`; None:
    every part at hand, for families that declare nothing).
    """

    name: str
    label: str
    params: tuple[Param | str, ...]
    build: Builder
    inputs: Inputs = "projected"
    fit: Fitter | None = None
    oracle: bool = False  # needs the full score matrix: shown as a bound, saves no work
    calibrations: tuple[Calibration, ...] = ()
    raw: bool = True  # False: only calibrated settings exist (``calibration="none"`` refused)
    #: the family's raw sweep curves (its calibrations' grids are added by :attr:`curves`)
    grids: tuple[SweepGrid, ...] = ()
    tags: tuple[str, ...] = ()  # among :data:`TAGS`
    app: AppHint | None = None  # None: the app does not offer the family
    needs: tuple[str, ...] | None = None
    fits: str = "fitted"
    #: the parameters that pick the form ``fit`` learns (passed to it by name: SparseBERT's
    #: ``kind``); a sweep fits once per curve, whose points share them
    fit_reads: tuple[str, ...] = ()
    forms: tuple[Form, ...] = ()  # raw forms picked by a parameter's value
    #: the raw settings its per-head ("budget") calibration picks from (calibration.grid)
    head_grid: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:
        check_needs(self.needs, self.fits)
        # a bare name declares a parameter without type or range (plug-ins, tests)
        params = tuple(p if isinstance(p, Param) else Param(p, object, 0) for p in self.params)
        object.__setattr__(self, "params", params)
        bad = [c.name for c in self.calibrations if c.name not in CALIBRATIONS[1:]]
        if bad:
            raise ValueError(f"calibrations must be among {CALIBRATIONS[1:]}, got {bad}")
        for tags in (self.tags, *(form.tags for form in self.forms)):
            check_tags(tags)

    @property
    def curves(self) -> tuple[SweepGrid, ...]:
        """Every sweep curve of the family: its raw grids (in the groups their form's tags
        imply, :func:`~sparsefinder.methods.grids.tagged_grid`), then one per calibration
        (``distance:budget``) over that calibration's targets, then its own calibrated grids."""
        own = tuple(g for g in self.grids if g.calibration != "none")
        raw = tuple(tagged_grid(g, self.tags_for({**(g.points[0] if g.points else {}),
                                                   **g.fixed})) for g in self.grids if g not in own)
        calibrated = tuple(SweepGrid(method_id(self.name, c.name), c.grid, c.name,
                                     groups=("calibrated",))
                           for c in self.calibrations if c.grid)
        return raw + calibrated + own

    @property
    def calibration_names(self) -> tuple[str, ...]:
        """The calibrations this family accepts (``none`` first when it has raw settings)."""
        return (("none",) if self.raw else ()) + tuple(c.name for c in self.calibrations)

    def variant(self, calibration: str = "none", params: Params | None = None) -> Variant:
        """Parameters, builder and fitter of this family under ``calibration`` (and, given
        ``params``, the :class:`Form` their values pick)."""
        if calibration == "none" and self.raw:
            form = self.form_of(params)
            if form is not None:
                return Variant(form.params, form.build, form.fit, form.needs, form.fits,
                               (), form.inputs)
            return Variant(self.params, self.build, self.fit, self.needs, self.fits,
                           self.fit_reads, self.inputs)
        for option in self.calibrations:
            if option.name == calibration:
                return Variant((option.target, *option.extra), option.build, option.fit,
                               option.needs, "calibration", (), self.inputs)
        raise ValueError(f"method {self.name!r} takes calibration "
                         f"{' / '.join(self.calibration_names)}, got {calibration!r}")

    def form_of(self, params: Params | None) -> Form | None:
        """The :class:`Form` the values of ``params`` pick (None: the plain form)."""
        declared = {p.name: p for p in self.params}
        return next((form for form in self.forms if params is not None
                     and params.get(form.param) is not None
                     and declared[form.param].coerce(params[form.param]) == form.value), None)

    def tags_for(self, params: Params | None = None) -> tuple[str, ...]:
        """The family's tags, and those of the form ``params`` pick."""
        form = self.form_of(params)
        return self.tags + tuple(t for t in (form.tags if form else ()) if t not in self.tags)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def needs_projections(self) -> bool:
        return self.inputs == "projected"

    def check_params(self, params: Params, calibration: str = "none") -> None:
        """Every declared parameter present (an optional one may be left out), none unknown,
        each within its declared range."""
        declared = self.variant(calibration, params).params
        names = [p.name for p in declared]
        missing = [p.name for p in declared if p.name not in params and not p.optional]
        unknown = [name for name in params if name not in names]
        shown = method_id(self.name, calibration)
        if missing or unknown:
            raise ValueError(f"method {shown!r} takes parameters {names}; "
                             f"missing {missing}, unknown {unknown}")
        for param in declared:
            if param.name not in params:
                continue
            try:
                param.check(params[param.name])
            except ValueError as error:
                raise ValueError(f"method {shown!r}: {error}") from None


class _Registry(Mapping[str, Method]):
    """Name → :class:`Method`; reading it the first time loads the built-in catalog."""

    def __init__(self) -> None:
        self._methods: dict[str, Method] = {}
        self._aliases: dict[str, tuple[str, str]] = {}
        self.alias_params: dict[str, dict[str, Any]] = {}  # old name → the params it fixes
        self._loaded = False
        #: called with (method, registered) on every later change: the sweep curves and
        #: groups follow a family registered after they were made
        self.listeners: list[Callable[[Method, bool], None]] = []

    def _table(self) -> dict[str, Method]:
        if not self._loaded:
            self._loaded = True  # set first: the catalog registers through this table
            importlib.import_module(CATALOG_MODULE)
        return self._methods

    def __getitem__(self, name: str) -> Method:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def add(self, method: Method, *, replace: bool) -> None:
        if method.name in self._table() and not replace:
            raise ValueError(f"method {method.name!r} is already registered; pass replace=True")
        self._methods[method.name] = method
        for listener in self.listeners:
            listener(method, True)

    def remove(self, name: str) -> Method:
        method = self._table().pop(name)
        for listener in self.listeners:
            listener(method, False)
        return method

    def aliases(self) -> dict[str, tuple[str, str]]:
        self._table()  # old name → (family, calibration)
        return self._aliases


#: The one table of predictor families, by name (filled by :mod:`sparsefinder.catalog`).
METHODS = _Registry()


def register_method(method: Method, *, replace: bool = False) -> Method:
    """Add a predictor family to :data:`METHODS` (e.g. a new baseline); returns it."""
    if method.inputs not in INPUTS:
        raise ValueError(f"inputs must be one of {INPUTS}, got {method.inputs!r}")
    if not method.name or "," in method.name or "+" in method.name:
        raise ValueError(f"method name must be non-empty without ',' or '+', got {method.name!r}")
    if method.app and set(method.app.calibrations) - set(method.calibration_names):
        raise ValueError(f"method {method.name!r}: the app offers calibrations "
                         f"{method.app.calibrations}, it takes {method.calibration_names}")
    METHODS.add(method, replace=replace)
    return method


def register_alias(old: str, family: str, calibration: str = "none",
                   params: Mapping[str, Any] | None = None) -> None:
    """Accept ``old`` (an old name; a form's: ``distance-nodiag`` is ``distance`` with
    ``diag=False``) for ``family`` under ``calibration`` with ``params``, noted when used."""
    METHODS.aliases()[old] = (family, calibration)
    METHODS.alias_params[old] = dict(params or {})


def alias_params(name: str) -> dict[str, Any]:
    """The parameters an old method name fixes (``distance-nodiag``: ``{"diag": False}``)."""
    METHODS.aliases()
    text = str(name).strip()  # a calibrated old name's own, else its family's
    return dict(METHODS.alias_params.get(text) or METHODS.alias_params.get(text.split(":")[0], {}))


def resolve_method(name: str, *, warn: bool = True) -> tuple[str, str]:
    """A method's name → ``(family, calibration)``.

    Accepts ``family``, ``family:calibration`` and the old aliases (a :class:`FutureWarning`
    names the new spelling unless ``warn`` is False); unknown names raise a ValueError listing
    the known ones.
    """
    text = str(name).strip()
    aliases = METHODS.aliases()
    base, _, written = text.partition(":")
    if text not in aliases and base in aliases and written:  # a form's old name, calibrated
        family, _ = aliases[base]
        text = method_id(family, written)
        if warn:
            _deprecated(base, family, "none")
    if text in aliases and text not in METHODS:
        family, calibration = aliases[text]
        if warn:
            _deprecated(text, family, calibration)
        return family, calibration
    family, _, calibration = text.partition(":")
    method = get_method(family)
    calibration = calibration or "none"
    if calibration not in method.calibration_names:
        raise ValueError(f"method {family!r} takes calibration "
                         f"{' / '.join(method.calibration_names)}, got {calibration!r}")
    return family, calibration


def _deprecated(old: str, family: str, calibration: str) -> None:
    fixed = METHODS.alias_params.get(old) or {}
    given = "".join(f", {k}={v!r}" for k, v in fixed.items())
    warnings.warn(f"method name {old!r} is deprecated; use {method_id(family, calibration)!r} "
                  f"(family {family!r}, calibration {calibration!r}{given})", FutureWarning,
                  stacklevel=4)


def method_ids() -> list[str]:
    """Every family under every calibration it takes, as written (``distance:budget``)."""
    return [method_id(name, c) for name, method in METHODS.items()
            for c in method.calibration_names]


def display_name(name: str, params: Params | None = None) -> str:
    """The one name a user reads for a method id (and ``params``) on every surface: the
    family's label with what its set parameters add (:attr:`Param.shown`), then how its
    parameters are set (``"Distance (t), per head, sparsity budget across heads"``); an old
    name (``distance-budget``, ``distance-floor``) reads as its new one with what it fixes."""
    family, calibration = resolve_method(name, warn=False)
    method, given = get_method(family), {**alias_params(name), **(params or {})}
    label = method.label + "".join(p.shown for p in method.params if p.shown and given.get(p.name))
    return label if calibration == "none" else f"{label}, {CALIBRATION_LABELS[calibration]}"


def unregister_method(name: str) -> Method:
    return METHODS.remove(name)  # (e.g. a plug-in a test added); returns it


def get_method(name: str) -> Method:
    """The registered method ``name``, or a ValueError listing the known ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; choose from: {', '.join(METHODS)}") from None
