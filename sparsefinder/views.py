"""What the app shows, computed where a test can reach it.

The Streamlit app (``app/``) only draws; every number, table and file it offers comes from
here: the shareable view state (parsed from URL query parameters, never trusted), the
predictor a set of slider values stands for, per-layer predictions and scores of one text,
the diff of a predicted and a gold graph, and the CSV/JSON behind every figure.

One text is "prepared" once per (model, α, text, projections): gold graphs plus the projected
query/key vectors of every layer. A slider move then only re-runs the cheap predictors on
those cached vectors (``predict_layers``) and scores them (``score``); the model never runs.
"""

from __future__ import annotations

import io
import json
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from sparsefinder.graphs import AttentionRecord, LongTextWarning, TextInputError, extract
from sparsefinder.metrics import GraphScores, count_true, n_allowed_pairs, score_layers, sparsity
from sparsefinder.predictors import Distance, GlobalTokens, KMeans, Quantization, Union, Window
from sparsefinder.predictors.base import Predictor, apply_causal, causal_mask
from sparsefinder.predictors.distance import pairwise_sq_dist

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "assets" / "examples"
DEFAULT_EXAMPLE = "short_dialogue"

#: Method keys (URL values) → labels. "fixed" means window/global patterns only.
METHODS: dict[str, str] = {
    "distance": "Distance (t)",
    "quantization": "Quantization (β)",
    "kmeans": "k-means (B, k)",
    "fixed": "Window / global only",
}
#: Methods that need learned projections (and, for k-means, centroids).
LEARNED_METHODS = frozenset({"distance", "quantization", "kmeans"})
GLOBAL_CHOICES = ("first", "last")
MAX_BINS = 16
MAX_WINDOW = 31
#: Window sizes worth offering: an even size behaves like the next odd one (Window docs).
WINDOW_CHOICES = (0, *range(1, MAX_WINDOW + 1, 2))
MAX_TOP_K = 8
#: B shown first: mid-range of the paper's grid (2–20), where k-means is neither trivial
#: (B = 2 keeps half the pairs) nor starved.
DEFAULT_CLUSTERS = 8
_DIFF_NAMES = ("none", "TP", "FN", "FP")


# ------------------------------------------------------------------------------------------
# View state: what a URL reproduces
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ViewState:
    """Everything a shared URL fixes: method, its hyperparameters and what is selected.

    ``t=None`` means "the default threshold of this text" (see :func:`default_threshold`),
    because a good distance threshold depends on the scale of the learned projections.
    """

    method: str = "kmeans"
    t: float | None = None
    bins: int = 4
    clusters: int | None = None  # B; None = the smallest B the projections offer
    top_k: int = 1
    window: int = 3
    global_tokens: tuple[str, ...] = GLOBAL_CHOICES
    layer: int = 0
    head: int = 0
    query: int = 1  # the first word: query 0 is [CLS], which global tokens make all-True
    example: str = DEFAULT_EXAMPLE

    def with_(self, **changes: Any) -> ViewState:
        return replace(self, **changes)


#: Query-parameter names (short, URL-friendly) of each ViewState field.
PARAM_NAMES: dict[str, str] = {
    "method": "method",
    "t": "t",
    "bins": "beta",
    "clusters": "B",
    "top_k": "k",
    "window": "window",
    "global_tokens": "global",
    "layer": "layer",
    "head": "head",
    "query": "query",
    "example": "example",
}


def _parse_int(text: str, low: int, high: int | None) -> int:
    value = int(float(text))
    if value < low or (high is not None and value > high):
        raise ValueError(f"{value} is outside [{low}, {high if high is not None else '∞'}]")
    return value


def parse_view_state(
    params: Mapping[str, str | Sequence[str]], default: ViewState | None = None
) -> tuple[ViewState, list[str]]:
    """URL query parameters → (ViewState, problems).

    A bad or out-of-range value never raises: it falls back to the default and a problem
    message names the parameter, so a hand-edited URL still opens a working view. Bounds that
    depend on the text or model (layer, head, query, B) are checked later by :func:`clamp`.
    """
    state = default or ViewState()
    problems: list[str] = []
    changes: dict[str, Any] = {}

    def raw(field_name: str) -> str | None:
        value = params.get(PARAM_NAMES[field_name])
        if value is None:
            return None
        if not isinstance(value, str):  # st.query_params.get_all style lists
            value = value[-1] if len(value) else ""
        return value.strip()

    parsers: dict[str, Callable[[str], Any]] = {
        "method": lambda s: s if s in METHODS else _bad(f"one of {', '.join(METHODS)}"),
        "t": lambda s: _finite_nonneg(float(s)),
        "bins": lambda s: _parse_int(s, 1, MAX_BINS),
        "clusters": lambda s: _parse_int(s, 1, None),
        "top_k": lambda s: _parse_int(s, 1, None),
        "window": lambda s: _parse_int(s, 0, MAX_WINDOW),
        "global_tokens": _parse_global,
        "layer": lambda s: _parse_int(s, 0, None),
        "head": lambda s: _parse_int(s, 0, None),
        "query": lambda s: _parse_int(s, 0, None),
        "example": lambda s: s if s in list_examples() else _bad("a bundled example name"),
    }
    for name, parse in parsers.items():
        text = raw(name)
        if text is None:
            continue
        try:
            changes[name] = parse(text)
        except (ValueError, TypeError) as error:
            problems.append(f"ignored URL parameter {PARAM_NAMES[name]}={text!r}: {error}")
    return replace(state, **changes), problems


