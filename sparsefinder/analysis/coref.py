"""Coreference heads: which heads send pronouns to their antecedents, and does k-means keep that?

The paper (§6, "Learned patterns", Fig. 5) shows a RoBERTa head that attends from pronouns to
their antecedents, on which Sparsefinder k-means keeps recall ≈ 0.80 at sparsity ≈ 0.75. This
module reproduces the analysis on any model with the bundled probes
(``assets/coref_probes.json``: short English texts with character spans of pronoun/antecedent
pairs).

Definitions (exact; the CLI and tests rely on them):

* **Span → tokens.** A character span ``[a, b)`` covers every non-special token whose offsets
  ``[s, e)`` overlap it (``s < b`` and ``e > a``, ``e > s``), so a word split into several
  pieces maps to all its pieces.
* **Pair mass** of a head on one pair = the mean over the pronoun's token rows of the gold
  α-entmax probability summed over the antecedent's token columns. It lies in [0, 1] (each row
  is a distribution), and for the usual one-piece pronoun it is simply "how much of the
  pronoun's attention lands on its antecedent".
* **Head score** (:func:`rank_heads`) = the mean pair mass over all pairs of all probes (each
  pair weighs the same).
* **Pronoun-edge recall** (:func:`pronoun_edge_recall`): the gold edges considered are those of
  the head from a pronoun token row to a token column of its antecedent; recall =
  ``|pred ∧ those| / |those|``. Over probes the edge counts are pooled (micro), so probes with
  more such edges weigh more. Sparsity is that of the whole predicted graph of the head,
  averaged over probes (macro, as :mod:`sparsefinder.metrics`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from sparsefinder.bundle import coref_probes
from sparsefinder.metrics.measures import count_true, recall, sparsity

DEFAULT_PROBES = coref_probes()

#: A probe's ``split``: ``choose`` (the default) may steer every choice (the head, a method's
#: setting); ``heldout`` is kept out of all of them and only measured.
SPLITS: tuple[str, ...] = ("choose", "heldout")
#: A held-out probe's optional ``set``: a name (lower-case letters, digits, ``_``) for a group
#: of held-out probes measured on their own beside the whole split, e.g. ``fresh``.
SET_NAME = re.compile(r"[a-z][a-z0-9_]*")


class ProbeFileError(ValueError):
    """The probe file is missing or malformed; the message names the file and the problem."""


@dataclass(frozen=True)
class CorefPair:
    """One pronoun and its antecedent, as character spans ``[start, end)`` into the text.

    ``source`` says where the pair comes from: ``"annotated"`` (a probe file, by hand),
    ``"auto"`` (an automatic guess of :mod:`sparsefinder.analysis.coref_pairs`) or ``"hand"``
    (named by the user in the app)."""

    pronoun: tuple[int, int]
    antecedent: tuple[int, int]
    cataphora: bool = False
    source: str = "annotated"


@dataclass(frozen=True)
class Probe:
    """One probe text with its annotated pairs, its split (:data:`SPLITS`) and, for a held-out
    probe, the set it belongs to (:data:`SET_NAME`; ``None``: none)."""

    id: str
    text: str
    pairs: tuple[CorefPair, ...]
    split: str = "choose"
    set: str | None = None


@dataclass(frozen=True)
class PairTokens:
    """A pair mapped to token indices of one record."""

    pronoun: np.ndarray  # int64 token indices (rows)
    antecedent: np.ndarray  # int64 token indices (columns)


def _span(value: Any, text: str, where: str) -> tuple[int, int]:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise ValueError(f"{where} must be a [start, end] pair of integers, got {value!r}")
    start, end = value
    if not 0 <= start < end <= len(text):
        raise ValueError(f"{where} {value} is not a non-empty span inside the text")
    return start, end


def _parse_probe(raw: Any, index: int) -> Probe:
    if not isinstance(raw, dict):
        raise ValueError(f"probe #{index} is not an object")
    pid, text, pairs = raw.get("id"), raw.get("text"), raw.get("pairs")
    if not isinstance(pid, str) or not isinstance(text, str) or not text.strip():
        raise ValueError(f"probe #{index} needs a string 'id' and a non-empty 'text'")
    if not isinstance(pairs, list) or not pairs:
        raise ValueError(f"probe {pid} needs a non-empty list 'pairs'")
    split = raw.get("split", "choose")
    if split not in SPLITS:
        raise ValueError(f"probe {pid}: 'split' must be one of {SPLITS}, got {split!r}")
    group = raw.get("set")
    if group is not None:
        if not isinstance(group, str) or not SET_NAME.fullmatch(group) or group in SPLITS:
            raise ValueError(f"probe {pid}: 'set' must be a lower-case name such as 'fresh' "
                             f"(not a split), got {group!r}")
        if split != "heldout":
            raise ValueError(f"probe {pid}: 'set' is only for held-out probes")
    parsed = []
    for j, pair in enumerate(pairs):
        if not isinstance(pair, dict):
            raise ValueError(f"probe {pid} pair #{j} is not an object")
        cataphora = pair.get("cataphora", False)
        if not isinstance(cataphora, bool):
            raise ValueError(f"probe {pid} pair #{j}: 'cataphora' must be true or false")
        parsed.append(
            CorefPair(
                pronoun=_span(pair.get("pronoun"), text, f"probe {pid} pair #{j} 'pronoun'"),
                antecedent=_span(
                    pair.get("antecedent"), text, f"probe {pid} pair #{j} 'antecedent'"
                ),
                cataphora=cataphora,
            )
        )
    return Probe(id=pid, text=text, pairs=tuple(parsed), split=split, set=group)


def load_probes(
    path: str | Path = DEFAULT_PROBES, *, include_cataphora: bool = True
) -> list[Probe]:
    """Read and validate a probe file; any problem raises :class:`ProbeFileError` naming it.

    ``include_cataphora=False`` drops pairs whose pronoun comes before its antecedent (and
    probes left with no pair).
    """
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise ProbeFileError(f"coreference probe file {path} not found") from error
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ProbeFileError(
            f"coreference probe file {path} is not readable JSON: {error}"
        ) from error
    try:
        items = raw.get("probes") if isinstance(raw, dict) else None
        if not isinstance(items, list) or not items:
            raise ValueError("expected an object with a non-empty list 'probes'")
        probes = [_parse_probe(item, i) for i, item in enumerate(items)]
        ids = [p.id for p in probes]
        if len(set(ids)) != len(ids):
            raise ValueError("probe ids are not unique")
    except ValueError as error:
        raise ProbeFileError(f"coreference probe file {path} is malformed: {error}") from error
    if not include_cataphora:
        probes = [replace(p, pairs=tuple(x for x in p.pairs if not x.cataphora)) for p in probes]
        probes = [p for p in probes if p.pairs]
    return probes


def split_probes(probes: Sequence[Probe]) -> tuple[list[Probe], list[Probe]]:
    """``(choose, heldout)``: the probes every choice may use, and those only measured."""
    return ([p for p in probes if p.split == "choose"],
            [p for p in probes if p.split == "heldout"])


def span_tokens(
    offsets: Sequence[tuple[int, int]], span: tuple[int, int], special: Sequence[bool] | None = None
) -> np.ndarray:
    """Indices of the tokens whose character offsets overlap ``span`` (special tokens never)."""
    spans = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    start, end = span
    hit = (spans[:, 0] < end) & (spans[:, 1] > start) & (spans[:, 1] > spans[:, 0])
    if special is not None:
        hit &= ~np.asarray(special, dtype=bool)
    return np.flatnonzero(hit)


def pair_tokens(record: Any, probe: Probe) -> list[PairTokens]:
    """Map a probe's pairs to token indices of its record (``record.text`` must be the probe's)."""
    if record.text != probe.text:
        raise ValueError(f"record text does not match probe {probe.id}; extract probe texts 1:1")
    out = []
    for pair in probe.pairs:
        rows = span_tokens(record.offsets, pair.pronoun, record.special)
        cols = span_tokens(record.offsets, pair.antecedent, record.special)
        if len(rows) == 0 or len(cols) == 0:
            raise ValueError(
                f"probe {probe.id}: a span of pair {pair} covers no token (text truncated?)"
            )
        out.append(PairTokens(rows, cols))
    return out


def pair_weights(pairs: Sequence[PairTokens], n: int, m: int) -> tuple[Tensor, Tensor]:
    """Row weights (P, n) = 1/|pronoun tokens| on the pronoun rows, column indicator (P, m)."""
    rows = torch.zeros(len(pairs), n, dtype=torch.float64)
    cols = torch.zeros(len(pairs), m, dtype=torch.float64)
    for p, pair in enumerate(pairs):  # a few pairs per text, not a loop over tokens
        rows[p, torch.from_numpy(pair.pronoun)] = 1.0 / len(pair.pronoun)
        cols[p, torch.from_numpy(pair.antecedent)] = 1.0
    return rows, cols


def pair_masses(probs: Tensor, pairs: Sequence[PairTokens]) -> Tensor:
    """Pair mass (module docstring) for every head: probs (..., heads, n, m) → (..., heads, P)."""
    rows, cols = pair_weights(pairs, probs.shape[-2], probs.shape[-1])
    return torch.einsum("...nm,pn,pm->...p", probs.to(torch.float64), rows, cols)


def pronoun_edges(pairs: Sequence[PairTokens], n: int, m: int) -> Tensor:
    """Bool (n, m): True on every (pronoun token, antecedent token) pair of the text."""
    rows, cols = pair_weights(pairs, n, m)
    return torch.einsum("pn,pm->nm", (rows > 0).double(), cols) > 0


def record_masses(record: Any, pairs: Sequence[PairTokens]) -> Tensor:
    """Pair masses of every (layer, head) of a record: float64 (layers, heads, P)."""
    return torch.stack([pair_masses(layer.probs(), pairs) for layer in record.layers])


def rank_heads(records: Sequence[Any], probes: Sequence[Probe]) -> pd.DataFrame:
    """Rank every (layer, head) by mean pronoun→antecedent gold mass over all pairs.

    ``records[i]`` must be the record of ``probes[i].text``. Columns: ``rank`` (1 = best),
    ``layer``, ``head``, ``mass`` (mean pair mass, the ranking key; ties: lower layer, head),
    ``median`` (median pair mass), ``hit_rate`` (share of pairs with pair mass ≥ 0.5: does the
    head point at the antecedent reliably, not just on average) and ``n_pairs``.
    """
    if len(records) != len(probes):
        raise ValueError(f"got {len(records)} records for {len(probes)} probes; pass them 1:1")
    if not records:
        raise ValueError("rank_heads needs at least one probe")
    masses = torch.cat(
        [record_masses(r, pair_tokens(r, p)) for r, p in zip(records, probes, strict=True)],
        dim=-1,
    )  # (layers, heads, total pairs)
    n_layers, n_heads, n_pairs = masses.shape
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    flat = masses.reshape(n_layers * n_heads, n_pairs)
    table = pd.DataFrame(
        {
            "layer": layer,
            "head": head,
            "mass": flat.mean(-1).numpy(),
            "median": flat.median(-1).values.numpy(),
            "hit_rate": (flat >= 0.5).double().mean(-1).numpy(),
            "n_pairs": n_pairs,
        }
    )
    table = table.sort_values(["mass", "layer", "head"], ascending=[False, True, True])
    table.insert(0, "rank", np.arange(1, len(table) + 1))
    return table.reset_index(drop=True)


@dataclass
class PronounEdgeCounts:
    """Per-head counts on pronoun→antecedent gold edges (int64 (heads,) each)."""

    hit: Tensor
    gold: Tensor

    @property
    def recall(self) -> Tensor:
        """float64 (heads,); NaN where a head has no such gold edge (nothing to measure)."""
        total = self.gold.to(torch.float64)
        return torch.where(total > 0, self.hit / total.clamp(min=1), float("nan"))


def pronoun_edge_counts(
    pred: Tensor, gold: Tensor, pairs: Sequence[PairTokens]
) -> PronounEdgeCounts:
    """Hits and gold edges restricted to pronoun→antecedent pairs: masks (heads, n, m) bool."""
    if pred.shape != gold.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and gold {tuple(gold.shape)} must match")
    target = gold & pronoun_edges(pairs, gold.shape[-2], gold.shape[-1])
    return PronounEdgeCounts(hit=count_true(pred & target), gold=count_true(target))


def pronoun_edge_recall(
    pred_mask: Tensor, record: Any, pairs: Sequence[PairTokens], layer: int
) -> Tensor:
    """Recall of ``pred_mask`` (heads, n, m) of ``layer`` on the record's gold
    pronoun→antecedent edges: float64 (heads,), NaN for heads with no such edge."""
    return pronoun_edge_counts(pred_mask, record.layers[layer].gold, pairs).recall


def evaluate_head(
    records: Sequence[Any],
    probes: Sequence[Probe],
    preds: Sequence[Tensor],
    layer: int,
    head: int,
) -> dict[str, float]:
    """Score one head's predicted graphs on the probes.

    ``preds[i]`` is the predicted bool mask (heads, n, m) of ``layer`` for ``records[i]``
    (e.g. the Sparsefinder k-means graph on projected q/k). Returns the pooled pronoun-edge
    recall, the number of those gold edges, the head's overall recall (all gold edges) and the
    predicted and gold sparsity (the last three macro over probes).
    """
    if not len(records) == len(probes) == len(preds):
        raise ValueError("records, probes and preds must be given 1:1")
    hit = total = 0
    full_recall, pred_sparsity, gold_sparsity = [], [], []
    for record, probe, layer_pred in zip(records, probes, preds, strict=True):
        gold = record.layers[layer].gold_of(slice(head, head + 1))
        pred = layer_pred[head : head + 1]
        counts = pronoun_edge_counts(pred, gold, pair_tokens(record, probe))
        hit += int(counts.hit[0])
        total += int(counts.gold[0])
        full_recall.append(float(recall(pred, gold)[0]))
        pred_sparsity.append(float(sparsity(pred, causal=record.causal)[0]))
        gold_sparsity.append(float(sparsity(gold, causal=record.causal)[0]))
    return {
        "pronoun_recall": hit / total if total else float("nan"),
        "pronoun_gold_edges": total,
        "head_recall": float(np.mean(full_recall)),
        "sparsity": float(np.mean(pred_sparsity)),
        "gold_sparsity": float(np.mean(gold_sparsity)),
    }
