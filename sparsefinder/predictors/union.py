"""Union of predictors (paper §4.7): add window/global edges to a learned pattern to
recover the local and positional connections it misses."""

from __future__ import annotations

import torch
from torch import Tensor

from sparsefinder.attention.masks import apply_causal
from sparsefinder.predictors.base import (
    Fittable,
    Predictor,
    SharedPattern,
    check_shapes,
    honours_window,
    owns_output,
)


class Union:
    """Edge iff at least one member predicts it (logical OR of the members' masks).

    It passes a local layer's ``sliding_window`` on to the members that honour it (a top-k
    in a union still spends its k keys inside the window); the others ignore it.
    """

    honours_window = True  # see base.WindowAware

    def __init__(self, *predictors: Predictor) -> None:
        if not predictors:
            raise ValueError("Union needs at least one predictor, e.g. Union(KMeans(), Window(3))")
        for p in predictors:
            if not isinstance(p, Predictor):
                raise TypeError(
                    f"Union members must have a predict(q, k, causal=...) method; got {p!r}"
                )
        self.predictors: tuple[Predictor, ...] = tuple(predictors)

    def __repr__(self) -> str:
        return f"Union({', '.join(repr(p) for p in self.predictors)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Union) and self.predictors == other.predictors

    __hash__ = None  # mutable container, like the dataclass members

    def fit(self, q: Tensor, k: Tensor) -> Union:
        """Fits every :class:`Fittable` member (e.g. KMeans); others are left as they are."""
        for p in self.predictors:
            if isinstance(p, Fittable):
                p.fit(q, k)
        return self

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False,
                sliding_window: int | None = None) -> Tensor:
        """q: (heads, n, r), k: (heads, m, r) → bool (heads, n, m)."""
        check_shapes(q, k)
        n, m = q.shape[1], k.shape[1]
        # SharedPattern members (Window, GlobalTokens) are OR-ed as one (n, m) mask and
        # broadcast, instead of each allocating a (heads, n, m) copy: on CPU, fresh large
        # buffers cost page faults on every call.
        shared: Tensor | None = None
        per_head: list[Predictor] = []
        for p in self.predictors:
            if isinstance(p, SharedPattern):
                pattern = p.shared_pattern(n, m, q.device)
                shared = pattern if shared is None else shared | pattern
            else:
                per_head.append(p)
        if shared is not None:
            shared = apply_causal(shared, causal)
        if not per_head:
            return shared.expand(q.shape[0], -1, -1).contiguous()
        # Members get ``causal`` themselves: a member's causal pattern need not be its
        # non-causal pattern with the future cut off (e.g. a top-k over allowed keys only).
        masks = (p.predict(q, k, causal=causal, sliding_window=sliding_window)
                 if sliding_window and honours_window(p) else p.predict(q, k, causal=causal)
                 for p in per_head)
        mask = next(masks)
        # Write into the first member's output only if it promises a fresh tensor (FreshOutput;
        # all the built-in predictors do): one fewer (heads, n, m) allocation per call.
        # Otherwise the first OR allocates, so a member's output is never modified.
        owned = owns_output(per_head[0])
        for other in masks if shared is None else (shared, *masks):
            if owned:
                mask |= other
            else:
                mask, owned = mask | other, True
        return mask


def reads_shapes_only(predictor: Predictor) -> bool:
    """Whether ``predictor`` is a :class:`SharedPattern` or a union of only such (its mask
    is the same for every head and reads no q/k value)."""
    members = predictor.predictors if isinstance(predictor, Union) else (predictor,)
    return all(isinstance(p, SharedPattern) for p in members)


def shared_union(predictor: Predictor, n: int, m: int,
                 device: torch.device | None = None) -> Tensor | None:
    """The bool (n, m) pattern, before any causal or window cut, that every head of a
    predictor reading only shapes (see :func:`reads_shapes_only`) predicts, else None:
    ``predict(q, k, causal=c)`` is this pattern cut by ``apply_causal(..., c)`` for every
    head. A caller may broadcast it over the heads instead of building a (heads, n, m)
    copy: the same values, without n² work per head. A fresh tensor."""
    if not reads_shapes_only(predictor):
        return None
    members = predictor.predictors if isinstance(predictor, Union) else (predictor,)
    pattern = members[0].shared_pattern(n, m, device)
    for member in members[1:]:
        pattern = pattern | member.shared_pattern(n, m, device)
    return pattern