def _bad(expected: str) -> Any:
    raise ValueError(f"expected {expected}")


def _finite_nonneg(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError("expected a finite number >= 0")
    return value


def _parse_global(text: str) -> tuple[str, ...]:
    parts = [p for p in (s.strip() for s in text.split(",")) if p and p != "none"]
    unknown = [p for p in parts if p not in GLOBAL_CHOICES]
    if unknown:
        raise ValueError(f"expected a comma list of {GLOBAL_CHOICES} or 'none'")
    return tuple(c for c in GLOBAL_CHOICES if c in parts)


def snap_window(size: int) -> int:
    """The window choice equivalent to ``size`` (even sizes act like the next odd one)."""
    size = max(0, min(int(size), MAX_WINDOW))
    return size if size == 0 or size % 2 else size + 1


def view_state_to_params(state: ViewState) -> dict[str, str]:
    """ViewState → query parameters (strings); ``None`` fields are left out."""
    out: dict[str, str] = {}
    for name, key in PARAM_NAMES.items():
        value = getattr(state, name)
        if value is None:
            continue
        if name == "global_tokens":
            out[key] = ",".join(value) or "none"
        elif isinstance(value, float):
            out[key] = f"{value:.4g}"
        else:
            out[key] = str(value)
    return out


# ------------------------------------------------------------------------------------------
# Input handling: examples, uploads, long and unusual text
# ------------------------------------------------------------------------------------------


def list_examples(folder: Path = EXAMPLES_DIR) -> list[str]:
    """Names (file stems) of the bundled example texts, sorted, default first."""
    names = sorted(p.stem for p in folder.glob("*.txt"))
    if DEFAULT_EXAMPLE in names:
        names.remove(DEFAULT_EXAMPLE)
        names.insert(0, DEFAULT_EXAMPLE)
    return names


def read_example(name: str, folder: Path = EXAMPLES_DIR) -> str:
    """The text of a bundled example; a clear TextInputError for an unknown name."""
    if name not in list_examples(folder):
        raise TextInputError(f"unknown example {name!r}; choose one of {list_examples(folder)}")
    return (folder / f"{name}.txt").read_text(encoding="utf-8")


def decode_upload(data: bytes, name: str = "upload") -> str:
    """Bytes of an uploaded .txt → text; UTF-8 (with or without BOM), else a clear error."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise TextInputError(
            f"{name} is not UTF-8 text (byte {error.start} cannot be decoded); "
            "save it as UTF-8 plain text and upload it again"
        ) from error


def extract_one(loaded: Any, text: str) -> tuple[AttentionRecord, list[str]]:
    """Gold graphs of one text (truncated if too long) and the notes a user should read.

    Raises TextInputError for an empty text. A LongTextWarning becomes a note that says how
    the text was handled instead of a console warning nobody sees.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LongTextWarning)
        record = extract(loaded, text, long_text="truncate")[0]
    notes = [
        f"Text too long for the model: it has more than {loaded.max_length} tokens, so it was "
        f"truncated to its first {record.n_tokens} tokens ({w.message})."
        for w in caught
        if issubclass(w.category, LongTextWarning)
    ]
    notes.extend(input_notes(record, getattr(loaded.tokenizer, "unk_token", None)))
    return record, notes


def input_notes(record: AttentionRecord, unk_token: str | None = "[UNK]") -> list[str]:
    """Warnings about text the tokenizer could not represent (emoji, uncovered scripts)."""
    if not unk_token:
        return []
    unknown = [i for i, token in enumerate(record.tokens) if token == unk_token]
    if not unknown:
        return []
    words = sorted({record.text[slice(*record.offsets[i])] for i in unknown} - {""})
    shown = ", ".join(repr(w) for w in words[:8]) + (" …" if len(words) > 8 else "")
    return [
        f"{len(unknown)} of {record.n_tokens} tokens are unknown to the model's vocabulary "
        f"({unk_token}), e.g. {shown}: emoji or scripts the tokenizer does not cover. "
        "Their attention is still shown, but the model sees them all as the same token."
    ]


