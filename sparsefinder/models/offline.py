"""Whether a model name can load on this machine without a network, said before loading.

Why: with ``HF_HUB_OFFLINE=1`` transformers answers a hub id that is not cached with a long
chain of errors about connections. One message saying what was looked for, where, and how
to make it available serves the user better.
"""

from __future__ import annotations

import os
from pathlib import Path

from sparsefinder.serving import looks_like_path

#: Names that need no folder and no cache (the bundled model).
BUNDLED_NAMES = ("default", "default-softmax")


class ModelNotAvailable(ValueError):
    """The model is neither bundled, nor a local folder, nor in the local hub cache."""


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache this process reads (``HF_HUB_CACHE`` and friends)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def is_cached(repo_id: str) -> bool:
    """Whether the hub cache holds ``repo_id``'s ``config.json`` (any cached revision)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a valid repo id
        return False
    return isinstance(found, str)


def check_available(name: str) -> None:
    """Refuse, with where it was looked for and how to get it, a model that cannot load
    offline; a local folder or the bundled model passes (their loader checks the rest)."""
    name = name.strip()
    if name in BUNDLED_NAMES or Path(name).expanduser().exists() or looks_like_path(name):
        return
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in {"", "0", "false", "False"}
    if not offline or is_cached(name):
        return
    raise ModelNotAvailable(
        f"model {name!r} is not available offline: it is no local folder, and the Hugging "
        f"Face cache at {hub_cache_dir()} holds no config.json for the hub id {name!r}. Make "
        f"it available: on a machine with a network run `huggingface-cli download {name}` "
        "(the same cache, or copy it here and set HF_HUB_CACHE to it), or save the model "
        "with `save_pretrained(FOLDER)` and pass that folder")
