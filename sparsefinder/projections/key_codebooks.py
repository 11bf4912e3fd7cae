"""Per-head KEY codebooks for :class:`~sparsefinder.predictors.routed_kmeans.RoutedKMeans`.

A codebook file holds, for every number of clusters B fitted, float32 centroids
(layers, heads, B, d) of the model's ORIGINAL keys, fitted on the TRAIN split, plus plain
metadata (model id, α, corpus, split, number of texts). It is one small ``torch.save`` of
plain tensors, loaded with ``weights_only=True`` (no code runs on load). The default model's
codebooks are bundled (``assets/default/key_codebooks.pt``, ~2 MB for B ∈ {64, 128}; the
bundle's ``key codebooks`` file); ``sparsefinder fit-codebooks`` rebuilds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sparsefinder.bundle import bundle
from sparsefinder.data.records import AttentionRecord
from sparsefinder.files import FileFormat, SparsefinderFileError, load_payload, save_payload
from sparsefinder.predictors.routed_kmeans import RoutedKMeans

FORMAT = "sparsefinder-key-codebooks"
FORMAT_VERSION = 1
DEFAULT_CLUSTERS = (64, 128)


class CodebooksError(SparsefinderFileError):
    """A codebook file cannot be used; the message says how to (re)create it."""


def _hint(model: str = "default") -> str:
    return f"`sparsefinder fit-codebooks --model {model} --out FILE`"


#: The key codebooks payload (:func:`sparsefinder.files.load_payload` reads it).
CODEBOOKS_FILE = FileFormat(FORMAT, "key codebooks file", "key codebooks", _hint(),
                            CodebooksError, (FORMAT_VERSION,))


@dataclass
class KeyCodebooks:
    """Key centroids per number of clusters: ``centroids[B]`` is (layers, heads, B, d)."""

    model_id: str
    alpha: float
    centroids: dict[int, Tensor]
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        shapes = {tuple(c.shape[:2]) + (c.shape[3],) for c in self.centroids.values()}
        if not self.centroids or len(shapes) != 1:
            raise CodebooksError(
                "centroids must be a non-empty {B: (layers, heads, B, d)} with equal "
                f"layers/heads/d, got {[tuple(c.shape) for c in self.centroids.values()]}"
            )
        for b, c in self.centroids.items():
            if c.dim() != 4 or c.shape[2] != b:
                raise CodebooksError(f"centroids[{b}] must be (layers, heads, {b}, d)")

    def predictor(self, layer: int, n_clusters: int, **params: object) -> RoutedKMeans:
        """A :class:`RoutedKMeans` for one layer (``params``: budget, mode, n_routes)."""
        if n_clusters not in self.centroids:
            stored = ", ".join(map(str, sorted(self.centroids)))
            raise CodebooksError(
                f"no key codebook with B={n_clusters} (stored: {stored}); refit with "
                f"{_hint()} --clusters {n_clusters}"
            )
        return RoutedKMeans.from_centroids(self.centroids[n_clusters][layer], **params)

    def save(self, path: str | Path) -> Path:
        """Write the codebooks (atomically, through :func:`sparsefinder.files.save_payload`)."""
        return save_payload(path, {
            **CODEBOOKS_FILE.header(), "model_id": self.model_id,
            "alpha": float(self.alpha), "metadata": dict(self.metadata),
            "centroids": {int(b): c.float().contiguous() for b, c in self.centroids.items()},
        })

    @classmethod
    def load(cls, path: str | Path, expected_model_id: str | None = None) -> KeyCodebooks:
        path = Path(path)
        if not path.is_file():
            raise CodebooksError(f"no key codebooks at {path}; create them with {_hint()}")
        payload = load_payload(path, CODEBOOKS_FILE)
        if expected_model_id is not None and payload["model_id"] != expected_model_id:
            raise CodebooksError(
                f"{path} was fitted for model {payload['model_id']!r}, not "
                f"{expected_model_id!r}; fit codebooks for this model with {_hint()}"
            )
        return cls(model_id=payload["model_id"], alpha=float(payload["alpha"]),
                   centroids={int(b): c for b, c in payload["centroids"].items()},
                   metadata=dict(payload.get("metadata") or {}))


def fit_codebooks(
    records: Sequence[AttentionRecord],
    clusters: Sequence[int] = DEFAULT_CLUSTERS,
    *,
    model_id: str,
    alpha: float,
    random_state: int = 0,
    max_points: int = 20000,
    metadata: dict[str, Any] | None = None,
) -> KeyCodebooks:
    """Fit per-head key centroids on the keys of TRAINING ``records`` for every B."""
    if not records:
        raise CodebooksError("fit_codebooks needs at least one training record")
    centroids: dict[int, Tensor] = {}
    for b in clusters:
        per_layer = []
        for layer in range(records[0].num_layers):
            keys = torch.cat([r.layers[layer].keys for r in records], dim=1)
            model = RoutedKMeans(n_clusters=int(b), random_state=random_state,
                                 max_points=max(max_points, int(b)))
            per_layer.append(model.fit(None, keys).centroids_)
        centroids[int(b)] = torch.stack(per_layer)
    meta = {"n_texts": len(records), "random_state": random_state, "max_points": max_points}
    return KeyCodebooks(model_id=model_id, alpha=alpha, centroids=centroids,
                        metadata={**meta, **(metadata or {})})


@lru_cache(maxsize=4)
def _load_cached(path: str, mtime: float) -> KeyCodebooks:
    return KeyCodebooks.load(path)


def bundled_codebooks(path: str | Path | None = None, model_id: str | None = None
                      ) -> KeyCodebooks:
    """The codebooks at ``path`` (default: the prepared bundle's of ``model_id`` when there
    is one, else the bundled ones), loaded once per file version."""
    if path is None and model_id is not None:
        from sparsefinder.model_bundles import prepared_file

        path = prepared_file(model_id, "key codebooks")
    path = Path(path) if path is not None else bundle().path("key codebooks")
    if not path.is_file():
        raise CodebooksError(f"no key codebooks at {path}; create them with {_hint()}")
    return _load_cached(str(path), path.stat().st_mtime)
