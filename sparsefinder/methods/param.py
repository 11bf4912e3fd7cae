"""One hyperparameter of a predictor family, declared once: :class:`Param`.

Validation, sweep grids, the app's sliders and link fields read this one declaration, in the
spirit of scikit-learn's ``_parameter_constraints``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Param:
    """One hyperparameter of a family, declared once.

    ``low``/``high`` are inclusive bounds (None: unbounded); ``low_open`` / ``high_open`` make
    them exclusive (a share in (0, 1]; a target in (0, 1)). ``url`` is the short
    query-parameter name of the app's links; ``label`` what a slider or a table header shows;
    ``app_high`` the largest value the app's slider offers where ``high`` is unbounded (its
    useful region on 512-token texts).
    ``optional``: the parameter may be left out (or given as None, the same setting), which
    means the family works without it; its ``default`` may then be None. ``choices``: the
    values a parameter that picks a form of the family takes (``diag``: True / False,
    ``kind``: ``"structured"`` / ``"unstructured"``); a link or a CSV may give them as text.
    ``shown``: what the family's display name adds when the parameter is set (not 0 or None):
    the floor of ``distance`` reads ``"Distance (t) ∪ nearest keys per row (floor m)"``.
    """

    name: str
    kind: type  # int or float; object: undeclared (any value, e.g. a plug-in's own)
    default: float | None
    low: float | None = None
    high: float | None = None
    label: str = ""
    url: str = ""
    help: str = ""
    low_open: bool = False
    high_open: bool = False
    app_high: float | None = None
    optional: bool = False
    choices: tuple[Any, ...] = ()
    shown: str = ""

    def coerce(self, value: Any) -> Any:
        """``value`` as one of :attr:`choices` (text from a link or a CSV: ``"false"`` is
        False); other parameters' values as they are."""
        if not self.choices or value in self.choices and type(value) is type(self.choices[0]):
            return value
        text = str(value).strip().lower()
        for choice in self.choices:
            if text == str(choice).lower() or (isinstance(choice, bool)
                                               and text == str(int(choice))):
                return choice
        raise ValueError(f"{self.name} must be {self.describe()}, got {value!r}")

    def describe(self) -> str:
        """The allowed values in words, e.g. ``"an integer >= 1"``."""
        if self.choices:
            return "one of " + " / ".join(str(c) for c in self.choices)
        what = "an integer" if self.kind is int else "a number"
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"{what} in {left}{_fmt(self.low)}, {_fmt(self.high)}{right}"
        if self.low is not None:
            return f"{what} {'>' if self.low_open else '>='} {_fmt(self.low)}"
        if self.high is not None:
            return f"{what} {'<' if self.high_open else '<='} {_fmt(self.high)}"
        return what

    def check(self, value: Any, *, text: bool = True) -> None:
        """Raise a ValueError naming the parameter, the allowed values and the bad value
        (``text`` False: a number is wanted, not its text: a library call, not a link)."""
        if self.kind is object or (value is None and self.optional):
            return
        if self.choices:
            self.coerce(value)
            return
        number = value
        if isinstance(value, str) and text:  # builders coerce; a link or a CSV gives text
            try:
                number = float(value)
            except ValueError:
                number = None
        ok = isinstance(number, int | float) and not isinstance(number, bool)
        if ok and isinstance(number, float):
            ok = math.isfinite(number) and (self.kind is float or number.is_integer())
        if ok and self.low is not None:
            ok = number > self.low if self.low_open else number >= self.low
        if ok and self.high is not None:
            ok = number < self.high if self.high_open else number <= self.high
        if not ok:
            raise ValueError(f"{self.name} must be {self.describe()}, got {value!r}")


def _fmt(value: float) -> str:
    return f"{value:g}"


#: The target of every calibration, declared once: the catalog's calibrated forms, the
#: calibration estimators, the per-head grids and the app's link (URL key ``target``) all
#: check it here. 0 keeps every pair and 1 none, so neither is a target.
TARGET_SPARSITY = Param("target_sparsity", float, 0.9, low=0.0, high=1.0, low_open=True,
                        high_open=True, label="target sparsity", url="target")
TARGET_RECALL = Param("target_recall", float, 0.9, low=0.0, high=1.0, low_open=True,
                      high_open=True, label="target recall", url="target")
