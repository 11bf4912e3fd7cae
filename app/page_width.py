"""The width of the page's main column, measured in the browser and sent to the server.

Plotly draws a figure at the height the server gives it; a square panel grows with the page
only when that height follows the width. A tiny component watches the main column and reports
its width, rounded to ``STEP`` px (a resize reruns the fragment once per step, not per
pixel). It draws nothing and takes no room on the page.
"""

from __future__ import annotations

import functools
from typing import Any

import streamlit as st

#: Widths are reported in steps of this many px.
STEP = 40
KEY = "w_page_width"

_JS = f"""
export default function(component) {{
  const {{ setStateValue, parentElement }} = component;
  const main = document.querySelector('[data-testid="stMainBlockContainer"]');
  if (!main) return;
  const root = parentElement.host ?? parentElement;  // a shadow root's host element
  const holder = root.closest ? root.closest('[data-testid="stElementContainer"]') : null;
  if (holder) holder.style.display = 'none';
  let sent = null;
  const report = () => {{
    const style = getComputedStyle(main);
    const inner = main.clientWidth - parseFloat(style.paddingLeft) -
      parseFloat(style.paddingRight);
    const width = Math.round(inner / {STEP}) * {STEP};
    if (width > 0 && width !== sent) {{ sent = width; setStateValue('width', width); }}
  }};
  let timer = null;
  const observer = new ResizeObserver(() => {{
    clearTimeout(timer); timer = setTimeout(report, 150);
  }});
  observer.observe(main);
  report();
  return () => {{ observer.disconnect(); clearTimeout(timer); }};
}}
"""

@functools.cache
def _component() -> Any:
    """Registered once, on first use (no import side effects)."""
    return st.components.v2.component("sparsefinder.page_width", js=_JS)


def main_width() -> int | None:
    """The main column's width in CSS px, or None before the browser has reported it (the
    first run, and AppTest, which runs no JavaScript)."""
    result = _component()(key=KEY, on_width_change=lambda: None)
    width = getattr(result, "width", None)
    return int(width) if isinstance(width, (int, float)) and width > 0 else None
