"""Helpers of the real-browser tests (conftest.py is not importable in importlib mode): the
app served by `streamlit run`, Debian's chromium, and what a page must not show."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = ROOT / "artifacts"
SKIP_REASON = "/usr/bin/chromium is missing (`make browser` installs it)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(timeout: float = 120) -> tuple[str, Callable[[], None]]:
    """`streamlit run app/main.py` on a free port: (its URL once healthy, a stop function)."""
    port = _free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    # computed atlases go to a cache of the test run, not the user's ~/.cache
    env.setdefault("SPARSEFINDER_CACHE_DIR", tempfile.mkdtemp(prefix="sparsefinder-cache-"))
    process = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "streamlit"), "run", "app/main.py",
         "--server.port", str(port), "--server.headless", "true",
         "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def stop() -> None:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)

    url = f"http://localhost:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return url, stop
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                stop()
                raise RuntimeError("streamlit did not become healthy") from None
            time.sleep(0.3)


#: True once the app's script (or a fragment) has finished its run and every element is
#: drawn: elements whose code loads lazily (metrics, widgets) and components show skeletons
#: until then, and a check of a skeleton would pass on nothing.
IDLE_JS = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  return app !== null && app.dataset.testScriptState === 'notRunning'
    && document.querySelector('[data-testid="stSkeletonElement"], [data-testid="stSkeleton"], '
                              + '[data-testid="stAppSkeleton"]') === null;
}"""


def wait_until_idle(page, timeout: float = 180_000, settle: float = 0.2) -> None:
    """Wait for the run to end, and for it to stay ended ``settle`` seconds (a run may ask
    for another: a widget seeded from the URL, a fragment)."""
    while True:
        page.wait_for_function(IDLE_JS, timeout=timeout)
        time.sleep(settle)
        if page.evaluate(IDLE_JS):
            return


#: Every visible st.metric whose label, value or delta is cut off: wider than its box (the CSS
#: ellipsis of Streamlit's labels and values) or ending with an ellipsis.
CUT_METRICS_JS = """() => {
  const out = [];
  for (const m of document.querySelectorAll('[data-testid="stMetric"]')) {
    const box = m.getBoundingClientRect();
    if (box.width === 0 || box.height === 0) continue;  // not shown (a closed expander)
    const label = m.querySelector('[data-testid="stMetricLabel"]');
    const name = label ? label.innerText.trim() : '?';
    for (const [part, el] of [['label', label],
                              ['value', m.querySelector('[data-testid="stMetricValue"]')],
                              ['delta', m.querySelector('[data-testid="stMetricDelta"]')]]) {
      if (!el) continue;
      const text = el.innerText.trim();
      const nodes = [el, ...el.querySelectorAll('*')];
      const wide = nodes.find(n => n.clientWidth > 0 && n.scrollWidth > n.clientWidth + 1);
      const outside = nodes.find(n => n.getBoundingClientRect().right > box.right + 1);
      if (wide) {
        out.push(`${part} ${JSON.stringify(text)} of metric ${JSON.stringify(name)}: needs ` +
                 `${wide.scrollWidth}px, has ${wide.clientWidth}px`);
      } else if (outside) {
        out.push(`${part} ${JSON.stringify(text)} of metric ${JSON.stringify(name)} ` +
                 `overflows its box`);
      } else if (/(\\u2026|\\.\\.\\.)$/.test(text)) {
        out.push(`${part} ${JSON.stringify(text)} of metric ${JSON.stringify(name)} ends ` +
                 `with an ellipsis`);
      }
    }
  }
  return out;
}"""

#: The text of every exception box (Streamlit shows tracebacks there) and error box.
BOXES_JS = """() => ({
  exceptions: [...document.querySelectorAll('[data-testid="stException"]')]
    .map(e => e.innerText.trim().split('\\n').slice(0, 3).join(' ')),
  errors: [...document.querySelectorAll('[data-testid="stAlertContentError"]')]
    .filter(e => !e.closest('[data-testid="stException"]'))
    .map(e => e.innerText.trim().split('\\n').slice(0, 3).join(' ')),
})"""


def page_problems(page) -> list[str]:
    """What a page must never show: exception or error boxes, cut-off metrics."""
    boxes = page.evaluate(BOXES_JS)
    return ([f"exception box: {text}" for text in boxes["exceptions"]]
            + [f"error box: {text}" for text in boxes["errors"]]
            + [f"cut-off metric {text}" for text in page.evaluate(CUT_METRICS_JS)])


#: The page's Plotly charts, less the hidden empty one a session's first run draws so that the
#: browser loads Plotly early (app/main.py): it is gone once the page's own charts are drawn.
PLOTS_JS = "document.querySelectorAll('.js-plotly-plot:not(.st-key-w_plotly_preload *)')"
