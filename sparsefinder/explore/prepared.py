"""One text ready for live prediction: its gold graphs, its inputs and its scorer, made once.

A text is "prepared" once per (model, α, text, projections). A slider move then only builds
predictors from the setting's spec and runs them on the cached inputs
(``sparsefinder.methods.spec.RecordInputs``: projected q/k computed once per layer), and the cached
``Scorer`` counts |Ĝ ∧ G| and |Ĝ|: the model never runs again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from sparsefinder.calibration.table import CalibrationTable
from sparsefinder.data.records import AttentionRecord
from sparsefinder.evaluation.curves import QUEST_PAGE
from sparsefinder.explore.app_methods import FLOORED_ID
from sparsefinder.explore.state import MAX_BINS
from sparsefinder.learned_parts import LearnedParts, method_variant
from sparsefinder.methods.parts import Parts
from sparsefinder.methods.spec import PredictorSpec, RecordInputs
from sparsefinder.metrics.scorer import Scorer
from sparsefinder.predictors.quantization import Quantization
from sparsefinder.projections.hash_code_table import HashCodeTable
from sparsefinder.projections.heads import HeadProjections

#: The calibrated methods the app offers (a target-sparsity slider), best first.
CALIBRATED_APP_METHODS = (FLOORED_ID, "distance:budget", "rowfrac:budget",
                          "kmeans-routed:budget")


@dataclass
class PreparedText:
    """Gold graphs, inputs (with projections when they match the model) and scorer of a text.

    ``projections`` is None when no projections match the model, in which case only the
    window/global patterns (and other shape-only methods) can be predicted.
    """

    record: AttentionRecord
    vectors: RecordInputs
    scorer: Scorer
    notes: list[str] = field(default_factory=list)
    t_max: float = 1.0
    #: the t that keeps as many pairs as the gold graphs hold (None: a quarter of t_max)
    t_default: float | None = None
    #: the quantization β whose sparsity is closest to the gold graphs' (None: no projections)
    bins_default: int | None = None
    calibration: CalibrationTable | None = None  # target-sparsity settings for projections
    #: the text projected with the calibration table's OWN projections (the best file, e.g.
    #: r = 8 lowrank-logistic), which its methods read; None: they read ``vectors``
    calibrated_vectors: RecordInputs | None = None
    #: learned HashAttention codes that read this model's q/k (None: the method is off)
    hash_codes: HashCodeTable | None = None
    #: the methods that run on this text (:func:`.availability.available_methods`), once known
    available: list[str] | None = field(default=None, repr=False)
    #: the parts each method takes, resolved once per text (a slider move reads them again)
    _resolved: dict[tuple, Parts] = field(default_factory=dict, repr=False)

    @property
    def projections(self) -> HeadProjections | None:
        return self.vectors.projections

    @property
    def has_projections(self) -> bool:
        return self.vectors.has_projections

    @property
    def cluster_choices(self) -> list[int]:
        """The numbers of k-means clusters B the projections hold centroids for."""
        return sorted(self.projections.centroids) if self.projections is not None else []

    @property
    def num_layers(self) -> int:
        return self.record.num_layers

    @property
    def num_heads(self) -> int:
        return self.record.num_heads

    @property
    def n_tokens(self) -> int:
        return self.record.n_tokens

    def parts_for(self, method: str | PredictorSpec) -> Parts:
        """The parts ``method`` (a written method or a spec) takes on this text, resolved by
        :meth:`LearnedParts.for_method` the first time and kept: the parts of a prepared text
        do not change, and one slider move reads them for the build, the inputs and the
        fitted part."""
        written, variant = method_variant(method)
        key = (written, variant.needs, variant.fits)
        parts = self._resolved.get(key)
        if parts is None:  # sessions share a prepared text: a race resolves twice, same value
            parts = self._resolved[key] = self.parts.for_method(method)
        return parts

    def inputs_for(self, method: str | PredictorSpec) -> RecordInputs:
        """The inputs ``method`` reads: the calibration table's projections for its methods,
        else the app's (one file need not serve every method: k-means needs the shared
        space of the paper's projections, the calibrated distance the best file)."""
        own = self.calibrated_vectors
        if own is not None and self.parts_for(method).projections is own.projections:
            return own  # the rule is LearnedParts.for_method's, the one resolver
        return self.vectors

    def projections_for(self, method: str) -> HeadProjections | None:
        """The projections ``method``'s predictors are built with (see :meth:`inputs_for`)."""
        return self.inputs_for(method).projections

    @property
    def parts(self) -> LearnedParts:
        """The learned parts at hand for this text (the one resolver of what a method takes)."""
        own = self.calibrated_vectors.projections if self.calibrated_vectors else None
        return LearnedParts(self.projections, self.calibration, own, self.hash_codes)

    def fitted(self, method: str) -> Any:
        """What ``method``'s predictors are built from besides the projections: the
        calibration table's settings, the learned hash codes, …; None when nothing is."""
        written, variant = method_variant(method)
        return getattr(self.parts_for(method), variant.fits, None)


