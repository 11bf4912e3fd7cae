"""The head atlas on disk: ``heads.csv`` (one row per head) and ``atlas.json`` (everything).

``atlas.json`` holds what the app draws — heads, similarity, order, map, examples with their
texts, the histograms — so a cached atlas opens without the model. It carries
:data:`ATLAS_VERSION`; a file of another version is refused with the command that remakes it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sparsefinder.analysis.atlas import HeadAtlas
from sparsefinder.files import SparsefinderFileError, atomic_write

ATLAS_VERSION = 1
FORMAT = "sparsefinder-head-atlas"


#: Columns of ``heads`` that hold text; every other one is a number.
TEXT_COLUMNS = frozenset({"type", "type_label", "typical_text_id"})


class AtlasFileError(SparsefinderFileError):
    """An atlas file cannot be read; the message says how to remake it."""


def _clean(value: Any) -> Any:
    """NaN/inf → None, so the JSON is strict (browsers' JSON.parse rejects NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def atlas_to_dict(atlas: HeadAtlas) -> dict[str, Any]:
    heads = [{key: value.item() if isinstance(value, np.generic) else value
              for key, value in row.items()}
             for row in atlas.heads.to_dict(orient="records")]  # full float precision
    return _clean({
        "format": FORMAT, "version": ATLAS_VERSION, "meta": atlas.meta, "heads": heads,
        "similarity": np.round(atlas.similarity, 6).tolist(), "order": list(atlas.order),
        "coords": np.round(atlas.coords, 6).tolist(), "examples": atlas.examples,
        "texts": atlas.texts, "sparsity_hist": atlas.sparsity_hist.astype(int).tolist(),
        "support_hist": _trim(atlas.support_hist).astype(int).tolist(),
    })


def _trim(hist: np.ndarray) -> np.ndarray:
    """Drop the empty tail of the support histograms (most rows keep few keys)."""
    used = np.nonzero(hist.reshape(-1, hist.shape[-1]).sum(0))[0]
    return hist[..., : (int(used[-1]) + 1 if used.size else 1)]


def atlas_from_dict(payload: dict[str, Any], source: str = "atlas") -> HeadAtlas:
    if payload.get("format") != FORMAT or payload.get("version") != ATLAS_VERSION:
        raise AtlasFileError(f"{source} is not a head atlas of version {ATLAS_VERSION}; remake "
                             "it with `sparsefinder atlas --out DIR`")
    heads = pd.DataFrame(payload["heads"])
    for column in heads.columns:
        if column not in TEXT_COLUMNS:  # None (a NaN in JSON) back to NaN
            heads[column] = pd.to_numeric(heads[column])
    return HeadAtlas(
        heads=heads, similarity=np.asarray(payload["similarity"], dtype=float),
        order=[int(i) for i in payload["order"]],
        coords=np.asarray(payload["coords"], dtype=float), examples=payload["examples"],
        texts=payload["texts"], sparsity_hist=np.asarray(payload["sparsity_hist"], dtype=float),
        support_hist=np.asarray(payload["support_hist"], dtype=float), meta=payload["meta"])


def save_atlas(atlas: HeadAtlas, out: str | Path) -> tuple[Path, Path]:
    """Write ``out/heads.csv`` and ``out/atlas.json`` (atomically); returns both paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out / "heads.csv", out / "atlas.json"
    table = atlas.heads.to_csv(index=False).encode("utf-8")
    atomic_write(csv_path, lambda handle: handle.write(table))
    save_atlas_json(atlas, json_path)
    return csv_path, json_path


def save_atlas_json(atlas: HeadAtlas, path: str | Path) -> Path:
    """Write ``atlas.json`` alone (atomically) at ``path``: what a cache keeps."""
    document = json.dumps(atlas_to_dict(atlas), allow_nan=False).encode("utf-8")
    return atomic_write(path, lambda handle: handle.write(document))


def load_atlas(path: str | Path) -> HeadAtlas:
    """Read ``atlas.json`` (a file or the folder holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / "atlas.json"
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise AtlasFileError(f"cannot read {path}: {error}; remake it with "
                             "`sparsefinder atlas --out DIR`") from error
    return atlas_from_dict(payload, str(path))
