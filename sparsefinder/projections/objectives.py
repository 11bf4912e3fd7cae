"""The projection objectives by name, and one entry point: :func:`fit_projections`.

- ``"paper"``: the Eq. 7 hinge (:func:`~sparsefinder.projections.hinge.train_projections`);
- ``"logistic"``: pointwise logistic with a per-head bias
  (:func:`~sparsefinder.projections.logistic.train_logistic`);
- ``"lowrank"``: training-free rank-``r`` approximation of each head's scores
  (:func:`~sparsefinder.projections.lowrank.fit_lowrank`);
- ``"lowrank-logistic"``: that fit refined with a logistic loss
  (:func:`~sparsefinder.projections.bilinear.fit_lowrank_logistic`);
- ``"lowrank-mass"``: the same refinement with each gold edge weighted by its entmax
  probability, so the heavy keys of a row count most
  (:func:`~sparsefinder.projections.bilinear.fit_lowrank_mass`);
- ``"lowrank-pairwise"``: that objective plus a mass-weighted pairwise term, each gold edge
  ahead of its row's non-edges (:func:`~sparsefinder.projections.bilinear.fit_lowrank_pairwise`);
- ``"lowrank-listwise"``: ``lowrank-mass`` plus a listwise term, the gold entmax distribution
  against a softmax over each row's (sampled) logits
  (:func:`~sparsefinder.projections.bilinear.fit_lowrank_listwise`).

The learned ones run on :class:`~sparsefinder.training.Trainer`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparsefinder.data.records import AttentionRecord
from sparsefinder.projections.bilinear import (
    fit_lowrank_listwise,
    fit_lowrank_logistic,
    fit_lowrank_mass,
    fit_lowrank_pairwise,
    refine_lowrank,
)
from sparsefinder.projections.heads import HeadProjections
from sparsefinder.projections.hinge import train_projections
from sparsefinder.projections.logistic import train_logistic
from sparsefinder.projections.lowrank import fit_lowrank


@dataclass(frozen=True)
class ProjectionObjective:
    """A named way to obtain projections: its fit function and the defaults it differs in.

    ``forwards_to``: functions ``fit`` passes its other keyword arguments on to (their
    keywords count as the objective's hyperparameters too)."""

    name: str
    fit: Callable[..., HeadProjections]
    description: str
    defaults: dict[str, Any] = field(default_factory=dict)
    forwards_to: tuple[Callable[..., Any], ...] = ()

    @property
    def hyperparameters(self) -> frozenset[str]:
        """The keyword arguments the objective takes (beyond the records)."""
        return frozenset().union(*(_keywords(f) for f in (self.fit, *self.forwards_to)))


def _keywords(function: Callable[..., Any]) -> frozenset[str]:
    return frozenset(name for name, p in inspect.signature(function).parameters.items()
                     if p.kind is inspect.Parameter.KEYWORD_ONLY)


OBJECTIVES: dict[str, ProjectionObjective] = {
    objective.name: objective for objective in (
        ProjectionObjective("paper", train_projections, "Eq. 7 hinge"),
        ProjectionObjective("logistic", train_logistic,
                            "pointwise logistic with a per-head bias"),
        ProjectionObjective("lowrank", fit_lowrank,
                            "training-free rank-r approximation of each head's scores"),
        ProjectionObjective("lowrank-logistic", fit_lowrank_logistic,
                            "lowrank refined with a logistic loss", defaults={"lr": 3e-3},
                            forwards_to=(refine_lowrank,)),
        ProjectionObjective("lowrank-mass", fit_lowrank_mass,
                            "lowrank refined with a logistic loss, gold edges weighted by "
                            "their entmax probability", defaults={"lr": 3e-3},
                            forwards_to=(fit_lowrank_logistic, refine_lowrank)),
        ProjectionObjective("lowrank-pairwise", fit_lowrank_pairwise,
                            "lowrank-mass plus a mass-weighted pairwise term: each gold edge "
                            "ahead of its row's non-edges", defaults={"lr": 3e-3},
                            forwards_to=(fit_lowrank_logistic, refine_lowrank)),
        ProjectionObjective("lowrank-listwise", fit_lowrank_listwise,
                            "lowrank-mass plus a listwise term: the gold entmax distribution "
                            "against a softmax over each row's logits", defaults={"lr": 3e-3},
                            forwards_to=(fit_lowrank_logistic, refine_lowrank)),
    )
}
_ALL = frozenset().union(*(o.hyperparameters for o in OBJECTIVES.values()))


def fit_projections(records: Sequence[AttentionRecord], objective: str = "paper",
                    **hyperparameters: Any) -> HeadProjections:
    """Projections of every head from TRAIN ``records`` with the named objective.

    ``hyperparameters`` (rank, lr, epochs, margin, …, model_id, alpha, progress) go to the
    objective's fit function; those only OTHER objectives take (e.g. ``margin`` for
    ``logistic``) are ignored, so one set of options serves every objective, and a value of
    None means the objective's default (``lr``: 0.01, 0.003 for ``lowrank-logistic``). A name
    no objective takes is a TypeError. ``metadata["objective"]`` records the choice.
    """
    chosen = _get(objective)
    unknown = sorted(set(hyperparameters) - _ALL)
    if unknown:
        raise TypeError(f"fit_projections() got unknown hyperparameters {unknown}; the "
                        f"objectives take {sorted(_ALL)}")
    wanted = chosen.hyperparameters
    kwargs = {**chosen.defaults, **{name: value for name, value in hyperparameters.items()
                                    if name in wanted and value is not None}}
    return chosen.fit(records, **kwargs)


def _get(objective: str) -> ProjectionObjective:
    try:
        return OBJECTIVES[objective]
    except KeyError:
        raise ValueError(f"unknown objective {objective!r}; choose one of "
                         f"{', '.join(OBJECTIVES)}") from None
