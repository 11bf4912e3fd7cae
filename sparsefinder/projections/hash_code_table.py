"""HashAttention codes of one model as a file (the bundled asset behind the app's
``hashattention`` method).

The codes (:func:`sparsefinder.predictors.hash_codes.fit_hash_codes`) are learned from TRAIN
gold graphs, which the app never extracts; like the key codebooks of routed k-means they are
fitted once (`sparsefinder fit-hash-codes`) and shipped: per layer, ``(W_q, W_k)`` of shape
(heads, d, bits), about 150 KB for MiniLM at 16 bits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sparsefinder.bundle import bundle
from sparsefinder.data.records import AttentionRecord
from sparsefinder.files import FileFormat, SparsefinderFileError, load_payload, save_payload

FORMAT = "sparsefinder-hash-codes/1"  # the version is part of the marker


class HashCodesError(SparsefinderFileError):
    """A hash-codes file that cannot serve: damaged, another format or another model."""


_COMMAND = ("`sparsefinder fit-hash-codes --model MODEL --out FILE` (`make assets` for the "
            "bundled one)")
#: The hash-codes payload (:func:`sparsefinder.files.load_payload` reads it).
HASH_CODES_FILE = FileFormat(FORMAT, "hash-codes file", "hash-codes", _COMMAND, HashCodesError,
                             version_key=None)


def _hint() -> str:
    return f"rebuild it with {_COMMAND}"


@dataclass
class HashCodeTable:
    """Per-layer learned hash maps of one model (and the α its gold graphs were taken at)."""

    model_id: str
    alpha: float
    maps: list[tuple[Tensor, Tensor]]
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.maps:
            raise HashCodesError("a hash-codes table needs the maps of at least one layer")
        shape = self.maps[0][0].shape
        for layer, (w_query, w_key) in enumerate(self.maps):
            if w_query.dim() != 3 or w_query.shape != shape or w_key.shape != shape:
                raise HashCodesError(f"layer {layer}: maps {tuple(w_query.shape)} / "
                                     f"{tuple(w_key.shape)} are not (heads, d, bits) like "
                                     f"layer 0's {tuple(shape)}")

    def fits(self, record: AttentionRecord) -> bool:
        """Whether the maps read this record's q/k: same layers, heads and head size."""
        heads, d, _ = self.maps[0][0].shape
        return (len(self.maps) == record.num_layers and heads == record.num_heads
                and d == record.layers[0].queries.shape[-1])

    def save(self, path: str | Path) -> Path:
        """Write the table (atomically, through :func:`sparsefinder.files.save_payload`)."""
        return save_payload(path, {
            **HASH_CODES_FILE.header(), "model_id": self.model_id, "alpha": float(self.alpha),
            "w_query": torch.stack([q for q, _ in self.maps]).contiguous(),
            "w_key": torch.stack([k for _, k in self.maps]).contiguous(),
            "metadata": dict(self.metadata)})

    @classmethod
    def load(cls, path: str | Path, expected_model_id: str | None = None) -> HashCodeTable:
        """Read a file written by :meth:`save`; every way it can be wrong is a
        :class:`HashCodesError` that names the file and the fix."""
        path = Path(path)
        try:
            data = load_payload(path, HASH_CODES_FILE)
        except FileNotFoundError:
            raise HashCodesError(f"no hash-codes file at {path}; {_hint()}") from None
        if expected_model_id is not None and data["model_id"] != expected_model_id:
            raise HashCodesError(f"{path} holds hash codes of {data['model_id']!r}, not "
                                 f"{expected_model_id!r}; {_hint()}")
        w_query, w_key = data["w_query"], data["w_key"]
        if w_query.dim() != 4 or w_query.shape != w_key.shape:
            raise HashCodesError(f"{path}: maps of shape {tuple(w_query.shape)} / "
                                 f"{tuple(w_key.shape)} are not (layers, heads, d, bits); "
                                 f"{_hint()}")
        return cls(model_id=str(data["model_id"]), alpha=float(data["alpha"]),
                   maps=list(zip(w_query.unbind(0), w_key.unbind(0), strict=True)),
                   metadata=dict(data.get("metadata", {})))


def bundled_hash_codes(model_id: str) -> HashCodeTable | None:
    """The bundled table when it was fitted for ``model_id``, else the prepared bundle's of
    ``model_id`` (`sparsefinder prepare`); None: the method is off."""
    from sparsefinder.model_bundles import prepared_file

    for path in (bundle().path("hash codes"), prepared_file(model_id, "hash codes")):
        if path is None or not path.is_file():
            continue
        try:
            return HashCodeTable.load(path, expected_model_id=model_id)
        except HashCodesError:
            continue
    return None
