"""Ten users on one server: first graph and slider latency under load, server memory.

Serves the app as ``make run`` does (``python -m app.serve``) once and drives ``--sessions``
headless chromium pages (Playwright's async API, one browser, one context per user) against it:

1. one user opens the Explorer on the ~480-token example (the cold start, reported apart);
2. the other users open the same link at the same moment; each one's time to its first
   graph (the first screen drawn: every headline metric and the head figure, as
   ``app_latency.FIRST_SCREEN_JS`` reads them off the page) is a sample of ``first_graph``;
3. every user moves the window slider ``--moves`` times, all users at once; each sample is
   the time from the key press to the metrics showing the new setting (``slider``).

Errors are pages that time out or show a Streamlit exception. The server's RSS (VmRSS of the
process) is read at the end. Everything is bounded in time (``--timeout`` per wait) and only
talks to 127.0.0.1. The last line reads
``first_graph_p95_s=<> slider_p95_s=<> rss_mb=<> errors=<>``.

Where the time goes: for each phase (cold start, first graphs, slider) the lines before the
last give its wall time and the CPU seconds spent in it by the server process, by the
chromium processes (the clients' rendering), by the rest of this benchmark (Playwright's
driver, this script) and by the whole machine (``/proc/stat``: other users of the box show as
the difference). CPU is utime + stime from ``/proc/<pid>/stat``, reaped children included.
The server also logs each script run (``SPARSEFINDER_RUN_LOG``, see ``app/run_log.py``):
per phase, the number of full runs and fragment reruns with their summed wall and CPU time.

Run: ``.venv/bin/python benchmarks/app_load.py [--sessions 10] [--moves 3] [--client-nice 10]``
(``--client-nice``: chromium runs at that nice level, so the server is served first, as if
the browsers were on the users' own machines; the default is equal footing.)
``--smoke``: two users, one move each, waits of at most 180 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import parse, parser  # noqa: E402
from app_latency import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    FIRST_SCREEN_JS,
    free_port,
    start_server,
    wait_healthy,
)

RUN_LOG_ENV = "SPARSEFINDER_RUN_LOG"  # app/run_log.py

LINK = "/?method=kmeans&B=8&k=2&window=3&example=long_report_512"
METRICS_JS = ("() => [...document.querySelectorAll('[data-testid=\"stMetricValue\"]')]"
              ".map(e => e.textContent).join('|')")
#: Arms ``window.__sfWait``: a promise that resolves once the page is ready (``before`` null)
#: or its metrics differ from ``before``, checked on DOM mutations, not by polling. Polling
#: every animation frame (Playwright's default) costs a page ~6 % of a core while it waits:
#: ten waiting pages took over half a core from the server and the pages being measured.
ARM_JS = f"""([before, timeoutMs]) => {{
  const done = before === null ? () => {FIRST_SCREEN_JS} : () => ({METRICS_JS})() !== before;
  window.__sfWait = new Promise((resolve, reject) => {{
    if (done()) {{ resolve(true); return; }}
    const observer = new MutationObserver(() => {{
      if (done()) {{ observer.disconnect(); clearTimeout(timer); resolve(true); }}
    }});
    const timer = setTimeout(() => {{
      observer.disconnect(); reject(new Error('no change in ' + timeoutMs + ' ms'));
    }}, timeoutMs);
    observer.observe(document, {{subtree: true, childList: true, characterData: true,
                                attributes: true, attributeFilter: ['class']}});
  }});
}}"""


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_table() -> dict[int, tuple[int, str, float]]:
    """pid -> (parent pid, command name, CPU seconds incl. reaped children) of every process."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        name = raw[raw.index("(") + 1:raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2:].split()  # fields[0] is field 3 (state)
        ticks = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
        table[int(entry.name)] = (int(fields[1]), name, ticks / CLOCK_TICKS)
    return table


def _descendants(table: dict, root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in table and pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def _machine_busy() -> float:
    """CPU seconds all cores spent not idle since boot (``/proc/stat``)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / CLOCK_TICKS


@dataclass
class Usage:
    """CPU seconds so far: server tree, chromium processes, the rest of this benchmark, the
    machine; ``others``: every other process (pid -> (name, CPU s)), to name who else ran."""

    wall: float
    server: float
    chromium: float
    driver: float
    machine: float
    others: dict[int, tuple[str, float]] = field(default_factory=dict)

    @classmethod
    def now(cls, server_pid: int) -> Usage:
        table = _proc_table()
        server = _descendants(table, server_pid)
        client = _descendants(table, os.getpid()) - server
        chromium = {p for p in client if table[p][1].startswith("chrom")}
        others = {p: (table[p][1], table[p][2]) for p in table.keys() - server - client}
        return cls(time.perf_counter(), sum(table[p][2] for p in server),
                   sum(table[p][2] for p in chromium),
                   sum(table[p][2] for p in client - chromium), _machine_busy(), others)

    def minus(self, before: Usage) -> Usage:
        others = {p: (name, cpu - before.others.get(p, (name, 0.0))[1])
                  for p, (name, cpu) in self.others.items()}
        return Usage(self.wall - before.wall, self.server - before.server,
                     self.chromium - before.chromium, self.driver - before.driver,
                     self.machine - before.machine, others)

    def busiest_others(self, count: int = 3) -> str:
        """The other processes that used most CPU (a busy machine explains slow numbers)."""
        top = sorted(self.others.values(), key=lambda item: -item[1])[:count]
        return ", ".join(f"{name} {cpu:.1f}" for name, cpu in top if cpu >= 0.1) or "none"


def read_runs(path: Path) -> list[tuple[float, str, float, float]]:
    """(unix time at the end, kind, wall s, cpu s) of each script run the server logged."""
    if not path.exists():
        return []
    runs = []
    for line in path.read_text().splitlines():
        end, kind, wall, cpu = line.split()
        runs.append((float(end), kind, float(wall), float(cpu)))
    return runs


def phase_report(name: str, used: Usage, runs: list, span: tuple[float, float]) -> str:
    inside = [r for r in runs if span[0] <= r[0] <= span[1]]
    text = (f"{name}: wall {used.wall:.1f} s · CPU s: server {used.server:.1f}, chromium "
            f"{used.chromium:.1f}, driver {used.driver:.1f}, whole machine {used.machine:.1f} "
            f"(other processes {used.machine - used.server - used.chromium - used.driver:.1f}: "
            f"{used.busiest_others()})")
    for kind in ("full", "fragment"):
        mine = [r for r in inside if r[1] == kind]
        if mine:
            text += (f"\n  server {kind} runs: {len(mine)}, wall {sum(r[2] for r in mine):.1f} s "
                     f"(median {statistics.median(r[2] for r in mine):.2f}, p95 "
                     f"{p95([r[2] for r in mine]):.2f}), script-thread CPU "
                     f"{sum(r[3] for r in mine):.1f} s "
                     f"(median {statistics.median(r[3] for r in mine):.2f})")
    return text


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
    await page.evaluate(ARM_JS, [None, timeout_ms])
    await page.evaluate("() => window.__sfWait")
    return page, time.perf_counter() - start


async def move_slider(page, moves: int, timeout_ms: int) -> list[float]:
    samples = []
    thumb = (page.locator("[data-testid='stSlider']").filter(has_text="Window size")
             .get_by_role("slider"))
    await thumb.focus()
    for step in range(moves):
        before = await page.evaluate(METRICS_JS)
        await page.evaluate(ARM_JS, [before, timeout_ms])
        start = time.perf_counter()
        await thumb.press("ArrowRight" if step % 2 == 0 else "ArrowLeft")
        await page.evaluate("() => window.__sfWait")
        samples.append(time.perf_counter() - start)
    return samples


async def run(args: argparse.Namespace, port: int, server_pid: int, executable: str
              ) -> tuple[float, list, list, int, list]:
    """(cold start s, first-graph samples, slider samples, errors, phases); a phase is
    (name, Usage spent in it, (unix start, unix end))."""
    from playwright.async_api import async_playwright

    url = f"http://127.0.0.1:{port}{LINK}"
    timeout_ms = int(args.timeout * 1000)
    errors = 0
    phases = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)

        def mark() -> tuple[Usage, float]:
            return Usage.now(server_pid), time.time()

        def close(name: str, begun: tuple[Usage, float]) -> None:
            phases.append((name, Usage.now(server_pid).minus(begun[0]), (begun[1], time.time())))

        begun = mark()
        first_page, cold = await open_user(browser, url, timeout_ms)
        close("cold start (user 1)", begun)
        await asyncio.sleep(2)  # trailing work of the first page (its overview, fonts)
        begun = mark()
        results = await asyncio.gather(*(open_user(browser, url, timeout_ms)
                                         for _ in range(args.sessions - 1)),
                                       return_exceptions=True)
        close(f"first graphs (users 2..{args.sessions} at once)", begun)
        pages, first_graph = [first_page], []
        for result in results:
            if isinstance(result, BaseException):
                errors += 1
            else:
                pages.append(result[0])
                first_graph.append(result[1])
        await asyncio.sleep(2)
        begun = mark()
        moved = await asyncio.gather(*(move_slider(p, args.moves, timeout_ms) for p in pages),
                                     return_exceptions=True)
        close(f"slider ({args.moves} moves x {len(pages)} users at once)", begun)
        slider = []
        for result in moved:
            if isinstance(result, BaseException):
                errors += 1
            else:
                slider.extend(result)
        for page in pages:
            errors += await page.locator("[data-testid='stException']").count()
        await browser.close()
    return cold, first_graph, slider, errors, phases


def main() -> None:
    made = parser(__doc__.split("\n")[0])
    made.add_argument("--sessions", type=int, default=10)
    made.add_argument("--moves", type=int, default=3)
    made.add_argument("--timeout", type=float, default=180.0, help="seconds per wait")
    made.add_argument("--client-nice", type=int, default=0,
                      help="run chromium at this nice level (e.g. 10): the server gets the "
                           "CPU first, as if the clients ran on their own machines; they "
                           "still share the cores with it (default 0: equal footing)")
    args = parse(made, smoke={"sessions": 2, "moves": 1})
    port = free_port()
    scratch = tempfile.TemporaryDirectory()
    log = Path(scratch.name) / "runs.log"
    executable = CHROMIUM
    if args.client_nice:
        executable = str(Path(scratch.name) / "chromium")
        Path(executable).write_text(f'#!/bin/sh\nexec nice -n {args.client_nice} {CHROMIUM} "$@"\n')
        Path(executable).chmod(0o755)
    os.environ[RUN_LOG_ENV] = str(log)  # the server logs each script run's wall and CPU time
    server = start_server(port, None)
    try:
        wait_healthy(port)
        cold, first_graph, slider, errors, phases = asyncio.run(run(args, port, server.pid,
                                                                    executable))
        rss = rss_mb(server.pid)
        runs = read_runs(log)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        scratch.cleanup()
    for name, used, span in phases:
        print(phase_report(name, used, runs, span))
    print(f"{args.sessions} sessions on one server, load avg {os.getloadavg()[0]:.1f} "
          f"({os.cpu_count()} cores); cold start (first user) {cold:.1f} s"
          + (f"; chromium at nice {args.client_nice}" if args.client_nice else ""))
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