@torch.inference_mode()
def prepare(
    record: AttentionRecord,
    projections: HeadProjections | None = None,
    notes: Sequence[str] = (),
    *,
    t_range: bool = True,
    calibration: CalibrationTable | None = None,
    calibration_projections: HeadProjections | None = None,
    hash_codes: HashCodeTable | None = None,
    device: torch.device | str | None = None,
) -> PreparedText:
    """Check the projections against the record, project every layer once and compute the
    slider range for t (``t_range=False`` skips that when no slider will be drawn).
    ``calibration`` drives the target-sparsity methods: fitted for ``projections``, or for
    its own ``calibration_projections`` (then used for its methods, whatever
    ``projections`` is; a table whose projections do not fit the record is left out).
    ``hash_codes`` enable ``hashattention`` when they fit the record's shape.

    ``device``: where the text lives from now on (e.g. ``"cuda"``; default: where the record
    is). The gold bits, the vectors, the projected vectors, every prediction and the scorer
    stay there, so a slider move sends no (n, n) data between host and device: only the
    (layers, heads) scores come back."""
    if device is not None and torch.device(device) != record.layers[0].device:
        record = record.to(device)
    vectors = RecordInputs(record, projections)
    calibrated_vectors = None
    if calibration is not None and calibration_projections is not None:
        try:
            calibrated_vectors = RecordInputs(record, calibration_projections)
        except ValueError:  # another model's or shape's projections
            calibration = None
    elif projections is None:
        calibration = None
    prepared = PreparedText(record=record, vectors=vectors, scorer=Scorer(record),
                            notes=list(notes), calibration=calibration,
                            calibrated_vectors=calibrated_vectors,
                            hash_codes=(hash_codes if hash_codes is not None
                                        and hash_codes.fits(record) else None))
    if projections is not None and t_range:
        sample = distance_sample([vectors.projected(layer) for layer in range(record.num_layers)])
        prepared.t_max = _round_up(max(_quantile(sample, 0.99), 1e-3))
        gold_density = 1.0 - float(prepared.scorer.gold_sparsity.mean())
        step = prepared.t_max / 200  # the slider's step: the default sits on it
        t = round(_quantile(sample, gold_density) / step) * step
        prepared.t_default = round(min(max(t, step), prepared.t_max), 6)
        prepared.bins_default = default_bins(
            [vectors.projected(layer) for layer in range(record.num_layers)],
            1.0 - gold_density)
    return prepared


def default_bins(projected: Sequence[tuple[Tensor, Tensor]], gold_sparsity: float,
                 max_bins: int = MAX_BINS) -> int:
    """The β (bins per dimension) whose quantization sparsity, pooled over heads, is closest
    to the gold graphs' ``gold_sparsity`` (ties: the smaller β), so the method opens on a
    graph as sparse as the text's attention rather than a near-full one (β = 4 keeps about
    two pairs in three on the bundled model where the gold keeps one in sixteen). Measured on
    an even subsample of at least 128 queries and keys: equal-population bins make the share
    of pairs that meet nearly independent of the number of tokens."""
    best, best_gap = 1, math.inf
    for bins in range(1, max_bins + 1):
        predictor = Quantization(bins)
        kept = total = 0
        for q, k in projected:
            step = max(1, min(q.shape[-2], k.shape[-2]) // 128)  # at least 128 tokens a side
            mask = predictor.predict(q[:, ::step], k[:, ::step])
            kept += int(mask.sum())
            total += mask.numel()
        gap = abs((1.0 - kept / max(total, 1)) - gold_sparsity)
        if gap < best_gap - 1e-12:
            best, best_gap = bins, gap
    return best


def distance_range(projected: Sequence[tuple[Tensor, Tensor]], quantile: float = 0.99) -> float:
    """Upper end of the t slider: a high quantile of the query–key distances, rounded up.

    Beyond it nearly every pair is an edge, so larger values only waste slider travel.
    """
    return _round_up(max(_quantile(distance_sample(projected), quantile), 1e-3))


def _quantile(sample: Tensor, q: float) -> float:
    return float(torch.quantile(sample, min(max(q, 0.0), 1.0))) if sample.numel() else 1.0


def distance_sample(projected: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
    """Projected query–key distances of every head, subsampled (every 4th query and key, at
    most a million): enough for the quantiles that set the t slider."""
    samples = []
    for q, k in projected:
        d = torch.cdist(q[:, ::4], k[:, ::4])  # a subsample is enough for a quantile
        samples.append(d.flatten())
    flat = torch.cat(samples) if samples else torch.ones(1)
    if flat.numel() > 1_000_000:
        keep = torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(0))
        flat = flat[keep[:1_000_000]]
    return flat


def _round_up(value: float) -> float:
    """Round up to 1, 2 or 5 × a power of ten (a slider end a person can read)."""
    exponent = math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        candidate = step * 10**exponent
        if candidate >= value:
            return float(candidate)
    return float(10 ** (exponent + 1))


def default_pages(prepared: PreparedText, page_size: int = QUEST_PAGE) -> int:
    """Quest pages per query that hold about as many keys as the gold graphs keep (the
    text's gold density × its length), so Quest does not open on a full graph."""
    density = 1.0 - float(prepared.scorer.gold_sparsity.mean())
    return max(1, round(density * prepared.n_tokens / page_size))


def default_threshold(prepared: PreparedText) -> float:
    """A starting t that opens near the text's gold sparsity: the distance quantile at the
    gold density, pooled over heads (so the graph is not a solid square); a quarter of the
    slider range when the text was prepared without a t range."""
    if prepared.t_default is not None:
        return prepared.t_default
    return round(prepared.t_max / 4, 6)
