"""What a predictor family is made of besides its parameters: how a layer's predictor is built
(:class:`BuildContext`, ``Builder``, ``Fitter``), the ways to calibrate it
(:class:`Calibration`), the forms a parameter's value picks (:class:`Form`), and the
:class:`Variant` one setting resolves to. :class:`~sparsefinder.methods.registry.Method`
holds them; this module only declares them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from sparsefinder.methods.param import Param
from sparsefinder.methods.parts import Parts

if TYPE_CHECKING:
    from sparsefinder.data.records import AttentionRecord
    from sparsefinder.predictors.base import Predictor
    from sparsefinder.projections.heads import HeadProjections

Inputs = Literal["projected", "original", "shape"]
INPUTS: tuple[str, ...] = ("projected", "original", "shape")
Params = Mapping[str, Any]


@dataclass(frozen=True)
class BuildContext:
    """What a method's ``build`` may use besides its parameters: ``parts``, the learned parts
    its family declared (:class:`Parts`), and ``layer``, which seeds the random baselines
    (``seed = layer``) and selects per-layer learned parts."""

    parts: Parts
    layer: int

    @property
    def projections(self) -> HeadProjections | None:
        return self.parts.projections

    @property
    def fitted(self) -> Any:
        """What the family's own ``fit`` returned (:attr:`Parts.fitted`)."""
        return self.parts.fitted


Builder = Callable[[Params, BuildContext], "Predictor | None"]
Fitter = Callable[[Sequence["AttentionRecord"]], Any]


@dataclass(frozen=True)
class Calibration:
    """One way (``name``, one of
    :data:`~sparsefinder.methods.registry.CALIBRATIONS` but ``none``) to set a family's
    parameters per head from a ``target`` fitted on TRAIN graphs: ``fit`` runs once on the
    training records, ``build`` makes a layer's predictor from its result. ``extra``: the
    family's parameters that are given with the target, not fitted (e.g. a floor of keys
    per row)."""

    name: str
    target: Param
    fit: Fitter
    build: Builder
    label: str = ""
    extra: tuple[Param, ...] = ()
    #: the sweep's targets (each point: the target's name, and the ``extra`` at their default)
    grid: tuple[Mapping[str, Any], ...] = ()
    #: the learned parts its build reads (its fit makes ``calibration``)
    needs: tuple[str, ...] = ("projections", "calibration")


@dataclass(frozen=True)
class Variant:
    """What a family under one calibration takes and does: its parameters, ``build``, ``fit``,
    the parts ``build`` reads and the one ``fit`` makes."""

    params: tuple[Param, ...]
    build: Builder
    fit: Fitter | None
    needs: tuple[str, ...] | None = None
    fits: str = "fitted"
    fit_reads: tuple[str, ...] = ()
    inputs: Inputs = "projected"


@dataclass(frozen=True)
class Form:
    """A form of a family picked by one parameter's value (``block`` with ``learned=True``:
    blocks scored by projections learned on pooled blocks) that takes, reads, needs and fits
    other things than the family's plain form: a family, not a family per form, still.
    ``tags``: what the form is besides the family's tags (``select="keys"``: long-context)."""

    param: str
    value: Any
    params: tuple[Param, ...]
    build: Builder
    inputs: Inputs
    fit: Fitter | None = None
    needs: tuple[str, ...] | None = None
    fits: str = "fitted"
    tags: tuple[str, ...] = ()
