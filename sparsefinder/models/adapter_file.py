"""The entmax adapter file: LoRA matrices in safetensors, with what they were made for.

Only the low-rank matrices ship (≈ 1–2 MB for MiniLM at rank 8), never the model weights: the
adapter is merged into the pip-shipped MiniLM at load time, ``W ← W + (α_lora / r)·B A`` (what
PEFT's ``merge_and_unload`` computes; done here directly because importing PEFT costs more
than the merge), so inference runs a plain model at full speed.

Every load is checked, each failure a clear :class:`AdapterError`:

* the file is a readable safetensors file with this format's marker (else: corrupt/truncated);
* the model family (``config.model_type``) and every targeted layer exist with the right
  shapes (else: a family the adapter does not cover);
* a fingerprint of the base weights matches (else: an adapter made for another base model).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import nn

from sparsefinder.files import SparsefinderFileError, atomic_write

FORMAT = "sparsefinder-entmax-adapter"
FORMAT_VERSION = "1"
_REGENERATE = "re-create it with `make assets-adapter` (or `sparsefinder adapt --out DIR`)"


class AdapterError(SparsefinderFileError):
    """The adapter file cannot be applied to this model; the message says why and the fix."""


def base_fingerprint(weights: dict[str, torch.Tensor]) -> str:
    """SHA-256 over a strided sample of the base weights the adapter modifies (by layer name).

    Why a sample: every 61st value of each targeted weight tells two checkpoints apart as well
    as all of them, at a fraction of the hashing cost (it runs at every load).
    """
    digest = hashlib.sha256()
    for name in sorted(weights):
        weight = weights[name].detach().to("cpu", torch.float32).reshape(-1)[::61]
        digest.update(name.encode())
        digest.update(weight.contiguous().numpy().tobytes())
    return digest.hexdigest()


def base_module_name(key: str) -> str:
    """``base_model.model.encoder.layer.0.attention.self.query.lora_A.weight`` →
    ``encoder.layer.0.attention.self.query`` (the PEFT state-dict key's base module)."""
    name = key.removeprefix("base_model.model.")
    for suffix in (".lora_A.weight", ".lora_B.weight"):
        name = name.removesuffix(suffix)
    return name


def save_adapter(path: str | Path, tensors: dict[str, torch.Tensor],
                 metadata: dict[str, object]) -> Path:
    """Write the LoRA tensors (PEFT state-dict keys) and JSON-encoded metadata, atomically
    (:func:`sparsefinder.files.atomic_write`)."""
    from safetensors.torch import save

    header = {"format": FORMAT, "format_version": FORMAT_VERSION}
    header.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()})
    data = save({k: v.detach().to("cpu", torch.float32).contiguous() for k, v in tensors.items()},
                metadata=header)
    return atomic_write(path, lambda handle: handle.write(data))


def read_adapter(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of an adapter file; unreadable or foreign files are errors."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise AdapterError(f"adapter file not found: {path}; {_REGENERATE}")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise AdapterError(
            f"{path.name} is corrupt or truncated: not a readable safetensors adapter file "
            f"({str(error).splitlines()[0] if str(error) else type(error).__name__}); "
            f"{_REGENERATE}") from error
    if metadata.get("format") != FORMAT:
        raise AdapterError(f"{path} is not a Sparsefinder entmax adapter (no '{FORMAT}' "
                           f"marker in its metadata); {_REGENERATE}")
    if metadata.get("format_version") != FORMAT_VERSION:
        raise AdapterError(f"{path} has adapter format version {metadata.get('format_version')!r}"
                           f"; this sparsefinder reads version {FORMAT_VERSION}; {_REGENERATE}")
    if not tensors or any(".lora_" not in key for key in tensors):
        raise AdapterError(f"{path} holds no LoRA matrices (or foreign tensors); {_REGENERATE}")
    return tensors, metadata


def _check_covers(model: nn.Module, tensors: dict[str, torch.Tensor],
                  metadata: dict[str, str], path: Path) -> list[str]:
    """The targeted layers, after checking the family, the names and the shapes."""
    family = str(getattr(model.config, "model_type", type(model).__name__))
    if metadata.get("model_type") != family:
        raise AdapterError(
            f"{path.name} covers model family {metadata.get('model_type')!r}, not {family!r}: "
            "an adapter only applies to the model it was trained on; adapt this model with "
            "`sparsefinder adapt --model NAME --out DIR`")
    modules = dict(model.named_modules())
    names = sorted({base_module_name(key) for key in tensors})
    for name in names:
        module = modules.get(name)
        a = tensors.get(f"base_model.model.{name}.lora_A.weight")
        b = tensors.get(f"base_model.model.{name}.lora_B.weight")
        if not isinstance(module, nn.Linear) or a is None or b is None:
            raise AdapterError(f"{path.name} targets layer {name!r}, which this {family} model "
                               "does not have (or the file lacks its A/B pair); the adapter "
                               "does not cover this model")
        if a.shape[1] != module.in_features or b.shape[0] != module.out_features:
            raise AdapterError(
                f"{path.name} was made for {name} of shape {b.shape[0]}×{a.shape[1]}, but this "
                f"model's is {module.out_features}×{module.in_features}: another model size; "
                "adapt this model with `sparsefinder adapt`")
    return names


def apply_adapter(model: nn.Module, path: str | Path) -> tuple[nn.Module, dict[str, str]]:
    """Merge the adapter at ``path`` into ``model`` (in place); returns the model and the
    file's metadata. Raises :class:`AdapterError` when the file does not fit ``model``."""
    path = Path(path)
    tensors, metadata = read_adapter(path)
    names = _check_covers(model, tensors, metadata, path)
    modules = dict(model.named_modules())
    if base_fingerprint({n: modules[n].weight for n in names}) != metadata.get("base_fingerprint"):
        raise AdapterError(
            f"{path.name} was trained for base model {metadata.get('base_model')!r} with other "
            "weights (fingerprint mismatch): applying it would corrupt this model; adapt this "
            "model with `sparsefinder adapt --model NAME --out DIR`")
    try:
        scale = float(metadata["lora_alpha"]) / int(metadata["rank"])
    except (KeyError, ValueError, ZeroDivisionError) as error:
        raise AdapterError(f"{path.name} metadata lacks a valid rank/lora_alpha; "
                           f"{_REGENERATE}") from error
    with torch.no_grad():
        for name in names:
            a = tensors[f"base_model.model.{name}.lora_A.weight"]
            b = tensors[f"base_model.model.{name}.lora_B.weight"]
            weight = modules[name].weight
            weight.add_((b @ a).to(weight.dtype, copy=False).to(weight.device) * scale)
    return model, metadata
