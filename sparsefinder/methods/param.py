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

    ``low``/``high`` are inclusive bounds (None: unbounded); ``low_open`` makes ``low``
    exclusive (a share in (0, 1]). ``url`` is the short query-parameter name of the app's
    links; ``label`` what a slider or a table header shows; ``app_high`` the largest value the
    app's slider offers where ``high`` is unbounded (its useful region on 512-token texts).
    ``optional``: the parameter may be left out (or given as None, the same setting), which
    means the family works without it; its ``default`` may then be None.
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
    app_high: float | None = None
    optional: bool = False

    def describe(self) -> str:
        """The allowed values in words, e.g. ``"an integer >= 1"``."""
        what = "an integer" if self.kind is int else "a number"
        if self.low is not None and self.high is not None:
            left = "(" if self.low_open else "["
            return f"{what} in {left}{_fmt(self.low)}, {_fmt(self.high)}]"
        if self.low is not None:
            return f"{what} {'>' if self.low_open else '>='} {_fmt(self.low)}"
        if self.high is not None:
            return f"{what} <= {_fmt(self.high)}"
        return what

    def check(self, value: Any) -> None:
        """Raise a ValueError naming the parameter, the allowed values and the bad value."""
        if self.kind is object or (value is None and self.optional):
            return
        number = value
        if isinstance(value, str):  # builders coerce; a link or a CSV gives text
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
            ok = number <= self.high
        if not ok:
            raise ValueError(f"{self.name} must be {self.describe()}, got {value!r}")


def _fmt(value: float) -> str:
    return f"{value:g}"
