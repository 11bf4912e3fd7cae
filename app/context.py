"""What a full run of the sidebar produces for the pages: the loaded model, the prepared
text, the view state and the messages, keyed by :class:`CacheKey`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import streamlit as st

from sparsefinder.explore import prepared as prep
from sparsefinder.explore import state as urlstate
from sparsefinder.models.loading import LoadedModel

CONTEXT_KEY = "_context"


class CacheKey(NamedTuple):
    """What every cache derived from the current text is keyed by (a plain tuple underneath,
    so Streamlit hashes it as before); named, so no page slices it by position."""

    model: str
    alpha: float
    text_hash: str
    projections: str  # the projections file's digest, or "none"

    @property
    def model_alpha(self) -> tuple[str, float]:
        return (self.model, self.alpha)

    @property
    def model_key(self) -> tuple[str, float, str]:
        """Model, α and projections: caches that do not depend on the text."""
        return (self.model, self.alpha, self.projections)

@dataclass
class AppContext:
    """What the sidebar produced in this run; pages draw from it (never from widgets)."""

    loaded: LoadedModel | None = None
    prepared: prep.PreparedText | None = None
    state: urlstate.ViewState = field(default_factory=urlstate.ViewState)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    projections_note: str | None = None
    projections_failed: bool = False  # a file was given but cannot be used (vs. none given)
    cache_key: CacheKey | None = None  # keys every cache derived from the current text

    @property
    def ready(self) -> bool:
        return self.loaded is not None and self.prepared is not None


def context() -> AppContext:
    """The context of the last full run (pages and their fragments read it)."""
    return st.session_state.get(CONTEXT_KEY) or AppContext(errors=["The app is starting."])
