"""The waits a new user meets, measured in a real headless browser: the first graph after a
cold start, and the first visit of the Pareto page on a long example.

Starts the app from scratch as ``make run`` does (``python -m app.serve``: a new Python
process, nothing imported, the model not loaded; its warm-up thread starts with it), opens the
Explorer at its default link in Debian's chromium and times, from the moment the server
process is started:

- ``server_ready_s``: the server answers its health check;
- ``cold_first_graph_s``: the Explorer's first screen is drawn (headline metrics and the head
  figure: ``app_latency.FIRST_SCREEN_JS``).

Then, in the same browser session, it opens the Pareto page on ``--example`` (by default the
~480-token ``long_report_512``, a text the first screen has not prepared) and times, from the
navigation:

- ``first_pareto_chart_s``: the first sparsity–recall chart is plotted;
- ``first_pareto_s``: the page's run has ended (every curve drawn).

Disk caches (the compiled kernels in the user cache) are the machine's own, as a user's
second start would find them; ``--fresh-cache`` points ``SPARSEFINDER_CACHE_DIR`` to an empty
folder instead. Goals on the 2-core dev CPU: cold_first_graph_s <= 8, first_pareto_s <= 10.
Timings on a shared machine are indicative: the load average is printed with them.

    .venv/bin/python benchmarks/app_waits.py [--example long_report_512] [--fresh-cache]

``--smoke``: the Pareto page on the short default example, waits of at most 240 s.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "app"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import parse, parser  # noqa: E402
from app_latency import (  # noqa: E402  (the slider benchmark's server and first-screen check)
    CHROMIUM,
    CHROMIUM_ARGS,
    FIRST_SCREEN_JS,
    free_port,
    start_server,
    wait_healthy,
)
from browser_helpers import wait_until_idle  # noqa: E402

#: The Pareto page's first chart: a Plotly plot with at least one curve drawn (not the hidden
#: empty chart of a session's first run, which only makes the browser load Plotly early).
PARETO_CHART_JS = """(() => [...document.querySelectorAll('.js-plotly-plot')].some(
  (plot) => !plot.closest('.st-key-w_plotly_preload') && Array.isArray(plot.data)
            && plot.data.length > 0))()"""


def measure(port: int, started: float, example: str, timeout_ms: int) -> dict[str, float]:
    """The waits, in seconds (see the module docstring)."""
    from playwright.sync_api import sync_playwright

    out: dict[str, float] = {}
    with sync_playwright() as play:
        browser = play.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"http://localhost:{port}/", timeout=timeout_ms)
        page.wait_for_function(FIRST_SCREEN_JS, timeout=timeout_ms, polling=100)
        out["cold_first_graph_s"] = time.monotonic() - started
        wait_until_idle(page, timeout=timeout_ms)
        start = time.monotonic()
        page.goto(f"http://localhost:{port}/pareto?example={example}", timeout=timeout_ms)
        page.wait_for_function(PARETO_CHART_JS, timeout=timeout_ms, polling=100)
        out["first_pareto_chart_s"] = time.monotonic() - start
        wait_until_idle(page, timeout=timeout_ms)
        out["first_pareto_s"] = time.monotonic() - start
        errors = page.locator("[data-testid='stException']").count()
        browser.close()
    if errors:
        raise RuntimeError(f"the app showed {errors} exception(s)")
    return out


def main() -> int:
    made = parser(__doc__.splitlines()[0])
    made.add_argument("--example", default="long_report_512",
                      help="the bundled example the Pareto page opens on")
    made.add_argument("--fresh-cache", action="store_true",
                      help="an empty SPARSEFINDER_CACHE_DIR (kernels compiled anew)")
    made.add_argument("--timeout", type=float, default=300.0, help="seconds a wait may take")
    args = parse(made, smoke={"example": "short_dialogue", "timeout": 240.0})
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is missing: `make browser` (apt-get install chromium) first",
              file=sys.stderr)
        return 2
    print(f"load average before: {os.getloadavg()}", flush=True)
    scratch = tempfile.TemporaryDirectory()
    if args.fresh_cache:
        os.environ["SPARSEFINDER_CACHE_DIR"] = scratch.name
    port = free_port()
    started = time.monotonic()
    server = start_server(port, None)
    try:
        wait_healthy(port, timeout=args.timeout)
        ready = time.monotonic() - started
        waits = {"server_ready_s": ready, **measure(port, started, args.example,
                                                    int(args.timeout * 1000))}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        scratch.cleanup()
    print(f"server ready {waits['server_ready_s']:.1f} s, first graph "
          f"{waits['cold_first_graph_s']:.1f} s after the start; Pareto on {args.example}: "
          f"first chart {waits['first_pareto_chart_s']:.1f} s, complete "
          f"{waits['first_pareto_s']:.1f} s (load average {os.getloadavg()[0]:.2f})")
    print(" ".join(f"{key}={value:.2f}" for key, value in waits.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
