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


def caption(names: list[str]) -> str:
    """One line naming the models of the local cache, or how to add one."""
    if names:
        return "In the local Hugging Face cache: " + ", ".join(f"`{n}`" for n in names)
    return ("No model in the local Hugging Face cache: give a folder saved with "
            "`save_pretrained`, or download one where there is a network.")
