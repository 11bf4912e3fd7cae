"""What the model box offers: only models that load on this machine without a network.

The names come from :func:`sparsefinder.models.local_models.hub_cache_models` (complete
snapshots of the local Hugging Face cache); the box never suggests a hub id that is not there.
"""

from __future__ import annotations

import streamlit as st

from sparsefinder.models.local_models import hub_cache_models


def cached_hub_models() -> list[str]:
    """Hub ids with a complete snapshot in the local cache this process reads."""
    from huggingface_hub import constants

    return _hub_models(str(constants.HF_HUB_CACHE))


@st.cache_data(ttl=60, show_spinner=False)
def _hub_models(cache_dir: str) -> list[str]:
    """The cache at ``cache_dir``, re-read at most once a minute (a model downloaded meanwhile
    appears without a restart)."""
    return [model.name for model in hub_cache_models(cache_dir)]


def placeholder(names: list[str]) -> str:
    """The model box's example: a cached hub id when there is one, else a folder."""
    return f"e.g. {names[0]} or /path/to/model" if names else "a model folder, e.g. /path/to/model"


def prepared_names() -> list[str]:
    """Models with a bundle from ``sparsefinder prepare`` (their learned methods are ready),
    as they were named when prepared."""
    from sparsefinder.model_bundles import prepared_models

    return sorted(prepared_models())


def caption(names: list[str], prepared: list[str] | None = None) -> str:
    """The models of the local cache (or how to add one), then the prepared ones."""
    if names:
        line = "In the local Hugging Face cache: " + ", ".join(f"`{n}`" for n in names)
    else:
        line = ("No model in the local Hugging Face cache: give a folder saved with "
                "`save_pretrained`, or download one where there is a network.")
    if prepared:
        line += "  \nPrepared (learned methods ready): " + ", ".join(f"`{n}`" for n in prepared)
    return line
