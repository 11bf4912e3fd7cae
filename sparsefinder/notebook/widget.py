"""Live controls for :class:`~.session.ExploreSession` in Jupyter and VS Code.

Built on ipywidgets and Plotly's ``FigureWidget`` (an anywidget): both ship their JavaScript
inside the Python packages, so nothing is fetched from a CDN and the view works offline.
Where widgets cannot run (no kernel, or the packages are missing) the same figures are shown
static, after one line saying why. :meth:`Explorer.save_html` writes the current view as one
self-contained HTML file (plotly.js inline) to share.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from sparsefinder.explore.app_methods import FLOORED_ID, FLOORED_PARAMS
from sparsefinder.files import atomic_write
from sparsefinder.notebook.session import ExploreSession


def widget_support() -> str | None:
    """None when live widgets can run here, else why not (one line)."""
    try:
        import anywidget  # noqa: F401  (plotly's FigureWidget is an anywidget)
        import ipywidgets  # noqa: F401
    except ImportError as error:
        return (f"live controls need ipywidgets and anywidget ({error.name} is not installed:"
                " `pip install ipywidgets anywidget`)")
    try:
        from IPython import get_ipython
    except ImportError:
        return "live controls need IPython (not installed)"
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return "live controls need a Jupyter kernel (this is not one)"
    return None


class Explorer:
    """gold | predicted | diff of one head, the headline numbers and the per-head grid,
    with method, target sparsity, layer and head as controls."""

    def __init__(self, session: ExploreSession) -> None:
        self.session = session
        self.static_reason = widget_support()
        self._box: Any = None
        self._syncing = False

    # ------------------------------------------------------------------ the live view
    def widget(self) -> Any:
        """The ipywidgets box (built once); raises where widgets cannot run."""
        if self.static_reason is not None:
            raise RuntimeError(self.static_reason)
        if self._box is None:
            self._box = self._build()
        return self._box

    def _build(self) -> Any:
        import ipywidgets as w

        s = self.session
        # the floored distance reads as what it is (its id is its sweep curve's old name)
        shown = {FLOORED_ID: f"distance:budget, floor={FLOORED_PARAMS['floor']}"}
        self._method = w.Dropdown(options=[(shown.get(m, m), m) for m in s.methods],
                                  value=s.state.method_id, description="method")
        self._target = w.SelectionSlider(options=s.targets, value=s.state.target_sparsity,
                                         description="target", continuous_update=False)
        self._layer = w.IntSlider(value=s.state.layer, min=0, max=s.prepared.num_layers - 1,
                                  description="layer", continuous_update=False)
        self._head = w.IntSlider(value=s.state.head, min=0, max=s.prepared.num_heads - 1,
                                 description="head", continuous_update=False)
        self._headline = w.HTML()
        self._head_fig = go.FigureWidget(s.head_figure())
        self._grid_fig = go.FigureWidget(s.grid_figure())
        for control in (self._method, self._target, self._layer, self._head):
            control.observe(self._changed, names="value")
        self._show_headline()
        return w.VBox([w.HBox([self._method, self._target]), w.HBox([self._layer, self._head]),
                       self._headline, self._head_fig, self._grid_fig])

    def _changed(self, _change: dict) -> None:
        if self._syncing:
            return
        self.set(method=self._method.value, target=self._target.value,
                 layer=self._layer.value, head=self._head.value)

    def set(self, **changes: Any) -> Explorer:
        """Change the setting (``method``, ``target``, ``layer``, ``head``) and redraw."""
        self.session.update(**changes)
        if self._box is not None:
            self._sync_controls()
            _replace(self._head_fig, self.session.head_figure())
            _replace(self._grid_fig, self.session.grid_figure())
            self._show_headline()
        return self

    def _sync_controls(self) -> None:
        """Controls follow a setting made in code (``view.set(...)``), without rerunning."""
        state = self.session.state
        self._syncing = True
        try:
            self._method.value, self._target.value = state.method_id, state.target_sparsity
            self._layer.value, self._head.value = state.layer, state.head
        finally:
            self._syncing = False

    def _show_headline(self) -> None:
        notes = "".join(f"<br><i>{html.escape(n)}</i>" for n in self.session.notes)
        self._headline.value = f"<b>{html.escape(self.session.headline())}</b>{notes}"

    # ------------------------------------------------------------------ display
    def _ipython_display_(self) -> None:
        from IPython.display import display

        if self.static_reason is None:
            display(self.widget())
            return
        display(self._static_html(include_plotlyjs=True, reason=self.static_reason))

    def _static_html(self, include_plotlyjs: bool, reason: str | None = None) -> Any:
        from IPython.display import HTML

        return HTML(self.to_html(include_plotlyjs, reason))

    def to_html(self, include_plotlyjs: bool = True, reason: str | None = None) -> str:
        """The current view as HTML: headline, head panels, per-head grid."""
        s = self.session
        parts = [f"<p><i>Static view: {html.escape(reason)}.</i></p>" if reason else "",
                 f"<p><b>{html.escape(s.headline())}</b></p>",
                 *(f"<p><i>{html.escape(n)}</i></p>" for n in s.notes),
                 s.head_figure().to_html(full_html=False, include_plotlyjs=include_plotlyjs),
                 s.grid_figure().to_html(full_html=False, include_plotlyjs=False)]
        return "\n".join(p for p in parts if p)

    def save_html(self, path: str | Path) -> Path:
        """One self-contained HTML file of the current view (plotly.js inline: opens
        offline, no CDN)."""
        title = html.escape(f"Sparsefinder · {self.session.loaded.model_id}")
        page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>"
                f"</head><body>{self.to_html(include_plotlyjs=True)}</body></html>")
        data = page.encode("utf-8")
        return atomic_write(path, lambda handle: handle.write(data))


def _replace(target: go.FigureWidget, source: go.Figure) -> None:
    """Swap a FigureWidget's traces and layout for a new figure's, in one message."""
    with target.batch_update():
        target.data = ()
        target.add_traces(list(source.data))
        target.layout = source.layout
