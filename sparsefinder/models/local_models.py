"""The models this machine can load without a network: the bundled one, complete snapshots in
the local Hugging Face cache, and model folders the user names.

Why: a model box that suggests a hub id (``bert-base-uncased``) fails offline. Listing only
what is really here, read from the cache with ``huggingface_hub.scan_cache_dir``, means every
suggestion loads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: What a snapshot or folder needs to load: a config, weights and a tokenizer.
WEIGHTS = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "vocab.json")


@dataclass(frozen=True)
class LocalModel:
    """One loadable model: ``name`` is what ``load_model`` takes."""

    name: str
    source: str  # "bundled", "hub cache" or "folder"
    detail: str = ""  # where it is (a path) or which revision


def is_model_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds a config, weights and a tokenizer (a ``save_pretrained``
    folder), the files ``load_model`` reads."""
    folder = Path(folder).expanduser()
    if not (folder / "config.json").is_file():
        return False
    has_weights = any(next(folder.glob(pattern), None) is not None for pattern in WEIGHTS)
    return has_weights and any((folder / name).is_file() for name in TOKENIZER_FILES)


def hub_cache_models(cache_dir: str | Path | None = None) -> list[LocalModel]:
    """Model repos of the local hub cache with at least one complete snapshot (config,
    weights, tokenizer), by id; an absent or unreadable cache lists none."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(cache_dir)
    except (CacheNotFound, OSError, ValueError):
        return []
    found = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        complete = [rev for rev in repo.revisions if is_model_folder(rev.snapshot_path)]
        if complete:
            newest = max(complete, key=lambda rev: rev.last_modified)
            found.append(LocalModel(repo.repo_id, "hub cache", str(newest.snapshot_path)))
    return found


def local_models(folders: Iterable[str | Path] = (),
                 cache_dir: str | Path | None = None) -> list[LocalModel]:
    """Every model that loads offline: the bundled one, the hub cache's, then ``folders``
    that are model folders (others are left out)."""
    from sparsefinder.models.loading import DEFAULT_MODEL, default_model_path

    listed = [LocalModel(DEFAULT_MODEL, "bundled", str(default_model_path()))]
    listed += hub_cache_models(cache_dir)
    listed += [LocalModel(str(Path(f).expanduser()), "folder", str(Path(f).expanduser()))
               for f in folders if is_model_folder(f)]
    return listed
