"""Per-head projections of queries and keys (paper §4.2): the learned maps and their file.

Every head ``h`` of every layer gets one linear map ``g(x) = W x + b`` from the head dimension
``d`` to ``r`` (4 by default), shared by queries and keys so that both live in one space where
"close" means "probably an edge of the α-entmax graph". It is trained with the hinge loss of
paper Eq. 7,

    L = [ω + ‖q' − k'_P‖² − ‖q' − k'_N‖²]₊ ,

where ``(q, k_P)`` is a gold edge and ``k_N`` a non-edge of the same row. The bias cancels in
every difference ``q' − k'``: it is not trained and only centres the projected tokens
(``b = −W·mean``), which makes plots and centroids easier to read and changes no prediction.
Training lives in :mod:`sparsefinder.projections.hinge` (and the other objectives beside it);
this module is the learned object and its file.

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
load), with k-means centroids per number of clusters B stored alongside; they are written
and read through :mod:`sparsefinder.files` (atomic writes, one loader, one error base class).

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
  which only overestimates that token's distances). See :mod:`sparsefinder.projections.lowrank`."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sparsefinder.data.records import AttentionRecord
from sparsefinder.files import FileFormat, SparsefinderFileError, load_payload, save_payload
from sparsefinder.models.loading import DEFAULT_MODEL, DEFAULT_MODEL_ID
from sparsefinder.predictors.kmeans import KMeans

FORMAT = "sparsefinder-projections"


FORMAT_VERSION = 1  # shared projections; augmented ones are written as version 2


FORMAT_VERSION_AUGMENTED = 2


READABLE_VERSIONS = (FORMAT_VERSION, FORMAT_VERSION_AUGMENTED)


KINDS = ("shared", "augmented")


class ProjectionsError(SparsefinderFileError):
    """A projections file cannot be used; the message names the file and how to regenerate."""


def _train_hint(model_id: str | None, extra: str = "") -> str:
    name = "default" if model_id in (None, "", DEFAULT_MODEL_ID) else model_id
    return f"`sparsefinder train --model {name} --out DIR{extra}`"


#: The projections payload (:func:`sparsefinder.files.load_payload` reads it).
PROJECTIONS_FILE = FileFormat(FORMAT, "Sparsefinder projections file", "projections",
                              _train_hint(None), ProjectionsError, READABLE_VERSIONS)


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
            **PROJECTIONS_FILE.header(
                FORMAT_VERSION if self.kind == "shared" else FORMAT_VERSION_AUGMENTED),
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
        return save_payload(path, self.to_payload())

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
        regen = f"regenerate it with {_train_hint(expected_model_id)}"
        payload = load_payload(path, PROJECTIONS_FILE, max_bytes=max_bytes,
                               command=_train_hint(expected_model_id))
        version = PROJECTIONS_FILE.version_of(payload)
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
