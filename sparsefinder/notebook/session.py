"""The Explorer's core without a browser app: one model, one text, one setting at a time.

It runs the same calls as the app's Explorer (:mod:`sparsefinder.explore.live`: clamp the
view state, build the spec, predict, score, summarise) and draws the same figures
(:mod:`sparsefinder.figures`), so a setting shows the same numbers in a notebook as in the
app. No widget library is imported here: :mod:`.widget` adds the live controls.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import plotly.graph_objects as go

from sparsefinder.explore import live, tables
from sparsefinder.explore import prepared as prep
from sparsefinder.explore.availability import available_methods
from sparsefinder.explore.inputs import extract_one
from sparsefinder.explore.state import ViewState
from sparsefinder.figures import graphs
from sparsefinder.learned_parts import LearnedParts
from sparsefinder.methods.registry import alias_params, resolve_method

#: Target sparsities offered when the model has no calibration table (a raw method's own
#: parameters are then at their defaults; the target only drives calibrated methods).
DEFAULT_TARGETS = (0.8, 0.85, 0.9, 0.95)


def _parts_for(model_id: str) -> tuple[Any, LearnedParts]:
    """(projections, learned parts) for ``model_id``: the bundled ones for the default
    model, a prepared bundle's (`sparsefinder prepare`) for another, else none."""
    parts = LearnedParts.bundled(model_id)
    return parts.calibration_projections, parts


@dataclass
class ExploreSession:
    """A prepared text of a loaded model and the view state the controls set."""

    loaded: Any
    text: str
    prepared: prep.PreparedText
    state: ViewState
    notes: list[str] = field(default_factory=list)
    _preds: Any = None
    _scores: Any = None

    @property
    def methods(self) -> list[str]:
        """Methods that run on this text, written with their calibration."""
        return available_methods(self.prepared)

    @property
    def targets(self) -> list[float]:
        table = self.prepared.calibration
        return [float(t) for t in table.targets] if table is not None else list(DEFAULT_TARGETS)

    @property
    def labels(self) -> list[str]:
        return self.prepared.record.tokens

    def update(self, **changes: Any) -> ExploreSession:
        """Set ``method`` (written, e.g. ``distance:budget``), ``target_sparsity`` (or
        ``target``, the link's name), ``layer`` or ``head``; the prediction reruns only when
        the method or target changed."""
        if "target" in changes:
            changes["target_sparsity"] = changes.pop("target")
        method = changes.pop("method", None)
        if method is not None:  # the floored distance is named as its curve: its floor
            family, calibration = resolve_method(method, warn=False)
            floor = alias_params(method).get("floor", 0) if family == "distance" else None
            changes.update(method=family, calibration=calibration,
                           **({} if floor is None else {"floor": floor}))
        state, notes = live.clamp(replace(self.state, **changes), self.prepared)
        if (state.method_id, state.target_sparsity) != (self.state.method_id,
                                                       self.state.target_sparsity):
            self._preds = self._scores = None
        self.state, self.notes = state, notes
        return self

    def _run(self) -> None:
        if self._preds is None:
            spec = live.spec_for(self.state, self.prepared)
            self._preds = live.predict(self.prepared, spec)
            self._scores = live.score(self.prepared, self._preds)

    def summary(self) -> dict[str, live.Summary]:
        """Head, layer and model recall/sparsity of the current setting."""
        self._run()
        return live.summarize(self._scores, self.state.layer, self.state.head)

    def headline(self) -> str:
        model = self.summary()["model"]
        spec = live.spec_for(self.state, self.prepared)
        return (f"{live.describe(spec)} · recall {model.recall:.3f} · sparsity "
                f"{model.sparsity:.3f} (gold {model.gold_sparsity:.3f}) · "
                f"{self.loaded.model_id}, {self.prepared.n_tokens} tokens")

    def head_figure(self) -> go.Figure:
        """Gold | predicted | diff of the selected head."""
        self._run()
        layer, head = self.state.layer, self.state.head
        gold = self.prepared.record.layers[layer].gold_of(head)
        pred = self._preds[layer][head]
        codes = tables.diff_codes(pred, gold)
        return graphs.head_figure(gold.cpu().numpy(), pred.cpu().numpy(), codes, self.labels,
                                  f"L{layer}H{head}", tables.diff_counts(codes))

    def grid_figure(self, metric: str = "recall") -> go.Figure:
        """Every head's ``metric`` (layers x heads); the selected head outlined."""
        self._run()
        values = getattr(self._scores, metric).numpy()
        return graphs.overview_figure(values, metric, (self.state.layer, self.state.head),
                                      live.softmax_layers(self._scores))


def open_session(model_or_id: Any, text: str, alpha: float | None = None,
                 device: str = "cpu") -> ExploreSession:
    """Load ``model_or_id`` (a name for ``load_model`` or a loaded model) and prepare
    ``text``: gold graphs, projections and calibration when the model has them."""
    from sparsefinder.models.loading import LoadedModel, load_model

    if not isinstance(text, str) or not text.strip():
        raise ValueError("text is empty; pass the text to explore, e.g. explore('default', "
                         "'The cat sat on the mat.')")
    loaded = (model_or_id if isinstance(model_or_id, LoadedModel)
              else load_model(str(model_or_id), alpha=alpha, device=device))
    record, notes = extract_one(loaded, text)
    projections, parts = _parts_for(loaded.model_id)
    # no threshold/bins sliders here: skip their ranges (the bins' default predicts every
    # layer at every bin count, most of a first render)
    prepared = prep.prepare(record, projections, notes, t_range=False,
                            calibration=parts.calibration,
                            calibration_projections=parts.calibration_projections,
                            hash_codes=parts.hash_codes)
    state, more = live.clamp(ViewState(), prepared)
    session = ExploreSession(loaded=loaded, text=text, prepared=prepared, state=state,
                             notes=[*notes, *more])
    if state.method_id not in session.methods:  # no calibration: a training-free method
        session.update(method=session.methods[0])
    return session