def token_labels(record: AttentionRecord) -> list[str]:
    """Unique hover/axis labels ``"12 · the"``: positions keep repeated tokens apart."""
    return [f"{i} · {token}" for i, token in enumerate(record.tokens)]


# ------------------------------------------------------------------------------------------
# A prepared text: gold graphs + projected vectors, computed once
# ------------------------------------------------------------------------------------------


class Projector(Protocol):
    """What ``sparsefinder.projections.HeadProjections`` offers to the views."""

    centroids: Mapping[int, Tensor]

    def project(self, layer: int, x: Tensor) -> Tensor: ...


@dataclass
class PreparedText:
    """One text ready for live prediction: gold graphs and, if available, projections.

    ``projected[l]`` is ``(q', k')`` of layer ``l``, each ``(heads, n, r)``; ``None`` when no
    projections match the model, in which case only the fixed patterns can be predicted.
    ``centroids`` maps B to ``(layers, heads, B, r)``.
    """

    record: AttentionRecord
    projected: list[tuple[Tensor, Tensor]] | None = None
    centroids: dict[int, Tensor] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    t_max: float = 1.0
    projections: Any = field(default=None, repr=False)  # HeadProjections (for sweeps)
    gold_counts: Tensor | None = field(default=None, repr=False)  # (layers, heads) |G|
    gold_sparsity: Tensor | None = field(default=None, repr=False)  # (layers, heads)
    sq_dists: list[Tensor | None] | None = field(default=None, repr=False)  # lazy, per layer

    @property
    def has_projections(self) -> bool:
        return self.projected is not None

    @property
    def num_layers(self) -> int:
        return self.record.num_layers

    @property
    def num_heads(self) -> int:
        return self.record.num_heads

    @property
    def n_tokens(self) -> int:
        return self.record.n_tokens

    def available_methods(self) -> list[str]:
        """Methods that can run on this text (learned ones need projections/centroids)."""
        methods = []
        if self.has_projections:
            methods += ["distance", "quantization"]
            if self.centroids:
                methods.append("kmeans")
        return [*methods, "fixed"]


@torch.inference_mode()
def prepare(
    record: AttentionRecord,
    projections: Projector | None = None,
    notes: Sequence[str] = (),
    *,
    t_range: bool = True,
) -> PreparedText:
    """Project every layer's queries and keys once; compute the slider range for t
    (``t_range=False`` skips that when no slider will be drawn)."""
    prepared = PreparedText(record=record, notes=list(notes))
    golds = record.gold_masks()
    prepared.gold_counts = torch.stack([count_true(g) for g in golds])
    prepared.gold_sparsity = torch.stack([sparsity(g, causal=record.causal) for g in golds])
    if projections is None:
        return prepared
    projected = []
    for index, layer in enumerate(record.layers):
        q = projections.project(index, layer.queries).float().contiguous()
        k = projections.project(index, layer.keys).float().contiguous()
        projected.append((q, k))
    prepared.projected = projected
    prepared.projections = projections
    prepared.centroids = {int(b): c.float() for b, c in dict(projections.centroids).items()}
    if t_range:
        prepared.t_max = distance_range(projected)
    return prepared


def distance_range(projected: Sequence[tuple[Tensor, Tensor]], quantile: float = 0.99) -> float:
    """Upper end of the t slider: a high quantile of the query–key distances, rounded up.

    Beyond it nearly every pair is an edge, so larger values only waste slider travel.
    """
    samples = []
    for q, k in projected:
        d = torch.cdist(q[:, ::4], k[:, ::4])  # a subsample is enough for a quantile
        samples.append(d.flatten())
    flat = torch.cat(samples) if samples else torch.ones(1)
    if flat.numel() > 1_000_000:
        flat = flat[torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(0))
                    [:1_000_000]]
    top = float(torch.quantile(flat, quantile)) if flat.numel() else 1.0
    return _round_up(max(top, 1e-3))


def _round_up(value: float) -> float:
    """Round up to 1, 2 or 5 × a power of ten (a slider end a person can read)."""
    exponent = math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        candidate = step * 10**exponent
        if candidate >= value:
            return float(candidate)
    return float(10 ** (exponent + 1))


def default_threshold(prepared: PreparedText) -> float:
    """A starting t: a quarter of the slider range, usually near the gold sparsity."""
    return round(prepared.t_max / 4, 6)


