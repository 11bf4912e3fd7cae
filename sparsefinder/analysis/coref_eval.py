"""Any method on a coreference head: its setting chosen on some probes, measured on others.

The paper's claim for a coreference head (recall ≈ 0.80 at sparsity ≈ 0.75, §6) only means
something on pronouns the predictor and its settings never saw. So the probes are split
(:data:`~sparsefinder.analysis.coref.SPLITS`): the head and the method's setting are chosen
on the ``choose`` probes alone, and the ``heldout`` probes are only measured.

Definitions (the CLI and tests rely on them):

* **Recall** of a setting on a set of probes = pooled pronoun-edge recall of
  :func:`~sparsefinder.analysis.coref.evaluate_head`: over every annotated pair, the gold
  edges of the head from a pronoun token to an antecedent token (the pairs whose gold edge
  exists), the share the predicted graph keeps. **Sparsity** = that head's predicted graph
  sparsity, mean over the probes.
* **The chosen setting** (:func:`choose_setting`), by default: the one with the highest
  sparsity on the ``choose`` probes among those whose recall there is at least ``min_recall``;
  if none reaches it, the one with the highest recall there. With ``min_sparsity`` instead:
  the one with the highest recall on the ``choose`` probes among those whose sparsity there is
  at least ``min_sparsity``; if none reaches it, the sparsest. Ties: the sparser, then the
  first. Only ``choose_*`` columns are read, so the held-out probes cannot move the choice.
* **A held-out set** (a probe's optional ``set``, e.g. ``fresh``): some of the held-out probes,
  also scored on their own (``<set>_…`` columns) beside the whole held-out split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from sparsefinder.analysis.coref import Probe, evaluate_head
from sparsefinder.learned_parts import LearnedParts
from sparsefinder.methods.spec import PredictorSpec, RecordInputs, predict_layer

#: Columns of :func:`evaluate_settings` per split (``choose_…``, ``heldout_…``, and per named
#: held-out set, e.g. ``fresh_…``).
SCORES: tuple[str, ...] = ("pronoun_recall", "pronoun_gold_edges", "head_recall", "sparsity",
                           "gold_sparsity")


class _Inputs:
    """The records' vectors per projections object, so every setting reuses one projection."""

    def __init__(self, records: Sequence[Any]) -> None:
        self.records = list(records)
        self._by: dict[int, list[RecordInputs]] = {}

    def get(self, projections: Any) -> list[RecordInputs]:
        key = id(projections)
        if key not in self._by:
            self._by[key] = [RecordInputs(r, projections) for r in self.records]
        return self._by[key]


def predict_layer_masks(spec: PredictorSpec, parts: LearnedParts, vectors: Sequence[Any] | _Inputs,
                        layer: int) -> list[Tensor]:
    """Bool (heads, n, m) masks of ``layer`` for each record, as the library predicts them
    (:func:`~sparsefinder.methods.spec.predict_layer`) with the parts ``parts`` resolves."""
    inputs = vectors if isinstance(vectors, _Inputs) else _Inputs(vectors)
    bundle = parts.for_method(spec)
    predictor = spec.build(bundle, layer)
    masks = []
    for item in inputs.get(bundle.projections if spec.needs_projections else None):
        graph = item.record.layers[layer]
        if predictor is None:  # nothing switched on: the empty graph
            masks.append(torch.zeros(graph.gold_shape, dtype=torch.bool))
            continue
        q, k = item.get(layer, spec.inputs)
        with torch.inference_mode():
            masks.append(predict_layer(predictor, q, k, causal=item.record.causal,
                                       sliding_window=graph.sliding_window))
    return masks


def evaluate_settings(specs: Sequence[PredictorSpec], parts: LearnedParts,
                      choose: tuple[Sequence[Any], Sequence[Probe]],
                      heldout: tuple[Sequence[Any], Sequence[Probe]],
                      layer: int, head: int,
                      heldout_sets: Mapping[str, Sequence[int]] | None = None) -> pd.DataFrame:
    """One row per setting: ``method``, ``setting`` (its label), ``params`` and the scores of
    :func:`evaluate_head` on each split (``choose_<score>``, ``heldout_<score>``; NaN where a
    split has no probe). ``choose``/``heldout`` are ``(records, probes)`` given 1:1.

    ``heldout_sets`` maps a name (e.g. ``fresh``) to positions in ``heldout``: those probes are
    also scored on their own, from the same held-out predictions (``<name>_<score>``)."""
    splits = {"choose": choose, "heldout": heldout}
    sets = dict(heldout_sets or {})
    for name, picked in sets.items():
        if name in splits or not picked:
            raise ValueError(f"held-out set {name!r} must be a new name with at least one probe")
    inputs = {name: _Inputs(records) for name, (records, _) in splits.items()}
    rows = []
    for spec in specs:
        row: dict[str, Any] = {"method": spec.method_id, "setting": spec.label(),
                               "params": spec.params_json(), "layer": layer, "head": head}
        for name, (records, probes) in splits.items():
            if not probes:
                row.update({f"{name}_{s}": float("nan") for s in SCORES})
                continue
            masks = predict_layer_masks(spec, parts, inputs[name], layer)
            scores = evaluate_head(records, probes, masks, layer, head)
            row.update({f"{name}_{s}": scores[s] for s in SCORES})
            if name != "heldout":
                continue
            for group, picked in sets.items():
                scores = evaluate_head([records[i] for i in picked], [probes[i] for i in picked],
                                       [masks[i] for i in picked], layer, head)
                row.update({f"{group}_{s}": scores[s] for s in SCORES})
        rows.append(row)
    return pd.DataFrame(rows)


def choose_setting(table: pd.DataFrame, min_recall: float = 0.8,
                   min_sparsity: float | None = None) -> int:
    """Index (row label) of the chosen setting (module docstring); reads ``choose_*`` only."""
    if table.empty:
        raise ValueError("no setting to choose from")
    recall = table["choose_pronoun_recall"].fillna(-1.0)
    sparsity = table["choose_sparsity"].fillna(-1.0)
    def sparsest(i: int) -> tuple:
        return (-sparsity[i], i)

    def best_recall(i: int) -> tuple:
        return (-recall[i], -sparsity[i], i)

    if min_sparsity is None:
        ok = recall >= min_recall
        key = sparsest if ok.any() else best_recall
    else:
        ok = sparsity >= min_sparsity
        key = best_recall if ok.any() else sparsest
    pool = table.index[ok] if ok.any() else table.index
    return min(pool, key=key)


def mark_choice(table: pd.DataFrame, min_recall: float = 0.8,
                min_sparsity: float | None = None) -> pd.DataFrame:
    """``table`` with ``chosen`` (one True per method, :func:`choose_setting`) and ``reached``
    (its choose recall, or with ``min_sparsity`` its choose sparsity, meets the rule's bound)
    columns; each method is chosen among its own rows."""
    out = table.copy()
    out["chosen"] = False
    for _, rows in out.groupby("method", sort=False):
        out.loc[choose_setting(rows, min_recall, min_sparsity), "chosen"] = True
    out["reached"] = (out["choose_pronoun_recall"] >= min_recall if min_sparsity is None
                      else out["choose_sparsity"] >= min_sparsity)
    return out
