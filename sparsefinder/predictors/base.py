"""The interface every graph predictor shares (scikit-learn spirit), declared in one place.

Shapes: ``q`` is ``(heads, n, r)`` and ``k`` is ``(heads, m, r)`` — projected (or original)
queries/keys of one text (no padding inside; a record is one text). ``predict`` returns a bool
mask ``(heads, n, m)`` where True means "this query–key pair is kept". With ``causal=True``
the future (``masks.causal_mask``) is always False.

Besides :class:`Predictor`, a predictor may declare optional parts, each a protocol that
:class:`~sparsefinder.predictors.union.Union` and the sweeps rely on (no ``getattr`` probing):

- :class:`SharedPattern`: the mask is the same for every head and does not read q/k values
  (``shared_pattern(n, m, device) -> (n, m)``), so a union can OR one (n, m) mask instead of a
  (heads, n, m) copy;
- :class:`Fittable`: ``fit(...)`` learns from training data and returns self (KMeans from
  projected vectors ``fit(q, k)``, SparseBERT's StaticMask from gold graphs);
- :class:`FreshOutput`: ``returns_fresh_mask`` is True when ``predict`` always returns a new
  tensor the caller owns, so a union may OR the other members into it in place;
- :class:`WindowAware`: ``honours_window`` is True when ``predict`` takes
  ``sliding_window=`` and spends a per-row budget (top-k, a keep fraction, pages) only on the
  keys a local layer can attend to; other predictors are cut to the window afterwards, which
  changes nothing for a threshold but would waste a budget on impossible keys.
"""

from __future__ import annotations

from typing import Any, Protocol, Self, runtime_checkable

import torch
from torch import Tensor


@runtime_checkable
class Predictor(Protocol):
    """Predicts an attention graph from (projected) queries and keys."""

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m)."""
        ...


@runtime_checkable
class SharedPattern(Protocol):
    """A head-independent pattern that reads only the sizes (window, global tokens)."""

    def shared_pattern(self, n: int, m: int, device: torch.device | None = None) -> Tensor:
        """Bool (n, m), the same for every head, before any causal cut."""
        ...


@runtime_checkable
class Fittable(Protocol):
    """A predictor that learns from training data (k-means centroids, static masks)."""

    def fit(self, *args: Any, **kwargs: Any) -> Self:
        """Learn from training data → self, fitted (attributes ending in ``_``)."""
        ...


@runtime_checkable
class FreshOutput(Protocol):
    """``returns_fresh_mask``: ``predict`` returns a new tensor that the caller may modify."""

    returns_fresh_mask: bool


@runtime_checkable
class WindowAware(Protocol):
    """``honours_window``: ``predict(q, k, causal=..., sliding_window=w)`` chooses inside the
    local window (see the module docstring)."""

    honours_window: bool


def honours_window(predictor: object) -> bool:
    """Whether ``predictor.predict`` takes ``sliding_window=`` (see :class:`WindowAware`)."""
    return isinstance(predictor, WindowAware) and bool(predictor.honours_window)


def owns_output(predictor: object) -> bool:
    """Whether ``predictor.predict`` promises a fresh tensor (see :class:`FreshOutput`)."""
    return isinstance(predictor, FreshOutput) and bool(predictor.returns_fresh_mask)


def check_shapes(q: Tensor, k: Tensor) -> None:
    """Fail early with a message naming the bad input, not deep inside a matmul."""
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(
            f"expected q (heads, n, r) and k (heads, m, r), got shapes {tuple(q.shape)} "
            f"and {tuple(k.shape)}; add a leading heads axis for a single head"
        )
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree on heads and dimension"
        )


def check_ints(owner: object, lows: dict[str, int]) -> None:
    """Raise a ValueError naming the first of ``owner``'s fields (in ``lows``' order) that is
    not an integer (bools excluded) at least its bound: one message for every predictor."""
    for name, low in lows.items():
        value = getattr(owner, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
