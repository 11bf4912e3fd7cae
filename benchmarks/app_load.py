"""Ten users on one server: first graph and slider latency under load, server memory.

Serves the app (``streamlit run app/main.py``) once and drives ``--sessions`` headless
chromium pages (Playwright's async API, one browser, one context per user) against it:

1. one user opens the Explorer on the ~480-token example (the cold start, reported apart);
2. the other users open the same link at the same moment; each one's time to its first
   graph (nine metrics and the head figure drawn) is a sample of ``first_graph``;
3. every user moves the window slider ``--moves`` times, all users at once; each sample is
   the time from the key press to the metrics showing the new setting (``slider``).

Errors are pages that time out or show a Streamlit exception. The server's RSS (VmRSS of the
process) is read at the end. Everything is bounded in time (``--timeout`` per wait) and only
talks to 127.0.0.1. The last line reads
``first_graph_p95_s=<> slider_p95_s=<> rss_mb=<> errors=<>``.

Run: ``.venv/bin/python benchmarks/app_load.py [--sessions 10] [--moves 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from app_latency import CHROMIUM, CHROMIUM_ARGS, free_port, start_server, wait_healthy  # noqa: E402

LINK = "/?method=kmeans&B=8&k=2&window=3&example=long_report_512"
READY_JS = ("document.querySelectorAll('[data-testid=\"stMetricValue\"]').length >= 9 && "
            "document.querySelectorAll('.js-plotly-plot').length >= 2")
METRICS_JS = ("() => [...document.querySelectorAll('[data-testid=\"stMetricValue\"]')]"
              ".map(e => e.textContent).join('|')")


def p95(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def open_user(browser, url: str, timeout_ms: int) -> tuple[object, float]:
    context = await browser.new_context(viewport={"width": 1600, "height": 1400})
    page = await context.new_page()
    start = time.perf_counter()
    await page.goto(url, timeout=timeout_ms)
    await page.wait_for_function(READY_JS, timeout=timeout_ms)
    return page, time.perf_counter() - start


async def move_slider(page, moves: int, timeout_ms: int) -> list[float]:
    samples = []
    thumb = (page.locator("[data-testid='stSlider']").filter(has_text="Window size")
             .get_by_role("slider"))
    await thumb.focus()
    for step in range(moves):
        before = await page.evaluate(METRICS_JS)
        start = time.perf_counter()
        await thumb.press("ArrowRight" if step % 2 == 0 else "ArrowLeft")
        await page.wait_for_function(f"(b) => ({METRICS_JS})() !== b", arg=before,
                                     timeout=timeout_ms)
        samples.append(time.perf_counter() - start)
    return samples


async def run(args: argparse.Namespace, port: int) -> tuple[float, list, list, int]:
    from playwright.async_api import async_playwright

    url = f"http://127.0.0.1:{port}{LINK}"
    timeout_ms = int(args.timeout * 1000)
    errors = 0
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        first_page, cold = await open_user(browser, url, timeout_ms)
        results = await asyncio.gather(*(open_user(browser, url, timeout_ms)
                                         for _ in range(args.sessions - 1)),
                                       return_exceptions=True)
        pages, first_graph = [first_page], []
        for result in results:
            if isinstance(result, BaseException):
                errors += 1
            else:
                pages.append(result[0])
                first_graph.append(result[1])
        moved = await asyncio.gather(*(move_slider(p, args.moves, timeout_ms) for p in pages),
                                     return_exceptions=True)
        slider = []
        for result in moved:
            if isinstance(result, BaseException):
                errors += 1
            else:
                slider.extend(result)
        for page in pages:
            errors += await page.locator("[data-testid='stException']").count()
        await browser.close()
    return cold, first_graph, slider, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--moves", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per wait")
    args = parser.parse_args()
    port = free_port()
    server = start_server(port, None)
    try:
        wait_healthy(port)
        cold, first_graph, slider, errors = asyncio.run(run(args, port))
        rss = rss_mb(server.pid)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    print(f"{args.sessions} sessions on one server, load avg {os.getloadavg()[0]:.1f} "
          f"({os.cpu_count()} cores); cold start (first user) {cold:.1f} s")
    if first_graph:
        print(f"first graph, users 2..{args.sessions}: median "
              f"{statistics.median(first_graph):.1f} s, max {max(first_graph):.1f} s")
    if slider:
        print(f"slider under load ({len(slider)} moves): median "
              f"{statistics.median(slider):.2f} s, max {max(slider):.2f} s")
    print(f"first_graph_p95_s={p95(first_graph):.2f} slider_p95_s={p95(slider):.2f} "
          f"rss_mb={rss:.0f} errors={errors}")


if __name__ == "__main__":
    main()