def clamp(state: ViewState, prepared: PreparedText) -> tuple[ViewState, list[str]]:
    """Fit a (possibly URL-given) state to this text and model; say what was changed.

    B goes to an available number of centroids, layer/head/query into range. The method is
    kept (so a shared URL keeps it) but a note says when it cannot run here.
    """
    notes: list[str] = []
    changes: dict[str, Any] = {}
    if effective_method(state, prepared) != state.method:
        notes.append(
            f"{METHODS[state.method]} needs learned projections for this model, which are not "
            "loaded: it is off, and only the window/global patterns are predicted."
        )
    if state.t is None or state.t > prepared.t_max:
        changes["t"] = default_threshold(prepared) if state.t is None else prepared.t_max
    if prepared.centroids:
        choices = sorted(prepared.centroids)
        if state.clusters not in choices:
            wanted = DEFAULT_CLUSTERS if state.clusters is None else state.clusters
            changes["clusters"] = min(choices, key=lambda b: (abs(b - wanted), b))
        clusters = changes.get("clusters", state.clusters)
        if state.top_k > clusters:
            changes["top_k"] = clusters
    for name, size in (
        ("layer", prepared.num_layers),
        ("head", prepared.num_heads),
        ("query", prepared.n_tokens),
    ):
        if getattr(state, name) >= size:
            changes[name] = size - 1
    return replace(state, **changes), notes


# ------------------------------------------------------------------------------------------
# Prediction and scores
# ------------------------------------------------------------------------------------------


def effective_method(state: ViewState, prepared: PreparedText) -> str:
    """The method that actually runs: a learned one without projections becomes "fixed"."""
    return state.method if state.method in prepared.available_methods() else "fixed"


def build_predictor(
    state: ViewState, layer: int, prepared: PreparedText
) -> Predictor | None:
    """The predictor the sliders stand for on one layer: learned part ∪ window ∪ global.

    ``None`` when nothing is switched on (the empty graph).
    """
    parts: list[Predictor] = []
    method = effective_method(state, prepared)
    if method == "distance":
        parts.append(Distance(threshold=float(state.t if state.t is not None else 0.0)))
    elif method == "quantization":
        parts.append(Quantization(bins=int(state.bins)))
    elif method == "kmeans":
        centroids = prepared.centroids[int(state.clusters)][layer]
        parts.append(KMeans.from_centroids(centroids, top_k=int(state.top_k)))
    if state.window > 0:
        parts.append(Window(size=int(state.window)))
    if state.global_tokens:
        parts.append(GlobalTokens(first="first" in state.global_tokens,
                                  last="last" in state.global_tokens))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else Union(*parts)


@torch.inference_mode()
def predict_layers(prepared: PreparedText, state: ViewState) -> list[Tensor]:
    """Predicted bool masks (heads, n, n) of every layer for the current slider values.

    For the distance method the squared query–key distances of the text are computed once
    (``pairwise_sq_dist``, the same numbers ``Distance`` compares) and kept on the prepared
    text, so moving the t slider is a single comparison per layer.
    """
    record = prepared.record
    method = effective_method(state, prepared)
    learned = method in LEARNED_METHODS
    fixed_only = state.with_(method="fixed")
    preds = []
    for index, layer in enumerate(record.layers):
        if method == "distance":
            threshold = float(state.t if state.t is not None else 0.0)
            mask = apply_causal(_sq_dists(prepared, index) <= threshold**2, record.causal)
            rest = build_predictor(fixed_only, index, prepared)
            if rest is not None:
                mask = mask | rest.predict(layer.queries, layer.keys, causal=record.causal)
            preds.append(mask)
            continue
        predictor = build_predictor(state, index, prepared)
        if predictor is None:
            preds.append(torch.zeros_like(layer.gold))
            continue
        if learned:
            q, k = prepared.projected[index]
        else:  # window/global only look at shapes
            q, k = layer.queries, layer.keys
        preds.append(predictor.predict(q, k, causal=record.causal))
    return preds


def _sq_dists(prepared: PreparedText, layer: int) -> Tensor:
    """Squared projected distances (heads, n, m) of one layer, computed on first use."""
    if prepared.sq_dists is None:
        prepared.sq_dists = [None] * prepared.num_layers
    if prepared.sq_dists[layer] is None:
        q, k = prepared.projected[layer]
        prepared.sq_dists[layer] = pairwise_sq_dist(q, k)
    return prepared.sq_dists[layer]


