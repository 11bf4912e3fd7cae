"""Bundled files (example texts, coreference probes, default projections) as package data.

Read through :mod:`importlib.resources`, so they are found the same way in a source checkout,
an editable install and a wheel (``pip install .``).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def asset_path(*parts: str) -> Path:
    """Path of a bundled file under ``sparsefinder/assets`` (it may not exist)."""
    return Path(str(files("sparsefinder").joinpath("assets", *parts)))


#: The bundled projections and centroids of the default model (`make assets` rebuilds them).
BUNDLED_PROJECTIONS = asset_path("default", "projections.pt")
#: Calibrated per-head settings (target sparsity) for the bundled projections
#: (`sparsefinder calibrate`, part of `make assets`).
BUNDLED_CALIBRATION = asset_path("default", "calibration.pt")
EXAMPLES_DIR = asset_path("examples")
COREF_PROBES = asset_path("coref_probes.json")
#: The entmax adapter merged into the default model (`make assets-adapter` rebuilds it).
BUNDLED_ADAPTER = asset_path("default", "entmax_adapter.safetensors")
#: Block-level projections of the default model by block size (paper §6: Eq. 7 on pooled
#: blocks; `sparsefinder fit-block-projections`, part of `make assets`).
BUNDLED_BLOCK_PROJECTIONS = {
    block: asset_path("default", f"block_projections-b{block}.pt") for block in (16, 32)
}
