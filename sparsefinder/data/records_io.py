"""Save and load gold-graph records compactly: edge indices, not dense matrices.

One file per call of :func:`save_records` (a ``torch.save`` of plain tensors and lists, read
back with ``weights_only=True`` so a file can never run code). Per layer we store the gold
edges as ``(head, query, key)`` index triples (int16 when n ≤ 32767) with their
probabilities, and the query/key vectors in float32 so projections can be trained from disk.
"""

from __future__ import annotations

from pathlib import Path

import torch

from sparsefinder.data.records import AttentionRecord, LayerGraph
from sparsefinder.files import (
    FileFormat,
    SparsefinderFileError,
    check_payload,
    load_payload,
    save_payload,
)

FORMAT = "sparsefinder-records"
FORMAT_VERSION = 1


class RecordsFileError(SparsefinderFileError):
    """A records file is corrupt or of an unknown format (a missing one: FileNotFoundError)."""


#: The records payload (:func:`sparsefinder.files.load_payload` reads it).
RECORDS_FILE = FileFormat(FORMAT, "sparsefinder records file", "records",
                          "`sparsefinder extract --out DIR`", RecordsFileError, (FORMAT_VERSION,),
                          version_key="version")


def _pack_layer(layer: LayerGraph) -> dict:
    n = max(layer.gold_shape)
    index_dtype = torch.int16 if n <= torch.iinfo(torch.int16).max else torch.int32
    return {
        "queries": layer.queries,
        "keys": layer.keys,
        "edges": layer.gold.nonzero().to(index_dtype),
        "shape": torch.tensor(layer.gold_shape),
        "prob_values": layer.prob_values,
        "scaling": torch.tensor(layer.scaling, dtype=torch.float64),
        "sliding_window": int(layer.sliding_window or 0),
        "alpha": float(layer.alpha) if layer.alpha is not None else 0.0,
    }


def _unpack_layer(packed: dict) -> LayerGraph:
    gold = torch.zeros(tuple(packed["shape"].tolist()), dtype=torch.bool)
    edges = packed["edges"].long()
    gold[edges[:, 0], edges[:, 1], edges[:, 2]] = True
    return LayerGraph(
        queries=packed["queries"],
        keys=packed["keys"],
        gold=gold,
        prob_values=packed["prob_values"],
        scaling=float(packed["scaling"]),
        sliding_window=int(packed.get("sliding_window", 0)) or None,
        alpha=float(packed.get("alpha", 0.0)) or None,  # 0: not recorded (older files)
    )


def records_payload(records: list[AttentionRecord], metadata: dict | None = None) -> dict:
    """The plain dict :func:`save_records` writes (shards serialise it to bytes themselves)."""
    return {
        **RECORDS_FILE.header(),
        "metadata": dict(metadata or {}),
        "records": [
            {
                "text": record.text,
                "tokens": list(record.tokens),
                "offsets": [list(offset) for offset in record.offsets],
                "special": list(record.special),
                "causal": record.causal,
                "truncated": record.truncated,
                "layers": [_pack_layer(layer) for layer in record.layers],
            }
            for record in records
        ],
    }


def save_records(
    records: list[AttentionRecord], path: str | Path, metadata: dict | None = None
) -> Path:
    """Write ``records`` to ``path`` (parents created, atomically); returns the path."""
    return save_payload(path, records_payload(records, metadata))


def load_records(path: str | Path) -> tuple[list[AttentionRecord], dict]:
    """Read a file written by :func:`save_records`; returns (records, metadata)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"records file {path} does not exist; create it with `sparsefinder extract --out DIR`"
        )
    return records_from_payload(load_payload(path, RECORDS_FILE), path)


def records_from_payload(payload: object, path: str | Path) -> tuple[list[AttentionRecord], dict]:
    """Records and metadata from a loaded payload; ``path`` only names it in errors."""
    payload = check_payload(payload, RECORDS_FILE, path)
    records = [
        AttentionRecord(
            text=item["text"],
            tokens=item["tokens"],
            offsets=[tuple(offset) for offset in item["offsets"]],
            special=item["special"],
            causal=item["causal"],
            truncated=item["truncated"],
            layers=[_unpack_layer(layer) for layer in item["layers"]],
        )
        for item in payload["records"]
    ]
    return records, payload["metadata"]
