"""Sparsefinder in a notebook: ``explore(model_or_id, text)`` shows the Explorer's core.

    from sparsefinder.notebook import explore
    view = explore("default", "The cat sat on the mat because it was warm.")
    view                      # live controls in Jupyter / VS Code (static where unsupported)
    view.save_html("view.html")   # one self-contained file to share
"""

from __future__ import annotations

from typing import Any

from sparsefinder.notebook.session import ExploreSession, open_session
from sparsefinder.notebook.widget import Explorer, widget_support

__all__ = ["ExploreSession", "Explorer", "explore", "widget_support"]


def explore(model_or_id: Any, text: str, *, alpha: float | None = None,
            device: str = "cpu", **setting: Any) -> Explorer:
    """Gold | predicted | diff panels of ``text`` under ``model_or_id`` (``"default"``, a
    local folder, a cached hub id or a loaded model), with method, target sparsity, layer
    and head as live controls. A model prepared with `sparsefinder prepare` gets its learned
    methods; any other model the training-free ones. ``setting``: the first ``method``,
    ``target``, ``layer`` or ``head``."""
    session = open_session(model_or_id, text, alpha=alpha, device=device)
    if setting:
        session.update(**setting)
    return Explorer(session)