def score(prepared: PreparedText, preds: Sequence[Tensor]) -> GraphScores:
    """Recall, sparsity and gold sparsity of every (layer, head) of this text.

    The same numbers as ``metrics.score_layers``, but the gold side (|G| and gold sparsity)
    was counted once in :func:`prepare`: a slider move only counts |Ĝ ∧ G| and |Ĝ|.
    """
    record = prepared.record
    if prepared.gold_counts is None or len(preds) != record.num_layers:
        return score_layers(list(preds), record.gold_masks(), causal=record.causal)
    n, m = record.layers[0].gold.shape[-2:]
    allowed = causal_mask(n, m) if record.causal else None
    hits, kept = [], []
    for pred, layer in zip(preds, record.layers, strict=True):
        if allowed is not None:
            pred = pred & allowed
        hits.append(count_true(pred & layer.gold))
        kept.append(count_true(pred))
    total = prepared.gold_counts
    recalls = torch.where(total > 0, torch.stack(hits).double() / total.clamp(min=1), 1.0)
    denom = n_allowed_pairs(n, m, causal=record.causal)
    sparsities = 1.0 - torch.stack(kept).double() / denom if denom else torch.ones_like(recalls)
    return GraphScores(recall=recalls, sparsity=sparsities,
                       gold_sparsity=prepared.gold_sparsity)


@dataclass(frozen=True)
class Summary:
    """Recall / sparsity / gold sparsity at one scope (a head, a layer or the model)."""

    recall: float
    sparsity: float
    gold_sparsity: float


def summarize(scores: GraphScores, layer: int, head: int) -> dict[str, Summary]:
    """Head, layer (mean over heads) and model (mean over layers of layer means) values."""

    def at(select: Callable[[Tensor], Tensor]) -> Summary:
        return Summary(
            recall=float(select(scores.recall)),
            sparsity=float(select(scores.sparsity)),
            gold_sparsity=float(select(scores.gold_sparsity)),
        )

    return {
        "head": at(lambda x: x[layer, head]),
        "layer": at(lambda x: x[layer].mean()),
        "model": at(lambda x: x.mean(-1).mean()),
    }


def metrics_frame(scores: GraphScores) -> pd.DataFrame:
    """One row per (layer, head): recall, sparsity and gold sparsity (the CSV download)."""
    layers, heads = scores.recall.shape
    grid_layer, grid_head = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
    return pd.DataFrame({
        "layer": grid_layer.ravel(),
        "head": grid_head.ravel(),
        "recall": scores.recall.numpy().ravel(),
        "sparsity": scores.sparsity.numpy().ravel(),
        "gold_sparsity": scores.gold_sparsity.numpy().ravel(),
    })


# ------------------------------------------------------------------------------------------
# Diff of a predicted and a gold graph; edge tables
# ------------------------------------------------------------------------------------------

DIFF_NONE, DIFF_TP, DIFF_FN, DIFF_FP = 0, 1, 2, 3


def diff_codes(pred: Tensor, gold: Tensor) -> np.ndarray:
    """uint8 (n, m): 0 neither, 1 true positive, 2 missed gold edge (FN), 3 extra edge (FP)."""
    if pred.shape != gold.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and gold {tuple(gold.shape)} must match")
    p = pred.numpy().astype(np.uint8)
    g = gold.numpy().astype(np.uint8)
    # TP: 1·1 = 1; FN: 1·2 = 2; FP: 1·1·3 = 3; neither: 0
    return (g * (2 - p) + p * (1 - g) * 3).astype(np.uint8)


def diff_counts(codes: np.ndarray) -> dict[str, int]:
    """Number of TP, FN and FP cells of a diff."""
    counts = np.bincount(codes.ravel(), minlength=4)
    return {name: int(counts[i]) for i, name in enumerate(_DIFF_NAMES) if i}


def edges_frame(
    record: AttentionRecord, layer: int, head: int, pred: Tensor | None = None
) -> pd.DataFrame:
    """Every gold or predicted edge of one head, with tokens, probability and status.

    Columns: query, key, query_token, key_token, gold_prob, gold, predicted, status
    (TP/FN/FP; "gold" when no prediction is given).
    """
    graph = record.layers[layer]
    gold = graph.gold[head]
    probs = graph.probs()[head]
    union = gold if pred is None else gold | pred
    rows, cols = (x.numpy() for x in union.nonzero(as_tuple=True))
    gold_at = gold.numpy()[rows, cols]
    tokens = np.asarray(record.tokens, dtype=object)
    frame = pd.DataFrame({
        "query": rows,
        "key": cols,
        "query_token": tokens[rows] if len(rows) else [],
        "key_token": tokens[cols] if len(cols) else [],
        "gold_prob": probs.numpy()[rows, cols],
        "gold": gold_at,
    })
    if pred is None:
        frame["status"] = "gold"
    else:
        pred_at = pred.numpy()[rows, cols]
        frame["predicted"] = pred_at
        frame["status"] = np.where(gold_at & pred_at, "TP", np.where(gold_at, "FN", "FP"))
    return frame


