"""Prepared bundles of the user's own models: found by the model's weight fingerprint.

``sparsefinder prepare --model M`` writes the learned files of one model (projections,
calibration table, key codebooks, hash codes, atlas) to ``ROOT/FINGERPRINT/`` with a
``bundle.json`` in the format of ``assets/default/bundle.json``; ROOT is
``$SPARSEFINDER_CACHE_DIR/bundles`` (:func:`sparsefinder.user_cache.user_cache_dir`).

Why a fingerprint and not the model's name: a folder can be moved or re-saved with other
weights, and a hub id names many revisions. The fingerprint hashes the architecture, every
layer's α and a strided sample of every weight, so the same weights find their bundle under
any name and other weights never do.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from sparsefinder.bundle import MANIFEST, Bundle, BundleError, read_manifest
from sparsefinder.user_cache import user_cache_dir

#: Values hashed per weight tensor at most (a strided sample): enough to tell two
#: checkpoints apart, cheap enough to run at every load of an 8B model.
SAMPLE_PER_TENSOR = 4096


def bundles_root(root: str | Path | None = None) -> Path:
    """Where prepared bundles live: ``root``, else ``$SPARSEFINDER_CACHE_DIR/bundles``."""
    return Path(root) if root is not None else user_cache_dir("bundles")


def model_fingerprint(loaded: Any) -> str:
    """16 hex digits of SHA-256 over the architecture, the layers' α and sampled weights."""
    import torch

    digest = hashlib.sha256()
    config = loaded.model.config
    facts = {"model_type": getattr(config, "model_type", ""), "layers": loaded.num_layers,
             "heads": loaded.num_heads, "kv_heads": loaded.num_key_value_heads,
             "head_dim": loaded.head_dim, "alphas": [float(a) for a in loaded.layer_alphas]}
    digest.update(json.dumps(facts, sort_keys=True).encode())
    for name, tensor in sorted(loaded.model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        step = max(1, flat.numel() // SAMPLE_PER_TENSOR)
        digest.update(name.encode())
        digest.update(flat[::step].to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def bundle_folder(fingerprint: str, root: str | Path | None = None) -> Path:
    return bundles_root(root) / fingerprint


def open_bundle(folder: Path, verify: bool = True) -> Bundle:
    """The prepared bundle in ``folder``; a damaged one is refused with its path."""
    manifest = read_manifest(folder / MANIFEST)
    found = Bundle(folder, manifest)
    problems = found.verify() if verify else []
    if problems:
        raise BundleError(f"the prepared bundle at {folder} is corrupt ({'; '.join(problems)});"
                          f" delete {folder} and run `sparsefinder prepare` again")
    return found


def find_bundle(loaded: Any, root: str | Path | None = None) -> Bundle | None:
    """The prepared bundle of ``loaded``'s weights (None: not prepared)."""
    folder = bundle_folder(model_fingerprint(loaded), root)
    if not (folder / MANIFEST).is_file():
        return None
    return open_bundle(folder)


def bundle_for_model(model_id: str, root: str | Path | None = None) -> Bundle | None:
    """The newest prepared bundle whose files were built for ``model_id`` (None: none).

    For the lookups that only know a model id (a calibration table, codebooks, hash codes):
    each file still checks its own ``model_id`` when it loads.
    """
    base = bundles_root(root)
    if not base.is_dir():
        return None
    found: list[tuple[float, Path]] = []
    for manifest in base.glob(f"*/{MANIFEST}"):
        try:
            if read_manifest(manifest).get("model_id") == model_id:
                found.append((manifest.stat().st_mtime, manifest.parent))
        except BundleError:
            continue  # a damaged bundle of another model must not hide this one
    if not found:
        return None
    return open_bundle(max(found)[1], verify=False)


def prepared_models(root: str | Path | None = None) -> dict[str, Path]:
    """The models with a prepared bundle: the name each was prepared under (what the app's
    model box and ``load_model`` take) -> its bundle folder, the newest per name; damaged
    manifests are left out."""
    base = bundles_root(root)
    found: list[tuple[float, str, Path]] = []
    for manifest in base.glob(f"*/{MANIFEST}") if base.is_dir() else ():
        try:
            model = read_manifest(manifest).get("prepared", {}).get("model")
        except BundleError:
            continue
        if model:
            found.append((manifest.stat().st_mtime, str(model), manifest.parent))
    return {model: folder for _, model, folder in sorted(found)}


def prepared_file(model_id: str, kind: str) -> Path | None:
    """The prepared bundle's file of ``kind`` for ``model_id`` (None: no such file)."""
    try:
        found = bundle_for_model(model_id)
        if found is None or kind not in found.kinds():
            return None
        path = found.path(kind)
    except BundleError:
        return None
    return path if path.is_file() else None


def manifest_extras(fingerprint: str, model: str, corpus: str, stages: list[str],
                    timings: dict[str, float]) -> dict[str, Any]:
    """What a prepared bundle's manifest adds to the bundled format."""
    return {"fingerprint": fingerprint,
            "prepared": {"model": model, "corpus": corpus, "stages": stages,
                         "seconds": {k: round(v, 2) for k, v in timings.items()},
                         "command": f"sparsefinder prepare --model {model} --corpus {corpus}"}}
