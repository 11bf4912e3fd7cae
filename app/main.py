"""Streamlit entrypoint: shared sidebar controls, then the page chosen in the navigation.

Run with ``make run`` (``python -m app.serve``: ``streamlit run app/main.py`` that warms the
first screen as the server starts). Every page reads what the sidebar
produced through ``app.shell.context()``; to add a page, add one line to ``PAGES``.

Pages live in ``app/app_pages/``, not ``app/pages/``: Streamlit treats a ``pages/`` folder next
to the entrypoint as a legacy multipage app on a fresh server's first run, so a deep link such
as ``/tokens`` would run that page without this script (no sidebar, no imports set up).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `streamlit run app/main.py` only puts app/ on the path. Appended, not prepended: an installed
# sparsefinder (pip install .) is the one used; the checkout only supplies the `app` package.
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

import streamlit as st  # noqa: E402

from app.import_lock import HEAVY_IMPORTS  # noqa: E402

# A cold start spends seconds importing torch/transformers and loading the model: say so at
# once instead of a blank page (the message is replaced by the app when it is ready).
# The favicon is a local file served by this server: a ":material/…:" or emoji icon makes the
# browser fetch it from a font/emoji CDN (a console error offline, a request to a third party).
st.set_page_config(page_title="Sparsefinder", layout="wide",
                   page_icon=str(Path(__file__).with_name("favicon.png")))
# Less blank space above the page title, so the Explorer's panels start on a laptop's first
# screen (1280×800).
# Metric labels wrap instead of being cut with an ellipsis where a row of metrics is narrow
# (six headline metrics on a 1024×768 screen).
st.markdown("<style>[data-testid='stMainBlockContainer']{padding-top:2.5rem}"
            "[data-testid='stMetricLabel'],[data-testid='stMetricLabel'] *"
            "{white-space:normal!important;overflow:visible!important;"
            "text-overflow:clip!important;overflow-wrap:anywhere}"
            ".st-key-w_plotly_preload{display:none}</style>",
            unsafe_allow_html=True)
# Two sessions on a cold server import pandas/Plotly/PyTorch at once: one at a time
# (app/import_lock.py says why).
with HEAVY_IMPORTS:
    _starting = st.empty()
    if "_started" not in st.session_state:  # a session's first run only (no flash on reruns)
        with _starting.container():
            st.info("Starting Sparsefinder: loading PyTorch and the model (a few seconds on the "
                    "first visit)…", icon=":material/hourglass_top:")
            # An empty, hidden chart: the browser fetches and compiles its Plotly code (~4.7 MB)
            # while the server still imports and loads, not after the first figures arrive.
            st.plotly_chart({"data": [{"type": "scatter", "x": [], "y": []}], "layout": {}},
                            key="w_plotly_preload")

    from app import run_log, shell  # noqa: E402
    from sparsefinder import runtime  # noqa: E402

HERE = Path(__file__).resolve().parent

#: (file, title, icon). The first page is the default one.
PAGES: list[tuple[str, str, str]] = [
    ("app_pages/explorer.py", "Explorer", ":material/grid_view:"),
    ("app_pages/learned_space.py", "Learned space", ":material/bubble_chart:"),
    ("app_pages/pareto.py", "Pareto", ":material/show_chart:"),
    ("app_pages/tokens.py", "Token view", ":material/segment:"),
    ("app_pages/clusters.py", "Clusters", ":material/scatter_plot:"),
    ("app_pages/coreference.py", "Coreference", ":material/link:"),
    ("app_pages/atlas.py", "Atlas", ":material/travel_explore:"),
]


def main() -> None:
    with run_log.timed("full"):  # off unless SPARSEFINDER_RUN_LOG is set (app_load.py)
        _run()


def _run() -> None:
    # The app is an entry point: it may opt in to process-wide settings (both idempotent).
    runtime.tune_cpu_allocator()
    runtime.set_torch_threads()
    navigation = st.navigation([
        st.Page(HERE / path, title=title, icon=icon, default=index == 0)
        for index, (path, title, icon) in enumerate(PAGES)
    ])
    try:
        shell.build_context()
    except Exception as error:  # last resort: a message in the page, never a traceback
        st.session_state[shell.CONTEXT_KEY] = shell.AppContext(
            errors=[f"Unexpected error while preparing the view: {type(error).__name__}: "
                    f"{error}"])
    _starting.empty()
    st.session_state["_started"] = True
    navigation.run()


main()
