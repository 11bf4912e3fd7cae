"""The Explorer's core as a notebook widget: gold | predicted | diff of one head, the headline
recall and sparsity, and the per-head grid, with the method, target sparsity, layer and head
as live controls.

Built on ipywidgets and Plotly's ``FigureWidget`` (anywidget), whose JavaScript ships inside
the Python packages: nothing is fetched from a CDN, so it works offline. Where widgets cannot
run (no ipywidgets, or no Jupyter kernel) it shows the same figures statically and says why
in one line. :meth:`Explorer.save_html` writes one self-contained file to share.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from sparsefinder.explore import prepared as prep
from sparsefinder.explore.state import DEFAULT_TARGET
from sparsefinder.notebook import session

#: The targets offered when no calibration table fits the model (raw methods ignore it).
FALLBACK_TARGETS = (DEFAULT_TARGET,)


def widget_support() -> str | None:
    """None when live widgets can run here, else the reason they cannot (one line)."""
    try:
        import anywidget  # noqa: F401  (Plotly's FigureWidget is an anywidget)
        import ipywidgets  # noqa: F401
    except ImportError as error:
        return (f"{error.name} is not installed (pip install ipywidgets anywidget), so the "
                "figures below are static")
    try:
        from IPython import get_ipython
    except ImportError:
        return "IPython is not installed, so the figures below are static"
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return "not running in a Jupyter kernel, so the figures below are static"
    return None


class Explorer:
    """One text of one model, explored live (``widgets=True``) or as static figures.

    The controls change a :class:`~sparsefinder.explore.state.ViewState`; each change predicts
    and scores it on the prepared text (:func:`session.compute`), never rerunning the model.
    """

    def __init__(self, prepared: prep.PreparedText, *, method: str | None = None,
                 target: float | None = None, layer: int = 0, head: int = 0,
                 widgets: bool = True, reason: str | None = None) -> None:
        self.prepared = prepared
        self.choices = session.method_choices(prepared)
        calibration = prepared.calibration
        self.targets = tuple(calibration.targets) if calibration and calibration.targets \
            else FALLBACK_TARGETS
        chosen = method or self.choices[0][1]
        if chosen not in {m for _, m in self.choices}:
            offered = ", ".join(m for _, m in self.choices)
            raise ValueError(f"method {chosen!r} does not run on this model and text; "
                             f"choose one of: {offered}")
        wanted = DEFAULT_TARGET if target is None else float(target)
        start = min(self.targets, key=lambda t: abs(t - wanted))
        self.view = session.compute(prepared, session.state_for(chosen, start, layer, head))
        self.reason = reason
        self.controls: dict[str, Any] = {}
        self.widget = self._build_widgets() if widgets else None

    # -- the live widgets ----------------------------------------------------------------

    def _build_widgets(self) -> Any:
        import ipywidgets as w
        import plotly.graph_objects as go

        state = self.view.state
        label = {"style": {"description_width": "initial"}}
        self.controls = {
            "method": w.Dropdown(options=self.choices, value=state.method_id,
                                 description="Method", layout=w.Layout(width="32em"), **label),
            "target": w.SelectionSlider(options=list(self.targets),
                                        value=min(self.targets,
                                                  key=lambda t: abs(t - state.target)),
                                        description="Target sparsity", **label),
            "layer": w.IntSlider(value=state.layer, min=0, max=self.prepared.num_layers - 1,
                                 description="Layer", **label),
            "head": w.IntSlider(value=state.head, min=0, max=self.prepared.num_heads - 1,
                                description="Head", **label),
        }
        self.headline = w.HTML()
        self.head_widget = go.FigureWidget()
        self.grid_widget = go.FigureWidget()
        for control in self.controls.values():
            control.observe(self._on_change, names="value")
        self._draw()
        return w.VBox([w.HBox([self.controls["method"], self.controls["target"]]),
                       w.HBox([self.controls["layer"], self.controls["head"]]),
                       self.headline, self.head_widget, self.grid_widget])

    def _on_change(self, _change: Any = None) -> None:
        c = self.controls
        state = session.state_for(c["method"].value, c["target"].value, c["layer"].value,
                                  c["head"].value)
        self.view = session.compute(self.prepared, state)
        self._draw()

    def _on_tile(self, _trace: Any, points: Any, _state: Any) -> None:
        """A click on a grid tile opens that head (the tile's customdata is (layer, head))."""
        if points.point_inds:
            index = points.point_inds[0]
            heads = self.prepared.num_heads
            self.controls["layer"].value, self.controls["head"].value = divmod(index, heads)

    def _draw(self) -> None:
        """Put the current view into the headline and the two figure widgets."""
        self.headline.value = self._headline_html()
        # the target only drives the calibrated methods (written ``family:budget``)
        self.controls["target"].disabled = ":" not in self.view.state.method_id
        for target, figure in ((self.head_widget, self.head_figure()),
                               (self.grid_widget, self.grid_figure())):
            with target.batch_update():
                target.data = ()
                target.add_traces(list(figure.data))
                target.layout = figure.layout
        tiles = self.grid_widget.data[-1]
        tiles.on_click(self._on_tile)

    # -- what both modes show -------------------------------------------------------------

    def _headline_html(self) -> str:
        notes = "".join(f"<br><small>{html.escape(n)}</small>"
                        for n in [*self.prepared.notes, *self.view.notes])
        return f"<b>{html.escape(self.view.headline)}</b>{notes}"

    def head_figure(self) -> Any:
        """Gold | predicted | diff of the selected head (a plain Plotly figure)."""
        return session.head_figure(self.prepared, self.view)

    def grid_figure(self) -> Any:
        """Every head's diff, the selected one outlined (a plain Plotly figure)."""
        return session.grid_figure(self.prepared, self.view)

    def save_html(self, path: str | Path) -> Path:
        """One self-contained HTML file of the current view (plotly.js inlined: it opens
        offline and can be shared as it is)."""
        path = Path(path)
        head = self.head_figure().to_html(full_html=False, include_plotlyjs=True)
        grid = self.grid_figure().to_html(full_html=False, include_plotlyjs=False)
        title = html.escape(f"Sparsefinder: {self.view.label}")
        path.write_text(
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title></head>"
            f"<body style='font-family:sans-serif'><p>{self._headline_html()}</p>"
            f"{head}{grid}</body></html>", encoding="utf-8")
        return path

    def _ipython_display_(self) -> None:
        from IPython.display import HTML, display

        if self.widget is not None:
            display(self.widget)
            return
        if self.reason:
            display(HTML(f"<p><i>{html.escape(self.reason)}.</i></p>"))
        display(HTML(f"<p>{self._headline_html()}</p>"))
        display(self.head_figure())
        display(self.grid_figure())