def token_row_frame(
    record: AttentionRecord, preds: Sequence[Tensor], layer: int, query: int
) -> pd.DataFrame:
    """Token view: for one query token, every head's gold probability and prediction per key.

    Only one row of each (n × n) matrix, so it stays readable (and small) at 512 tokens.
    Columns: head, key, key_token, gold_prob, gold, predicted, status.
    """
    graph = record.layers[layer]
    gold = graph.gold[:, query, :]  # (heads, m)
    pred = preds[layer][:, query, :]
    probs = graph.probs()[:, query, :]
    heads, m = gold.shape
    head_ids, key_ids = np.meshgrid(np.arange(heads), np.arange(m), indexing="ij")
    g = gold.numpy().ravel()
    p = pred.numpy().ravel()
    return pd.DataFrame({
        "head": head_ids.ravel(),
        "key": key_ids.ravel(),
        "key_token": np.asarray(record.tokens, dtype=object)[key_ids.ravel()],
        "gold_prob": probs.numpy().ravel(),
        "gold": g,
        "predicted": p,
        "status": np.where(g & p, "TP", np.where(g, "FN", np.where(p, "FP", ""))),
    })


# ------------------------------------------------------------------------------------------
# Downloads
# ------------------------------------------------------------------------------------------


def to_csv(frame: pd.DataFrame) -> bytes:
    """A data frame as UTF-8 CSV bytes (what a download button serves)."""
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False)
    return buffer.getvalue().encode("utf-8")


def to_json(payload: Any) -> bytes:
    """A dict/list (dataclasses, tensors and frames allowed) as pretty UTF-8 JSON bytes."""
    return json.dumps(_plain(payload), indent=2, ensure_ascii=False).encode("utf-8")


