"""Per-head projections of queries and keys (paper §4.2) and their contrastive training.

Every head ``h`` of every layer gets one linear map ``g(x) = W x + b`` from the head dimension
``d`` to ``r`` (4 by default), shared by queries and keys so that both live in one space where
"close" means "probably an edge of the α-entmax graph". It is trained with the hinge loss of
paper Eq. 7,

    L = [ω + ‖q' − k'_P‖² − ‖q' − k'_N‖²]₊ ,

where ``(q, k_P)`` is a gold edge and ``k_N`` a key drawn uniformly from the non-edges of the
SAME query row (only past keys for causal records), so the negative is exactly what a
predictor must leave out of that row. The bias cancels in every difference ``q' − k'``: it is
not trained and only centres the projected tokens (``b = −W·mean``), which makes plots and
centroids easier to read and changes no prediction.

Training (:func:`train_projections`) is batched over the heads of a layer: parameters are
``(heads, r, d)`` and a step takes the same number of positives from every head. Heads differ
a lot in their number of edges (×20 in MiniLM), so an epoch is ``ceil(max_h P_h / batch)``
steps and heads with fewer positives cycle through their (shuffled) positives; every positive
of every head is seen at least once per epoch. The negatives of an epoch are drawn up front,
vectorised: a uniform column of the row is rejected if it is an edge and redrawn (a few rounds);
the few rows still unlucky (rows that are nearly all edges) are sampled exactly among their
non-edges; rows without any non-edge are skipped.

Initialisation ("discriminative", default): the top-``r`` generalised eigenvectors of
``C_N v = λ C_P v``, with ``C_P``/``C_N`` the second moments of positive/negative differences
``q − k`` (a Fisher/LDA-style start: large spread of negatives, small spread of positives),
from a sample of pairs, scaled so that the mean positive squared distance equals the margin;
Adam then refines it. Its point is robustness, not a better optimum: the start is already on
the margin's scale whatever the norm of a model's queries and keys, so the few hundred large
batch steps we take (the paper's batch of 16 would need ~10⁶ steps here) are spent refining.
On MiniLM's train split both inits end at the same hinge loss and the same held-out recall
(±1 point); the discriminative start begins at a ~2× lower loss. ``init="random"``
(Gaussian, std ``1/√d``) is the paper-style alternative.

Known limitation (measured on MiniLM): because one map serves queries and keys, the two
projected clouds keep a mean offset ``W(μ_q − μ_k)`` about as large as their spread. It is
useful — it encodes which keys every query attends to — and removing it (training with
``W δ = 0``) cost ~10 recall points for Distance and ~5 for k-means. But it means k-means on
queries ∪ keys puts queries and keys partly in different clusters: B = 2 already gives a
sparsity of ~0.78, so the top-1 k-means curve has no point at lower sparsity (``top_k=2``
covers that range). Centring queries and keys separately (what separate query/key biases
would do) measured the same as removing the offset: balanced clusters, lower recall.

Files (:meth:`HeadProjections.save`/:meth:`HeadProjections.load`) are one small ``torch.save``
of plain tensors and a metadata dict, loadable with ``weights_only=True`` (no code runs on
load), with k-means centroids per number of clusters B stored alongside.

Two kinds of projections (``HeadProjections.kind``):

- ``"shared"`` (format version 1, the bundled file): one affine map for queries and keys, as
  above; written by the ``paper`` (Eq. 7 hinge) and ``logistic`` objectives.
- ``"augmented"`` (format version 2): separate affine maps ``q̂ = A q + a``, ``k̂ = B k + b``
  (``r`` rows each) whose inner product ``q̂·k̂`` approximates a score, turned into a Euclidean
  distance by the inner-product-to-distance augmentation
  ``q̃ = [q̂, √(R_q² − ‖q̂‖²), 0]``, ``k̃ = [k̂, 0, √(R_k² − ‖k̂‖²)]``, so that
  ``‖q̃ − k̃‖² = R_q² + R_k² − 2 q̂·k̂``: a distance threshold IS a score threshold and every
  distance predictor works unchanged, at a cost of ``O(n·m·(r + 2))``. ``R_q``/``R_k`` are
  per-head radii (the largest train norm with some slack; a larger test norm is clamped,
  which only overestimates that token's distances). See :mod:`sparsefinder.projections.lowrank`.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from sparsefinder.attention.masks import allowed_per_row, apply_causal
from sparsefinder.data.records import AttentionRecord
from sparsefinder.models.loading import DEFAULT_MODEL, DEFAULT_MODEL_ID
from sparsefinder.predictors.kmeans import KMeans
from sparsefinder.resources import BUNDLED_PROJECTIONS  # noqa: F401  (re-exported)
from sparsefinder.serving import InputRefused, check_projections_bytes

FORMAT = "sparsefinder-projections"
FORMAT_VERSION = 1  # shared projections; augmented ones are written as version 2
FORMAT_VERSION_AUGMENTED = 2
READABLE_VERSIONS = (FORMAT_VERSION, FORMAT_VERSION_AUGMENTED)
KINDS = ("shared", "augmented")
_REJECTION_ROUNDS = 8
_EXACT_CHUNK = 16_384  # rows sampled exactly at once after rejection sampling gave up
_INIT_SAMPLE = 50_000  # pairs per head used to estimate the second moments of the init


class ProjectionsError(ValueError):
    """A projections file cannot be used; the message names the file and how to regenerate."""


def _train_hint(model_id: str | None, extra: str = "") -> str:
    name = "default" if model_id in (None, "", DEFAULT_MODEL_ID) else model_id
    return f"`sparsefinder train --model {name} --out DIR{extra}`"


@dataclass
class HeadProjections:
    """Learned per-head maps ``d → r`` for every layer, plus optional k-means centroids.

    ``weight`` is float32 (layers, heads, r, d), ``bias`` float32 (layers, heads, r);
    ``centroids`` maps a number of clusters B to float32 (layers, heads, B, dim) centroids in
    the projected space. ``metadata`` holds plain values only (how it was trained; the
    objective under ``"objective"``).

    ``kind="augmented"`` (see the module docstring): ``weight``/``bias`` map queries,
    ``key_weight``/``key_bias`` map keys, ``query_radius``/``key_radius`` (layers, heads) are
    the augmentation radii and projected vectors have ``dim = r + 2`` coordinates.
    """

    weight: Tensor
    bias: Tensor
    model_id: str
    alpha: float
    metadata: dict[str, Any] = field(default_factory=dict)
    centroids: dict[int, Tensor] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    kind: str = "shared"
    key_weight: Tensor | None = None
    key_bias: Tensor | None = None
    query_radius: Tensor | None = None
    key_radius: Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.weight, Tensor) or self.weight.dim() != 4:
            raise ValueError(
                f"weight must be a tensor (layers, heads, r, d), got {_shape(self.weight)}"
            )
        if not isinstance(self.bias, Tensor) or tuple(self.bias.shape) != tuple(
            self.weight.shape[:3]
        ):
            raise ValueError(
                f"bias must be a tensor (layers, heads, r) = {tuple(self.weight.shape[:3])}, "
                f"got {_shape(self.bias)}"
            )
        self.weight = self.weight.detach().float().contiguous()
        self.bias = self.bias.detach().float().contiguous()
        self._check_kind()
        for b, c in self.centroids.items():
            expected = (*self.weight.shape[:2], b, self.dim)
            if not isinstance(c, Tensor) or tuple(c.shape) != expected:
                raise ValueError(f"centroids[{b}] must have shape {expected}, got {_shape(c)}")

    def _check_kind(self) -> None:
        extra = ("key_weight", "key_bias", "query_radius", "key_radius")
        if self.kind == "shared":
            given = [name for name in extra if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} only exist for kind='augmented' projections")
            return
        if self.kind != "augmented":
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        shapes = {
            "key_weight": tuple(self.weight.shape), "key_bias": tuple(self.bias.shape),
            "query_radius": tuple(self.weight.shape[:2]),
            "key_radius": tuple(self.weight.shape[:2]),
        }
        for name, shape in shapes.items():
            value = getattr(self, name)
            if not isinstance(value, Tensor) or tuple(value.shape) != shape:
                raise ValueError(
                    f"augmented projections need {name} of shape {shape}, got {_shape(value)}"
                )
            setattr(self, name, value.detach().float().contiguous())

    @property
    def objective(self) -> str:
        """How the maps were obtained ("paper", "logistic", "lowrank"); old files: "paper"."""
        return str(self.metadata.get("objective", "paper"))

    @property
    def dim(self) -> int:
        """Number of coordinates of a projected vector: ``r``, or ``r + 2`` when augmented."""
        return self.rank + (2 if self.kind == "augmented" else 0)

    @property
    def num_layers(self) -> int:
        return int(self.weight.shape[0])

    @property
    def num_heads(self) -> int:
        return int(self.weight.shape[1])

    @property
    def rank(self) -> int:
        return int(self.weight.shape[2])

    @property
    def head_dim(self) -> int:
        return int(self.weight.shape[3])

    # ---------------------------------------------------------------- projecting

    def project(self, layer: int, x: Tensor, side: str | None = None) -> Tensor:
        """Project queries or keys of one layer: (heads, n, d) → (heads, n, dim), one bmm.

        ``side`` ("query" or "key") is required for augmented projections, which map the two
        differently; shared projections ignore it.
        """
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be in [0, {self.num_layers}), got {layer}")
        if x.dim() != 3 or x.shape[0] != self.num_heads or x.shape[2] != self.head_dim:
            raise ValueError(
                f"expected x of shape (heads={self.num_heads}, n, d={self.head_dim}), "
                f"got {tuple(x.shape)}"
            )
        if self.kind == "shared":
            w = self.weight[layer].to(x.device)
            b = self.bias[layer].to(x.device)
            return torch.baddbmm(b[:, None, :], x.float(), w.transpose(-1, -2))
        if side not in ("query", "key"):
            raise ValueError(
                "these projections map queries and keys differently (kind='augmented'); "
                f"pass side='query' or side='key' (or use project_queries/project_keys), "
                f"got side={side!r}"
            )
        query = side == "query"
        w = (self.weight if query else self.key_weight)[layer].to(x.device)
        b = (self.bias if query else self.key_bias)[layer].to(x.device)
        radius = (self.query_radius if query else self.key_radius)[layer].to(x.device)
        z = torch.baddbmm(b[:, None, :], x.float(), w.transpose(-1, -2))
        pad = (radius[:, None].square() - z.square().sum(-1)).clamp(min=0.0).sqrt()[..., None]
        zero = torch.zeros_like(pad)
        return torch.cat([z, pad, zero] if query else [z, zero, pad], dim=-1)

    def project_queries(self, layer: int, q: Tensor) -> Tensor:
        """Projected queries (heads, n, dim) of one layer."""
        return self.project(layer, q, side="query")

    def project_keys(self, layer: int, k: Tensor) -> Tensor:
        """Projected keys (heads, m, dim) of one layer."""
        return self.project(layer, k, side="key")

    def check_record(self, record: AttentionRecord) -> None:
        """Fail with a clear message when a record comes from a differently shaped model."""
        if not record.layers:
            raise ValueError("the record has no layers")
        q = record.layers[0].queries
        got = (record.num_layers, int(q.shape[0]), int(q.shape[2]))
        want = (self.num_layers, self.num_heads, self.head_dim)
        if got != want:
            raise ProjectionsError(
                f"projections for {self.model_id} expect (layers, heads, head_dim) = {want}, "
                f"but the text's attention has {got}; train projections for this model with "
                f"{_train_hint(None)}"
            )

    def project_record(self, record: AttentionRecord) -> list[tuple[Tensor, Tensor]]:
        """``(q', k')`` per layer of one text, each (heads, n, r) / (heads, m, r)."""
        self.check_record(record)
        return [
            (self.project_queries(i, layer.queries), self.project_keys(i, layer.keys))
            for i, layer in enumerate(record.layers)
        ]

    def kmeans(self, layer: int, n_clusters: int, top_k: int = 1) -> KMeans:
        """A k-means predictor for one layer from the stored centroids."""
        if n_clusters not in self.centroids and self.kind == "augmented":
            raise ProjectionsError(
                "augmented (low-rank) projections hold no k-means centroids: the augmentation "
                "puts queries and keys in different coordinates, so clusters separate them; "
                "use shared projections (e.g. the bundled projections.pt) for k-means"
            )
        if n_clusters not in self.centroids:
            stored = ", ".join(map(str, sorted(self.centroids))) or "none"
            raise ProjectionsError(
                f"no k-means centroids for B={n_clusters} in these projections (stored: "
                f"{stored}); retrain with {_train_hint(self.model_id, f' --clusters {n_clusters}')}"
            )
        return KMeans.from_centroids(self.centroids[n_clusters][layer], top_k=top_k)

    # ---------------------------------------------------------------- files

    def to_payload(self) -> dict[str, Any]:
        """Plain dict of tensors and primitives (what ``save`` writes).

        Shared projections are written as format version 1 (readable by older versions of
        sparsefinder); augmented ones as version 2, which older versions refuse clearly.
        """
        payload = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION if self.kind == "shared" else FORMAT_VERSION_AUGMENTED,
            "model_id": self.model_id,
            "alpha": float(self.alpha),
            "rank": self.rank,
            "weight": self.weight,
            "bias": self.bias,
            "centroids": {int(b): c.float().contiguous() for b, c in self.centroids.items()},
            "metadata": dict(self.metadata),
        }
        if self.kind != "shared":
            payload.update({
                "kind": self.kind, "key_weight": self.key_weight, "key_bias": self.key_bias,
                "query_radius": self.query_radius, "key_radius": self.key_radius,
            })
        return payload

    def save(self, path: str | Path) -> Path:
        """Write one small file (atomically: a crash never leaves half a file behind)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(self.to_payload(), tmp)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(
        cls,
        path: str | Path,
        expected_model_id: str | None = None,
        expected_alpha: float | None = None,
        max_bytes: int | None = None,
    ) -> HeadProjections:
        """Read a file written by :meth:`save`; refuse files for another model or format.

        ``expected_alpha`` only warns: projections trained at another α still work, less well.
        ``max_bytes`` refuses larger files before ``torch.load`` reads them (a served app).
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"projections file {path} not found; create it with "
                f"{_train_hint(expected_model_id)} (it writes DIR/projections.pt)"
            )
        try:
            check_projections_bytes(path.stat().st_size, max_bytes, path.name)
        except InputRefused as error:
            raise ProjectionsError(str(error)) from error
        regen = f"regenerate it with {_train_hint(expected_model_id)}"
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # torch raises many types for a bad zip/pickle
            # torch's own text (zip internals, unpickler hints) and the folder help nobody.
            raise ProjectionsError(
                f"{path.name} is corrupt or truncated: it is not a readable Sparsefinder "
                f"projections file; {regen}"
            ) from error
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise ProjectionsError(
                f"{path} is not a Sparsefinder projections file (no '{FORMAT}' marker); {regen}"
            )
        version = payload.get("format_version")
        if version not in READABLE_VERSIONS:
            raise ProjectionsError(
                f"{path} has projections format version {version!r}, but this version of "
                f"sparsefinder reads versions {READABLE_VERSIONS}; {regen}"
            )
        model_id = payload.get("model_id")
        if expected_model_id == DEFAULT_MODEL:  # the alias names the bundled model
            expected_model_id = DEFAULT_MODEL_ID
        if expected_model_id is not None and model_id != expected_model_id:
            raise ProjectionsError(
                f"projections in {path} were trained for model {model_id}, but the loaded model "
                f"is {expected_model_id}; train new ones with {_train_hint(expected_model_id)}"
            )
        try:
            projections = cls(
                weight=payload["weight"],
                bias=payload["bias"],
                model_id=str(model_id),
                alpha=float(payload["alpha"]),
                metadata=dict(payload.get("metadata") or {}),
                centroids={int(b): c for b, c in (payload.get("centroids") or {}).items()},
                format_version=int(version),
                kind=str(payload.get("kind", "shared")),
                **{name: payload.get(name) for name in (
                    "key_weight", "key_bias", "query_radius", "key_radius")},
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ProjectionsError(f"{path} is damaged ({error}); {regen}") from error
        if expected_alpha is not None and not math.isclose(projections.alpha, expected_alpha):
            warnings.warn(
                f"projections in {path} were trained at alpha={projections.alpha}, the model "
                f"runs at alpha={expected_alpha}; predictions will be less accurate",
                UserWarning,
                stacklevel=2,
            )
        return projections


def _shape(x: object) -> object:
    return tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__


# ==================================================================== training data


@dataclass
class _LayerPairs:
    """All gold edges of one layer over many texts, indexed into flat token tables."""

    q_table: Tensor  # (heads * Tq, d): row h * Tq + t
    k_table: Tensor  # (heads * Tk, d)
    head: Tensor  # (P,) long
    q_row: Tensor  # (P,) row into q_table
    k_row: Tensor  # (P,) row into k_table (the positive key)
    k_base: Tensor  # (P,) row into k_table of key 0 of this head/text
    n_allowed: Tensor  # (P,) keys this query may see (m, or the past only when causal)
    gold_base: Tensor  # (P,) index into gold_flat of (this head, this query, key 0)
    gold_flat: Tensor  # bool: every text's gold mask of this layer, flattened
    gold_edges: Tensor  # (heads,) all gold edges of each head, with or without a non-edge

    def first_negative_differences(self, ids: Tensor, neg_rows: Tensor) -> tuple[Tensor, Tensor]:
        """q − k of the positives ``ids`` (heads, S) and of each one's first negative:
        two (heads, S, d) tensors (what the initialisations average over)."""
        heads, size = ids.shape
        flat = ids.reshape(-1)
        q = self.q_table.index_select(0, self.q_row[flat])
        dp = (q - self.k_table.index_select(0, self.k_row[flat])).view(heads, size, -1)
        dn = (q - self.k_table.index_select(0, neg_rows[flat, 0])).view(heads, size, -1)
        return dp, dn

    def batch_differences(self, q_rows: Tensor, k_rows: Tensor, n_rows: Tensor
                          ) -> tuple[Tensor, Tensor]:
        """q − k of a batch's positives (heads, B, d) and of their ``num`` negatives each
        (heads, B·num, d), from table rows (heads, B) and (heads, B, num)."""
        heads, size, num = n_rows.shape
        d = self.q_table.shape[1]
        q = self.q_table.index_select(0, q_rows.reshape(-1)).view(heads, size, 1, d)
        diff_pos = q[:, :, 0] - self.k_table.index_select(0, k_rows.reshape(-1)).view(
            heads, size, d)
        diff_neg = (q - self.k_table.index_select(0, n_rows.reshape(-1)).view(
            heads, size, num, d)).view(heads, size * num, d)
        return diff_pos, diff_neg


def _layer_pairs(records: Sequence[AttentionRecord], layer: int) -> _LayerPairs:
    """Gathers the positives of one layer; rows without any non-edge are dropped."""
    graphs = [r.layers[layer] for r in records]
    heads = int(graphs[0].queries.shape[0])
    tq = sum(int(g.queries.shape[1]) for g in graphs)
    tk = sum(int(g.keys.shape[1]) for g in graphs)
    parts: dict[str, list[Tensor]] = {k: [] for k in ("h", "q", "k", "kb", "na", "gb")}
    q_off = k_off = g_off = 0
    gold_edges = torch.zeros(heads, dtype=torch.long)
    for record, g in zip(records, graphs, strict=True):
        n, m = int(g.gold.shape[1]), int(g.gold.shape[2])
        allowed = allowed_per_row(n, m, causal=record.causal)
        gold = apply_causal(g.gold, record.causal)
        gold_edges += gold.sum((-2, -1))
        has_negative = gold.sum(-1) < allowed  # (heads, n)
        h, i, j = (gold & has_negative[..., None]).nonzero(as_tuple=True)
        parts["h"].append(h)
        parts["q"].append(h * tq + q_off + i)
        parts["k"].append(h * tk + k_off + j)
        parts["kb"].append(h * tk + k_off)
        parts["na"].append(allowed[i])
        parts["gb"].append(g_off + (h * n + i) * m)
        q_off, k_off, g_off = q_off + n, k_off + m, g_off + heads * n * m
    cat = {k: torch.cat(v) for k, v in parts.items()}
    q_table = torch.cat([g.queries for g in graphs], dim=1).reshape(heads * tq, -1)
    k_table = torch.cat([g.keys for g in graphs], dim=1).reshape(heads * tk, -1)
    gold_flat = torch.cat([g.gold.reshape(-1) for g in graphs])
    return _LayerPairs(
        q_table=q_table.float(),
        k_table=k_table.float(),
        head=cat["h"],
        q_row=cat["q"],
        k_row=cat["k"],
        k_base=cat["kb"],
        n_allowed=cat["na"],
        gold_base=cat["gb"],
        gold_flat=gold_flat,
        gold_edges=gold_edges,
    )


def sample_negatives(
    gold_flat: Tensor,
    gold_base: Tensor,
    n_allowed: Tensor,
    num: int,
    generator: torch.Generator,
) -> Tensor:
    """Column of a uniform non-edge in the row of each positive: (P,) → long (P, num).

    ``gold_flat[gold_base[p] + j]`` is the gold bit of key ``j`` in the row of positive ``p``,
    and keys ``0 .. n_allowed[p] - 1`` may be attended. Every row must hold a non-edge.
    Rejection sampling (vectorised, ``_REJECTION_ROUNDS`` rounds), then exact sampling for
    the rows still unlucky — so the result is exactly uniform over the row's non-edges.
    """
    base = gold_base[:, None].expand(-1, num).reshape(-1)
    allowed = n_allowed[:, None].expand(-1, num).reshape(-1)
    cols = torch.zeros(base.shape[0], dtype=torch.long)
    todo = torch.arange(base.shape[0])
    for _ in range(_REJECTION_ROUNDS):
        if todo.numel() == 0:
            break
        draw = (torch.rand(todo.shape[0], generator=generator) * allowed[todo]).long()
        draw = torch.minimum(draw, allowed[todo] - 1)  # guard against rand() rounding to 1
        ok = ~gold_flat[base[todo] + draw]
        cols[todo[ok]] = draw[ok]
        todo = todo[~ok]
    for part in todo.split(_EXACT_CHUNK) if todo.numel() else ():  # memory: chunk × row
        width = int(allowed[part].max())
        j = torch.arange(width)
        idx = (base[part][:, None] + j).clamp(max=gold_flat.numel() - 1)
        free = (~gold_flat[idx]) & (j < allowed[part][:, None])
        cols[part] = torch.multinomial(free.float(), 1, generator=generator)[:, 0]
    return cols.view(-1, num)


# ==================================================================== training


def _check_hyperparameters(**params: Any) -> None:
    ints = {"rank": 1, "epochs": 1, "batch_size": 1, "negatives_per_positive": 1, "seed": 0}
    for name, low in ints.items():
        value = params[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    for name in ("margin", "lr"):
        value = params[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
    if params["init"] not in ("discriminative", "random"):
        raise ValueError(f"init must be 'discriminative' or 'random', got {params['init']!r}")


def _check_records(records: Sequence[AttentionRecord], rank: int) -> tuple[int, int, int]:
    if not records:
        raise ValueError("train_projections needs at least one record (a text's gold graphs)")
    shapes = set()
    for record in records:
        if not record.layers:
            raise ValueError("a record has no layers; extract it with graphs.extract()")
        q = record.layers[0].queries
        shapes.add((record.num_layers, int(q.shape[0]), int(q.shape[2])))
    if len(shapes) != 1:
        raise ValueError(f"records come from differently shaped models: {sorted(shapes)}")
    layers, heads, d = shapes.pop()
    if rank > d:
        raise ValueError(f"rank must be <= the head dimension {d}, got {rank}")
    return layers, heads, d


def _init_moments(pairs: _LayerPairs, neg_rows: Tensor, sample: Tensor
                  ) -> tuple[Tensor, Tensor, int]:
    """Unnormalised second moments (heads, d, d) float64 of positive/negative differences.

    ``sample`` (heads, S) holds positive ids per head (a prefix of the shuffled schedule);
    returns ``(Σ Δ_P Δ_Pᵀ, Σ Δ_N Δ_Nᵀ, S)`` so data-parallel ranks can add theirs up.
    """
    dp, dn = pairs.first_negative_differences(sample, neg_rows)
    return (dp.transpose(1, 2) @ dp).double(), (dn.transpose(1, 2) @ dn).double(), dp.shape[1]


def _solve_init(c_pos: Tensor, c_neg: Tensor, rank: int, margin: float) -> Tensor:
    """Top-``rank`` generalised eigenvectors of (C_N, C_P) per head → (heads, r, d)."""
    heads, d = c_pos.shape[0], c_pos.shape[-1]
    eye = torch.eye(d, dtype=torch.float64)
    ridge = 1e-4 * c_pos.diagonal(dim1=-2, dim2=-1).mean(-1).clamp(min=1e-12)
    chol = torch.linalg.cholesky(c_pos + ridge[:, None, None] * eye)
    inv = torch.linalg.solve_triangular(chol, eye.expand(heads, d, d), upper=False)
    _, vecs = torch.linalg.eigh(inv @ c_neg @ inv.transpose(-1, -2))  # ascending eigenvalues
    w = (inv.transpose(-1, -2) @ vecs[..., -rank:]).transpose(-1, -2)  # (heads, r, d)
    # C_P-orthonormal rows: mean positive squared distance = rank; rescale it to the margin.
    return (w * math.sqrt(margin / rank)).float()


def _discriminative_init(
    pairs: _LayerPairs, neg_rows: Tensor, sample: Tensor, rank: int, margin: float
) -> Tensor:
    """Top-``rank`` generalised eigenvectors of (C_N, C_P) per head → (heads, r, d)."""
    c_pos, c_neg, size = _init_moments(pairs, neg_rows, sample)
    return _solve_init(c_pos / size, c_neg / size, rank, margin)


def dense_heads_of(pairs: _LayerPairs, heads: int) -> list[int]:
    """Heads with gold edges but no (edge, non-edge) pair in any row: nothing to contrast."""
    counts = torch.bincount(pairs.head, minlength=heads)
    return [h for h in range(heads) if int(counts[h]) == 0 and int(pairs.gold_edges[h]) > 0]


def _schedule(pairs: _LayerPairs, heads: int, batch_size: int, generator: torch.Generator,
              steps: int | None = None, borrow: Sequence[int] = ()) -> tuple[Tensor, int]:
    """Positive ids (heads, steps * batch_size): a shuffled epoch per head, cycled.

    ``steps`` overrides the epoch length (data-parallel ranks agree on the longest one).
    Heads in ``borrow`` without positives take the ids of the head with the most (only so
    that every head has a batch: the caller keeps their weights at zero, which zeroes their
    gradient)."""
    counts = torch.bincount(pairs.head, minlength=heads)
    borrowed = [h for h in borrow if int(counts[h]) == 0]
    if borrowed and int(counts.max()) > 0:
        counts = counts.clone()
        counts[borrowed] = -1  # filled from the donor below
    if int(counts.min()) == 0:
        empty = (counts == 0).nonzero()[:, 0].tolist()
        dense = [h for h in empty if int(pairs.gold_edges[h]) > 0]
        if dense:
            raise ValueError(
                f"heads {dense} attend to every key in every row of the training records: "
                "they have no non-edge, and the contrastive loss needs one (a gold edge "
                "against a non-edge of its row); such heads are dense at this α — raise α or "
                "train on texts where they are sparse"
            )
        raise ValueError(
            f"heads {empty} have no gold edge at all in the training records; train on "
            "more (or longer) texts"
        )
    donor = int(counts.argmax())
    counts = torch.where(counts < 0, 0, counts)
    steps = steps if steps is not None else math.ceil(int(counts.max()) / batch_size)
    order = torch.argsort(pairs.head, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    length = steps * batch_size
    ids = torch.empty(heads, length, dtype=torch.long)
    for row in range(heads):
        h = donor if row in borrowed else row  # the donor's positives, see the docstring
        count = int(counts[h])
        reps = math.ceil(length / count)
        perms = torch.cat([torch.randperm(count, generator=generator) for _ in range(reps)])
        ids[row] = order[starts[h] + perms[:length]]
    return ids, steps


def train_projections(
    records: Sequence[AttentionRecord],
    *,
    rank: int = 4,
    margin: float = 1.0,
    lr: float = 0.01,
    epochs: int = 1,
    batch_size: int = 1024,
    negatives_per_positive: int = 1,
    seed: int = 0,
    init: str = "discriminative",
    progress: bool = False,
    model_id: str = "",
    alpha: float = 1.5,
    device: torch.device | str = "cpu",
    dense_heads: str = "error",
) -> HeadProjections:
    """Learn the projections of every head from gold graphs with the Eq. 7 hinge loss.

    ``dense_heads``: what to do with a head that has gold edges but no row holding a
    non-edge (nothing to contrast): ``"error"`` (default; at token level such a head is
    dense at this α) or ``"zero"``: its map stays exactly zero (zero weights get a zero
    gradient; its constant hinge ω counts in the reported mean loss) and the layer's such
    heads are listed in ``metadata["dense_heads"]`` (block projections use this: a head
    attending to every tile of every training text).

    ``device``: where the Adam steps run (e.g. ``"cuda"``): the token tables and the batch
    indices move there; sampling and the init stay on the CPU (one generator, so the same
    seed draws the same pairs on every device), and the result is on the CPU.

    ``batch_size`` counts positives per head per step (every head of a layer steps at once);
    the paper's 16 is far too small for CPU training on millions of pairs, so we default to
    1024. Deterministic for a given ``seed`` (one ``torch.Generator`` drives shuffling,
    sampling and the init). Returns projections with training statistics in ``metadata``
    (``loss_first``/``loss_last`` per layer: mean hinge loss of the first/last 10 % of steps).
    """
    _check_hyperparameters(
        rank=rank, margin=margin, lr=lr, epochs=epochs, batch_size=batch_size,
        negatives_per_positive=negatives_per_positive, seed=seed, init=init,
    )
    if dense_heads not in ("error", "zero"):
        raise ValueError(f"dense_heads must be 'error' or 'zero', got {dense_heads!r}")
    layers, heads, d = _check_records(records, rank)
    device = torch.device(device)
    generator = torch.Generator().manual_seed(seed)
    weights, biases = [], []
    loss_first, loss_last, n_pos, zeroed = [], [], [], []
    bar = tqdm(total=layers * epochs, desc="projections", unit="layer·epoch",
               disable=not progress)
    for layer in range(layers):
        pairs = _layer_pairs(records, layer)
        dense = dense_heads_of(pairs, heads) if dense_heads == "zero" else []
        zeroed.append(dense)
        on_device = pairs if device.type == "cpu" else replace(
            pairs, q_table=pairs.q_table.to(device), k_table=pairs.k_table.to(device))
        weight: Tensor | None = None
        optimizer: torch.optim.Optimizer | None = None
        history: list[Tensor] = []
        if len(dense) == heads:  # nothing to contrast in this layer: every map stays zero
            weight = torch.zeros(heads, rank, d)
            bar.update(epochs)
        for _epoch in range(epochs if weight is None else 0):
            negs = sample_negatives(pairs.gold_flat, pairs.gold_base, pairs.n_allowed,
                                    negatives_per_positive, generator)
            neg_rows = pairs.k_base[:, None] + negs  # (P, num) rows into k_table
            ids, steps = _schedule(pairs, heads, batch_size, generator, borrow=dense)
            if weight is None:
                if init == "discriminative":
                    sample = ids[:, : min(_INIT_SAMPLE, ids.shape[1])]
                    w0 = _discriminative_init(pairs, neg_rows, sample, rank, margin)
                else:
                    w0 = torch.randn(heads, rank, d, generator=generator) / math.sqrt(d)
                w0[dense] = 0.0  # stays 0: a zero map has a zero hinge gradient
                weight = w0.to(device).contiguous()
                optimizer = torch.optim.Adam([weight], lr=lr)
            # Table rows of the whole epoch, gathered once: (heads, L) and (heads, L, num).
            rows = tuple(r.to(device) for r in (pairs.q_row[ids], pairs.k_row[ids],
                                                neg_rows[ids]))
            for step in range(steps):
                cut = slice(step * batch_size, (step + 1) * batch_size)
                history.append(
                    _step(on_device, *(r[:, cut] for r in rows), weight, optimizer, margin)
                )
            bar.update(1)
        losses = torch.stack(history).tolist() if history else [math.nan]
        tail = max(1, len(losses) // 10)
        loss_first.append(sum(losses[:tail]) / tail)
        loss_last.append(sum(losses[-tail:]) / tail)
        n_pos.append(int(pairs.head.numel()))
        w = weight.detach().cpu()
        tokens = torch.cat([r.layers[layer].queries for r in records]
                           + [r.layers[layer].keys for r in records], dim=1).float()
        biases.append(-(w @ tokens.mean(1)[..., None])[..., 0])  # centre projected tokens
        weights.append(w)
    bar.close()
    metadata = {
        "rank": rank, "margin": float(margin), "lr": float(lr), "epochs": epochs,
        "batch_size": batch_size, "negatives_per_positive": negatives_per_positive,
        "objective": "paper", "seed": seed, "init": init, "n_records": len(records),
        "positives_per_layer": n_pos,
        "loss_first": loss_first, "loss_last": loss_last,
    }
    if dense_heads == "zero":
        metadata["dense_heads"] = zeroed
    return HeadProjections(
        weight=torch.stack(weights), bias=torch.stack(biases), model_id=model_id,
        alpha=float(alpha), metadata=metadata,
    )


def _step(
    pairs: _LayerPairs, q_rows: Tensor, k_rows: Tensor, n_rows: Tensor, weight: Tensor,
    optimizer: torch.optim.Optimizer, margin: float,
) -> Tensor:
    """One Adam step on a batch, (heads, B) rows; returns the mean hinge loss (0-dim)."""
    weight.grad, loss = _hinge_grad(pairs, q_rows, k_rows, n_rows, weight, margin)
    optimizer.step()
    return loss


def _hinge_grad(
    pairs: _LayerPairs, q_rows: Tensor, k_rows: Tensor, n_rows: Tensor, weight: Tensor,
    margin: float,
) -> tuple[Tensor, Tensor]:
    """Gradient of the batch's mean hinge loss w.r.t. ``weight``, and that loss.

    The gradient of Eq. 7 is written out instead of using autograd: for an active hinge
    term, ∂/∂W (‖WΔ_P‖² − ‖WΔ_N‖²) = 2 (W Δ_P) Δ_Pᵀ − 2 (W Δ_N) Δ_Nᵀ, i.e. two more
    (heads, r, B) × (heads, B, d) products. That halves the number of small tensor ops per
    step, which is what bounds the speed of these tiny (r = 4) problems on a CPU.
    """
    heads, size, num = n_rows.shape
    diff_pos, diff_neg = pairs.batch_differences(q_rows, k_rows, n_rows)
    wt = weight.transpose(-1, -2)
    z_pos = torch.bmm(diff_pos, wt)  # (heads, B, r)
    z_neg = torch.bmm(diff_neg, wt)  # (heads, B·num, r)
    hinge = (z_pos.square().sum(-1)[..., None] + margin) - z_neg.square().sum(-1).view(
        heads, size, num
    )
    active = (hinge > 0).to(weight.dtype)  # (heads, B, num)
    scale = 2.0 / (size * num)  # each head its own mean: heads do not share parameters
    g_pos = z_pos * (active.sum(-1, keepdim=True) * scale)
    g_neg = z_neg * (active.view(heads, size * num, 1) * scale)
    grad = torch.bmm(g_pos.transpose(1, 2), diff_pos) - torch.bmm(g_neg.transpose(1, 2), diff_neg)
    return grad, (hinge * active).mean()


# ==================================================================== centroids


def fit_centroids(
    projections: HeadProjections,
    records: Sequence[AttentionRecord],
    clusters: Sequence[int] = (2, 4, 6, 8, 10, 12, 16, 20),
    *,
    max_points: int | None = 10_000,
    n_init: int = 10,
    seed: int = 0,
    progress: bool = False,
) -> HeadProjections:
    """Fit k-means centroids (per layer, head and B) on projected training queries+keys.

    Uses the predictors' :class:`KMeans` (scikit-learn k-means++, ``n_init`` restarts; each
    head subsampled to ``max_points`` points). Stores them in ``projections.centroids`` and
    returns the same object. Augmented projections are refused: their queries and keys sit in
    different coordinates, so clusters separate queries from keys (measured: k-means recall
    ≈ 0 on the low-rank files).
    """
    if projections.kind == "augmented":
        raise ValueError(
            "k-means centroids are not fitted on augmented (low-rank) projections: queries and "
            "keys sit in different coordinates, so clusters would separate them; fit them on "
            "shared projections (objective 'paper' or 'logistic')"
        )
    if not records:
        raise ValueError("fit_centroids needs at least one record")
    clusters = sorted({int(b) for b in clusters})
    if not clusters or clusters[0] < 1:
        raise ValueError(f"clusters must be integers >= 1, got {clusters!r}")
    for record in records:
        projections.check_record(record)
    per_b: dict[int, list[Tensor]] = {b: [] for b in clusters}
    bar = tqdm(total=projections.num_layers * len(clusters), desc="k-means", unit="fit",
               disable=not progress)
    for layer in range(projections.num_layers):
        q = torch.cat([projections.project_queries(layer, r.layers[layer].queries)
                       for r in records], 1)
        k = torch.cat([projections.project_keys(layer, r.layers[layer].keys) for r in records], 1)
        for b in clusters:
            km = KMeans(n_clusters=b, random_state=seed, n_init=n_init, max_points=max_points)
            per_b[b].append(km.fit(q, k).centroids_.float())
            bar.update(1)
    bar.close()
    projections.centroids = {b: torch.stack(c) for b, c in per_b.items()}
    projections.metadata.update(
        {"kmeans_max_points": max_points, "kmeans_n_init": n_init, "kmeans_seed": seed,
         "clusters": clusters}
    )
    return projections
