"""What a served app accepts from its visitors: texts, model names, projections, memory.

The app is also a demo served to others (a GPU host, a group). Loading already refuses code
(``weights_only=True``, no ``trust_remote_code``), but a visitor could still fill the server's
memory with a huge model or text, or probe which server folders exist by typing paths. This
module holds that policy as plain values and functions (no Streamlit), so the app, the CLI and
the tests share one definition:

* the server is *exposed* when it listens on anything but a loopback address (an empty
  address means every interface, Streamlit's default);
* exposed, the model field only takes ``"default"`` and the names in
  ``SPARSEFINDER_MODEL_ALLOWLIST`` (the app then also hides its typed projections-path
  field: uploads only); on localhost anything goes, as before;
* texts and projections files have size caps far above what the app needs;
* a model is loaded only when its weights (estimated from safetensors headers or the config,
  before any weight is read) fit in the free memory.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_ALLOWLIST = "SPARSEFINDER_MODEL_ALLOWLIST"
ENV_MAX_TEXT_CHARS = "SPARSEFINDER_MAX_TEXT_CHARS"
ENV_MAX_PROJECTIONS_MB = "SPARSEFINDER_MAX_PROJECTIONS_MB"
ALWAYS_ALLOWED = "default"
#: ~40× the 512 tokens of the default model (a token is ~4 characters of English): room for
#: any real paste, while one request stays a fraction of a MB and milliseconds to tokenise.
DEFAULT_MAX_TEXT_CHARS = 100_000
#: The bundled projections are 130 KB; a 7B-size model (32 layers × 32 heads, d = 128) at
#: r = 4 with every centroid set is ~3.5 MB. Equal to `server.maxUploadSize` (MB) in
#: .streamlit/config.toml, so an upload the server accepts is never refused here.
DEFAULT_MAX_PROJECTIONS_MB = 8
#: Loading needs more than the weights (tokenizer, activations of the first text, allocator
#: slack): refuse unless weights × this factor fit.
MEMORY_HEADROOM = 1.25
_MB = 1024 * 1024


class InputRefused(ValueError):
    """The served app refuses this input; the message says why and what to do instead."""


def is_loopback(address: str | None) -> bool:
    """True when ``address`` only accepts connections from this machine.

    Empty or ``None`` is Streamlit's default, *every* interface, so it is not loopback; a host
    name other than ``localhost`` may resolve anywhere, so it is treated as exposed too.
    """
    if not address or not address.strip():
        return False
    address = address.strip().strip("[]")
    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _positive_int(environ: Mapping[str, str], key: str, default: int) -> int:
    raw = environ.get(key, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise InputRefused(f"{key} must be a positive integer, got {raw!r}")
    return value


def _normalise(name: str) -> str:
    """One spelling per model: local paths absolute without a trailing slash, ids as typed."""
    name = name.strip()
    if looks_like_path(name):
        return os.path.normpath(os.path.abspath(os.path.expanduser(name)))
    return name


def looks_like_path(name: str) -> bool:
    """A local path rather than a hub id (``org/name`` has one slash and no leading dot)."""
    name = name.strip()
    return (
        name.startswith(("/", "./", "../", "~", "\\")) or name in {".", ".."}
        or name.count("/") > 1 or "\\" in name or os.path.isabs(name)
    )


@dataclass(frozen=True)
class ServingPolicy:
    """What one server accepts. ``ServingPolicy()`` is the permissive localhost policy."""

    exposed: bool = False
    allowlist: tuple[str, ...] = ()
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    max_projections_bytes: int = DEFAULT_MAX_PROJECTIONS_MB * _MB

    @classmethod
    def from_env(
        cls, address: str | None, environ: Mapping[str, str] | None = None
    ) -> ServingPolicy:
        """The policy of a server bound to ``address`` (e.g. Streamlit's ``server.address``).

        ``SPARSEFINDER_MODEL_ALLOWLIST``: comma-separated model ids or folders allowed when
        exposed; ``SPARSEFINDER_MAX_TEXT_CHARS`` / ``SPARSEFINDER_MAX_PROJECTIONS_MB``: caps.
        """
        environ = os.environ if environ is None else environ
        names = [n.strip() for n in environ.get(ENV_ALLOWLIST, "").split(",")]
        return cls(
            exposed=not is_loopback(address),
            allowlist=tuple(_normalise(n) for n in names if n),
            max_text_chars=_positive_int(environ, ENV_MAX_TEXT_CHARS, DEFAULT_MAX_TEXT_CHARS),
            max_projections_bytes=_MB * _positive_int(
                environ, ENV_MAX_PROJECTIONS_MB, DEFAULT_MAX_PROJECTIONS_MB),
        )

    # ------------------------------------------------------------------ inputs

    def check_text(self, text: str) -> str:
        """``text`` when within the character cap, else :class:`InputRefused`."""
        if len(text) > self.max_text_chars:
            raise InputRefused(
                f"The text is too long: {len(text):,} characters, the limit is "
                f"{self.max_text_chars:,}. The model reads at most a few thousand characters "
                "(its token limit), so paste a shorter excerpt."
            )
        return text

    def check_text_bytes(self, size: int, name: str = "the file") -> None:
        """Refuse an upload before decoding it: UTF-8 takes at most 4 bytes per character."""
        if size > 4 * self.max_text_chars:
            raise InputRefused(
                f"{name} is too large ({size / _MB:.1f} MB); texts are limited to "
                f"{self.max_text_chars:,} characters: upload a shorter excerpt."
            )

    def check_model_name(self, name: str) -> str:
        """The name to load; exposed servers only load ``default`` and the allowlist.

        The refusal is the same whether or not a path exists, so it reveals nothing.
        """
        name = name.strip()
        if not self.exposed or name == ALWAYS_ALLOWED or _normalise(name) in self.allowlist:
            return name
        allowed = ", ".join(repr(n) for n in (ALWAYS_ALLOWED, *self.allowlist))
        raise InputRefused(
            f"model {name!r} is not on this server's allowlist (allowed: {allowed}). The app is "
            f"served beyond localhost, so only listed models load; the server's operator can add "
            f"names to {ENV_ALLOWLIST} (comma-separated ids or folders)."
        )

    def may_prepare(self, name: str) -> bool:
        """Whether a browser may start ``sparsefinder prepare`` for ``name``: anything on a
        local server; exposed, only the allowlisted models (minutes of CPU each)."""
        return not self.exposed or _normalise(name.strip()) in self.allowlist

    def check_projections_size(
        self, source: str | Path | bytes, name: str = "the projections file"
    ) -> int:
        """Size in bytes of a projections file (a path or its content), within the cap."""
        if isinstance(source, bytes | bytearray | memoryview):
            size = len(source)
        else:
            size = Path(source).stat().st_size
            name = Path(source).name
        check_projections_bytes(size, self.max_projections_bytes, name)
        return size


def check_projections_bytes(size: int, limit: int | None, name: str) -> None:
    """Refuse a projections file larger than ``limit`` bytes before ``torch.load`` reads it."""
    if limit is not None and size > limit:
        raise InputRefused(
            f"{name} is too large for a projections file ({size / _MB:.1f} MB, the limit is "
            f"{limit / _MB:.0f} MB); projections of one model are a few MB at most: check that "
            "this is the file written by `sparsefinder train`."
        )


# ---------------------------------------------------------------------- memory


def available_memory_bytes() -> int | None:
    """Memory a new allocation can get without swapping or an OOM kill; None if unknown.

    ``MemAvailable`` (psutil if installed, else /proc/meminfo), capped by the cgroup v2 limit
    of a container (``memory.max − memory.current``): inside Docker, /proc/meminfo shows the
    host's memory, not what the container may use.
    """
    free: int | None = None
    try:
        import psutil

        free = int(psutil.virtual_memory().available)
    except ImportError:
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
        except OSError:
            free = None
    cgroup = _cgroup_headroom(Path("/sys/fs/cgroup"))
    if cgroup is not None:
        free = cgroup if free is None else min(free, cgroup)
    return free


def _cgroup_headroom(root: Path) -> int | None:
    try:
        limit = (root / "memory.max").read_text().strip()
        used = int((root / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    if limit == "max":
        return None
    try:
        return max(0, int(limit) - used)
    except ValueError:
        return None


def _itemsize(dtype: Any) -> int | None:
    """Bytes per element of a torch dtype, a dtype name ('float16', 'torch.bfloat16') or a
    safetensors dtype code ('F16', 'BF16', 'I64'...)."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype.itemsize
    if not isinstance(dtype, str) or not dtype:
        return None
    codes = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
             "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
    if dtype in codes:
        return codes[dtype]
    found = getattr(torch, dtype.removeprefix("torch."), None)
    return found.itemsize if isinstance(found, torch.dtype) else None


def _config_dtype_size(config: Any) -> int | None:
    """Bytes per float parameter transformers will load (its ``dtype="auto"`` reads the
    config's dtype first)."""
    return _itemsize(getattr(config, "dtype", None))


def safetensors_bytes(folder: Path, config: Any = None) -> int | None:
    """Bytes of the weights in ``folder``'s ``*.safetensors`` from their headers only.

    A safetensors file starts with an 8-byte little-endian header length and a JSON header
    listing every tensor's dtype and shape, so this reads kilobytes, never the weights.
    Floating tensors count at the config's dtype when it sets one (what transformers loads).
    """
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    target = _config_dtype_size(config) if config is not None else None
    total = 0
    for file in files:
        try:
            with file.open("rb") as handle:
                length = int.from_bytes(handle.read(8), "little")
                if not 0 < length < 100 * _MB:
                    return None
                header = json.loads(handle.read(length))
        except (OSError, ValueError):
            return None
        for key, entry in header.items():
            if key == "__metadata__" or not isinstance(entry, dict):
                continue
            size = _itemsize(entry.get("dtype"))
            if size is None:
                return None
            if target is not None and str(entry.get("dtype", "")).startswith(("F", "BF")):
                size = target
            total += math.prod(int(s) for s in entry.get("shape", [])) * size
    return total


def config_bytes(config: Any) -> int | None:
    """Bytes of the parameters and buffers of ``AutoModel.from_config(config)``, counted on
    PyTorch's meta device (shapes only, no memory), at the dtype transformers would load."""
    import torch
    from transformers import AutoModel

    try:
        with torch.device("meta"):
            model = AutoModel.from_config(config)
    except Exception:  # an architecture AutoModel cannot build: no estimate, not an error
        return None
    size = _config_dtype_size(config) or 4
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * (size if t.is_floating_point() else t.element_size())
               for t in tensors)


def estimate_model_bytes(source: str | Path, config: Any) -> int | None:
    """Memory the weights of ``source`` will take once loaded; None when it cannot be told.

    Safetensors headers of a local folder when there are some (exact), else the model built
    from ``config`` on the meta device (a hub id, or ``.bin`` weights).
    """
    folder = Path(source)
    if folder.is_dir():
        found = safetensors_bytes(folder, config)
        if found is not None:
            return found
    return config_bytes(config)


def check_fits(name: str, needed: int | None, free: int | None, where: str = "memory") -> None:
    """Refuse to load ``name`` when ``needed`` × headroom bytes exceed ``free``."""
    if needed is None or free is None:
        return
    if needed * MEMORY_HEADROOM > free:
        raise InputRefused(
            f"model {name!r} needs about {needed / _MB:,.0f} MB for its weights (plus "
            f"{MEMORY_HEADROOM - 1:.0%} headroom), but only {free / _MB:,.0f} MB of {where} is "
            "free; it was not loaded. Pick a smaller model, or free memory on the server."
        )