def _plain(value: Any) -> Any:
    if isinstance(value, pd.DataFrame):
        return value.to_dict(orient="records")
    if isinstance(value, Tensor):
        return value.tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "__dataclass_fields__"):
        return _plain(asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def view_report(
    state: ViewState, scores: GraphScores, model_id: str, alpha: float, n_tokens: int
) -> dict[str, Any]:
    """The metrics behind the explorer as one JSON-able dict (reproducible: it has the state)."""
    return {
        "model": model_id,
        "alpha": alpha,
        "n_tokens": n_tokens,
        "state": asdict(state),
        "summary": summarize(scores, state.layer, state.head),
        "per_head": metrics_frame(scores),
    }


def token_row_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per head of a token row: gold/predicted edge counts, TP/FN/FP and the row's recall."""
    grouped = frame.groupby("head")
    out = pd.DataFrame({
        "gold_edges": grouped["gold"].sum(),
        "predicted_edges": grouped["predicted"].sum(),
        "TP": grouped["status"].apply(lambda s: int((s == "TP").sum())),
        "FN": grouped["status"].apply(lambda s: int((s == "FN").sum())),
        "FP": grouped["status"].apply(lambda s: int((s == "FP").sum())),
    })
    out["recall"] = np.where(out["gold_edges"] > 0, out["TP"] / out["gold_edges"].clip(lower=1),
                             1.0)
    return out.reset_index()


# ------------------------------------------------------------------------------------------
# Sparsity–recall sweeps for the Pareto page
# ------------------------------------------------------------------------------------------

ProgressFn = Callable[[float, str], None]


def sweep_methods(projections: Any | None) -> tuple[list[str], dict[str, str]]:
    """Registered sweep methods that can run with these projections, and why others cannot.

    A method is skipped when it needs projections and there are none, or when a grid point
    cannot be built (e.g. k-means centroids for a B the file does not hold).
    """
    from sparsefinder import pareto

    available: list[str] = []
    skipped: dict[str, str] = {}
    for name, spec in pareto.METHODS.items():
        if spec.needs_projection and projections is None:
            skipped[name] = "needs learned projections"
            continue
        try:
            for params in spec.grid:
                spec.factory(params, projections, 0)
        except (ValueError, KeyError, RuntimeError) as error:
            skipped[name] = str(error).split(";")[0]
            continue
        available.append(name)
    return available, skipped


def sweep_records(
    records: Sequence[AttentionRecord],
    projections: Any | None,
    methods: Sequence[str],
    on_progress: ProgressFn | None = None,
) -> pd.DataFrame:
    """``pareto.sweep`` method by method, reporting progress (the sweep itself is silent)."""
    from sparsefinder import pareto

    if not methods:
        raise ValueError("no sweep method can run here (learned methods need projections)")
    frames = []
    for index, name in enumerate(methods):
        if on_progress:
            on_progress(index / len(methods), f"sweeping {name} ({index + 1}/{len(methods)})")
        frames.append(pareto.sweep(records, projections, [name]))
    out = pd.concat(frames, ignore_index=True)
    out.attrs = dict(frames[0].attrs)
    if on_progress:
        on_progress(1.0, "done")
    return out


def corpus_records(
    loaded: Any,
    corpus: str = "default",
    split: str = "validation",
    max_passages: int | None = None,
    batch_size: int = 8,
    on_progress: ProgressFn | None = None,
) -> list[AttentionRecord]:
    """Gold graphs of a corpus split (chunked to the model's length, never truncated)."""
    from sparsefinder.corpus import chunk_passages, load_corpus

    passages = load_corpus(corpus, None if split == "all" else split)
    if max_passages is not None:
        passages = passages[:max_passages]
    texts = chunk_passages(passages, loaded.tokenizer, loaded.max_length)
    records: list[AttentionRecord] = []
    for start in range(0, len(texts), batch_size):
        if on_progress:
            on_progress(start / max(len(texts), 1),
                        f"gold graphs: text {start + 1}–{min(start + batch_size, len(texts))} "
                        f"of {len(texts)}")
        records.extend(extract(loaded, texts[start:start + batch_size], batch_size=batch_size,
                               long_text="error"))
    if on_progress:
        on_progress(1.0, f"{len(records)} texts")
    return records


def score_state(
    records: Sequence[AttentionRecord], projections: Any | None, state: ViewState
) -> Summary:
    """Macro-averaged recall/sparsity of the current slider setting on several texts."""
    from sparsefinder.metrics import macro_average

    per_text = []
    for record in records:
        prepared = prepare(record, projections, t_range=False)
        per_text.append(score(prepared, predict_layers(prepared, state)))
    avg = macro_average(per_text)
    return Summary(recall=float(avg["recall"]), sparsity=float(avg["sparsity"]),
                   gold_sparsity=float(avg["gold_sparsity"]))


def describe_state(state: ViewState, prepared: PreparedText | None = None) -> str:
    """Short label of the predictor a state stands for, e.g. "k-means B=8 k=1 ∪ window 3"."""
    method = effective_method(state, prepared) if prepared is not None else state.method
    parts = {
        "distance": f"distance t={state.t:.3g}" if state.t is not None else "distance",
        "quantization": f"quantization β={state.bins}",
        "kmeans": f"k-means B={state.clusters} k={state.top_k}",
        "fixed": "",
    }
    pieces = [parts[method]] if parts[method] else []
    if state.window:
        pieces.append(f"window {state.window}")
    if state.global_tokens:
        pieces.append("global " + "+".join(state.global_tokens))
    return " ∪ ".join(pieces) or "empty graph"


# ------------------------------------------------------------------------------------------
# Clusters and coreference pages
# ------------------------------------------------------------------------------------------


def head_cluster_ids(prepared: PreparedText, layer: int, head: int, clusters: int,
                     top_k: int) -> tuple[Tensor, Tensor]:
    """Nearest-first k-means cluster ids ``(query (n, top_k), key (m, top_k))`` of one head
    of the prepared text (its cached projected vectors and the B = ``clusters`` centroids)."""
    from sparsefinder.clusters import head_assignments

    if not prepared.has_projections or int(clusters) not in prepared.centroids:
        raise ValueError(f"no projections with B={clusters} centroids for this text")
    q, k = prepared.projected[layer]
    return head_assignments(q, k, prepared.centroids[int(clusters)][layer], head, int(top_k))


def cluster_masks(query_ids: Tensor, key_ids: Tensor, cluster: int,
                  gold: Tensor) -> tuple[Tensor, Tensor]:
    """One cluster's view of a head: ``(gold edges of the cluster's queries, the cluster's
    predicted edges)``, both bool (n, m).

    The predicted edges are the pairs whose query and key both join ``cluster``; the gold
    edges are every gold edge of a query row in the cluster (so missed ones show as FN).
    """
    from sparsefinder.clusters import cluster_edges

    q = query_ids if query_ids.dim() == 2 else query_ids[:, None]
    rows = (q == cluster).any(-1)
    return gold & rows[:, None], cluster_edges(query_ids, key_ids, cluster)


def parse_cluster(value: str | Sequence[str] | None, clusters: int | None = None) -> int | None:
    """The ``cluster`` URL parameter → a cluster id, or None when absent, malformed or (given
    ``clusters`` = B) out of range: a hand-edited URL never raises."""
    if value is not None and not isinstance(value, str):
        value = value[-1] if len(value) else None
    if value is None:
        return None
    try:
        cluster = _parse_int(value.strip(), 0, None if clusters is None else int(clusters) - 1)
    except (ValueError, OverflowError):
        return None
    return cluster


def cluster_from_point(point: Mapping[str, Any], clusters: Sequence[Any]) -> int | None:
    """The cluster of a clicked bar segment of the POS × cluster chart (one trace a cluster):
    its ``legendgroup`` (the cluster id), else its ``curve_number`` into ``clusters`` (the
    traces' order); None when the point names neither."""
    group = point.get("legendgroup")
    if group not in (None, ""):
        try:
            return int(group)
        except (TypeError, ValueError):
            pass
    curve = point.get("curve_number")
    if isinstance(curve, int) and 0 <= curve < len(clusters):
        return int(clusters[curve])
    return None


def cluster_highlight(prepared: PreparedText, layer: int, head: int, clusters: int,
                      top_k: int, cluster: int) -> tuple[Tensor, Tensor]:
    """What the Explorer outlines for one k-means cluster of a head: ``(query rows in the
    cluster (n,), the cluster's edges (n, m))``, both bool — the edges are the pairs whose
    query and key both join ``cluster`` (see :func:`cluster_masks`)."""
    from sparsefinder.clusters import cluster_edges

    q_ids, k_ids = head_cluster_ids(prepared, layer, head, clusters, top_k)
    q = q_ids if q_ids.dim() == 2 else q_ids[:, None]
    return (q == cluster).any(-1), cluster_edges(q_ids, k_ids, cluster)


def highlight_html(text: str, offsets: Sequence[tuple[int, int]],
                   positions: Sequence[int]) -> str:
    """``text`` as HTML with the characters of the tokens at ``positions`` in ``<mark>``.

    Everything is escaped; overlapping or adjacent token spans merge into one mark; empty
    spans (special tokens) mark nothing. Line breaks become ``<br>``.
    """
    import html

    covered = np.zeros(len(text) + 1, dtype=bool)
    for position in positions:
        start, end = offsets[position]
        covered[max(start, 0):min(end, len(text))] = True
    pieces: list[str] = []
    index = 0
    while index < len(text):
        end = index
        while end < len(text) and covered[end] == covered[index]:
            end += 1
        chunk = html.escape(text[index:end]).replace("\n", "<br>")
        pieces.append(f"<mark>{chunk}</mark>" if covered[index] else chunk)
        index = end
    return "".join(pieces)


@torch.inference_mode()
def kmeans_layer_mask(prepared: PreparedText, layer: int, clusters: int,
                      top_k: int) -> Tensor:
    """Sparsefinder k-means graph alone (no window/global) of one layer: bool (heads, n, m)."""
    if not prepared.has_projections or int(clusters) not in prepared.centroids:
        raise ValueError(f"no projections with B={clusters} centroids for this text")
    q, k = prepared.projected[layer]
    km = KMeans.from_centroids(prepared.centroids[int(clusters)][layer], top_k=int(top_k))
    return km.predict(q, k, causal=prepared.record.causal)


def pronoun_rows_frame(record: AttentionRecord, layer: int, head: int,
                       pairs: Sequence[Any], pred: Tensor | None = None) -> pd.DataFrame:
    """Only the pronoun rows of one head, tidy: one row per (pronoun token, key token).

    ``pairs`` are :class:`sparsefinder.coref.PairTokens`; ``pred`` the predicted (n, m) mask
    of the head (or None). Columns: pair, query, query_token, key, key_token, prob (gold
    α-entmax probability), gold (edge), predicted, antecedent (key is the pair's antecedent).
    """
    probs = record.layers[layer].probs()[head]
    frames = []
    n = record.n_tokens
    for index, pair in enumerate(pairs):
        antecedent = np.zeros(n, dtype=bool)
        antecedent[pair.antecedent] = True
        for row in pair.pronoun:
            values = probs[int(row)].float().numpy()
            frames.append(pd.DataFrame({
                "pair": index,
                "query": int(row),
                "query_token": record.tokens[int(row)],
                "key": np.arange(n),
                "key_token": record.tokens,
                "prob": values,
                "gold": values > 0,
                "predicted": (pred[int(row)].numpy() if pred is not None
                              else np.zeros(n, dtype=bool)),
                "antecedent": antecedent,
            }))
    return pd.concat(frames, ignore_index=True)
