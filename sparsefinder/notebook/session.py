"""What the notebook explorer computes, without any widget: a model, one prepared text, and
the gold / predicted / diff graphs and scores of a setting.

It is the app's live path (:mod:`sparsefinder.explore.live`), called the same way: the text is
prepared once (the model runs once), and a control move only predicts and scores, so a
notebook shows the numbers the app and the sweeps show for the same setting.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import plotly.graph_objects as go
from torch import Tensor

from sparsefinder.bundle import BundleError, bundle
from sparsefinder.explore import inputs, live, tables
from sparsefinder.explore import prepared as prep
from sparsefinder.explore.app_methods import method_label
from sparsefinder.explore.state import ViewState
from sparsefinder.figures import graphs, thumbnails
from sparsefinder.files import SparsefinderFileError
from sparsefinder.learned_parts import LearnedParts
from sparsefinder.metrics.measures import GraphScores
from sparsefinder.models.loading import LoadedModel, load_model
from sparsefinder.projections.heads import HeadProjections


def open_model(model: str | LoadedModel, alpha: float = 1.5, device: str = "cpu") -> LoadedModel:
    """A loaded model from a name, a local folder or a Hugging Face id in the local cache
    (``load_model`` explains what it looked for when it cannot), or the model itself."""
    if isinstance(model, LoadedModel):
        return model
    return load_model(str(model), alpha=alpha, device=device)


def _bundled_projections(model_id: str) -> HeadProjections | None:
    """The bundle's projections with k-means centroids when they were trained for this model
    (the app's default file); None for any other model (the learned methods are then off)."""
    try:
        return HeadProjections.load(bundle().best("centroids"), expected_model_id=model_id)
    except (BundleError, SparsefinderFileError, OSError, ValueError):
        return None


def prepare_text(loaded: LoadedModel, text: str) -> prep.PreparedText:
    """Gold graphs, projected inputs and scorer of ``text`` (the one model run)."""
    record, notes = inputs.extract_one(loaded, text)
    parts = LearnedParts.bundled(loaded.model_id, _bundled_projections(loaded.model_id))
    return prep.prepare(record, parts.projections, notes, calibration=parts.calibration,
                        calibration_projections=parts.calibration_projections,
                        hash_codes=parts.hash_codes)


def method_choices(prepared: prep.PreparedText) -> list[tuple[str, str]]:
    """(label, written method) of every method that runs on this text, best first."""
    return [(method_label(m), m) for m in prepared.available_methods()]


def state_for(method: str, target: float, layer: int, head: int) -> ViewState:
    """The app's view state for a written method (``distance-floor:budget``) and the controls."""
    family, _, calibration = method.partition(":")
    return ViewState(method=family, calibration=calibration or "none", target=float(target),
                     layer=int(layer), head=int(head))


@dataclass(frozen=True)
class View:
    """One setting on the prepared text: its masks, every head's scores and the summaries."""

    state: ViewState
    notes: list[str]
    preds: Any  # per-layer bool masks (heads, n, m), predicted when read
    scores: GraphScores
    summary: dict[str, live.Summary]
    label: str

    @property
    def headline(self) -> str:
        """The numbers a reader looks at first: the model's recall and sparsity."""
        model = self.summary["model"]
        head = self.summary["head"]
        return (f"{self.label} · model recall {model.recall:.3f}, sparsity {model.sparsity:.3f} "
                f"(gold {model.gold_sparsity:.3f}) · L{self.state.layer}H{self.state.head}: "
                f"recall {head.recall:.3f}, sparsity {head.sparsity:.3f}")


def compute(prepared: prep.PreparedText, state: ViewState) -> View:
    """Predict and score ``state`` (clamped to this text and model as the app does)."""
    state, notes = live.clamp(state, prepared)
    spec = live.spec_for(state, prepared)
    preds = live.predict(prepared, spec)
    scores = live.score(prepared, preds)
    return View(state=state, notes=notes, preds=preds, scores=scores,
                summary=live.summarize(scores, state.layer, state.head),
                label=live.describe(spec))


def head_figure(prepared: prep.PreparedText, view: View, width: int = 1100) -> go.Figure:
    """Gold | predicted | diff of the selected head (the app's figure)."""
    layer, head = view.state.layer, view.state.head
    record = prepared.record
    gold: Tensor = record.layers[layer].gold_of(head)
    pred: Tensor = view.preds[layer][head]
    codes = tables.diff_codes(pred, gold)
    return graphs.head_figure(gold.numpy(), pred.numpy(), codes, inputs.token_labels(record),
                              f"L{layer}H{head}", tables.diff_counts(codes), width=width)


def grid_figure(prepared: prep.PreparedText, view: View, kind: str = "diff") -> go.Figure:
    """Every head's graph at once, the selected one outlined, recall on hover."""
    codes = tables.heads_codes(prepared.record, list(view.preds), kind)
    return thumbnails.heads_figure(codes, kind, (view.state.layer, view.state.head),
                                   view.scores.recall.numpy(), "recall",
                                   live.softmax_layers(view.scores))


def with_selection(state: ViewState, **changes: Any) -> ViewState:
    """``state`` with some controls changed (a frozen dataclass)."""
    return replace(state, **changes)
