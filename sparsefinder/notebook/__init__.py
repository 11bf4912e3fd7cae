"""Sparsefinder in a notebook: ``explore(model_or_id, text)`` shows the Explorer's core.

``from sparsefinder.notebook import explore`` imports nothing heavy; ipywidgets and Plotly's
widget load when :func:`explore` draws live controls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparsefinder.notebook.explorer import Explorer


def explore(model: Any, text: str, *, method: str | None = None, target: float | None = None,
            layer: int = 0, head: int = 0, alpha: float = 1.5, device: str = "cpu",
            widgets: bool | None = None) -> Explorer:
    """Explore ``text`` on ``model`` (a name such as ``"default"``, a local folder, a cached
    Hugging Face id, or a loaded model): the model runs once, the controls then only predict.

    ``widgets``: None draws live controls where a Jupyter kernel with ipywidgets runs (else
    static figures and one line that says why); True or False forces one or the other.
    """
    from sparsefinder.notebook import explorer, session

    reason = explorer.widget_support()
    live = reason is None if widgets is None else bool(widgets)
    loaded = session.open_model(model, alpha=alpha, device=device)
    prepared = session.prepare_text(loaded, text)
    return explorer.Explorer(prepared, method=method, target=target, layer=layer, head=head,
                             widgets=live, reason=None if live else reason)


__all__ = ["explore"]
