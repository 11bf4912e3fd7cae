"""Latency of a live slider move in the real app, measured in a real headless browser.

Serves the app as ``make run`` does (``python -m app.serve``) on a free port, opens the Explorer
on the ~480-token example (assets/examples/long_report_512.txt) in Debian's chromium, waits for
its first screen (the headline metrics and the head figure: ``FIRST_SCREEN_JS``), then moves a
slider with the keyboard N times. By default that is the app's own first screen: its default
method (``distance:budget`` with its floor of 12 keys per row) and its **target sparsity**
slider; ``--method`` picks
another method, and a method without calibration (``--method kmeans``, the old default) moves
the **window size** slider instead (``--slider`` forces either). The thumb walks to the slider's
farther end and back. Each sample is the time from the key press to the moment both the metric
values and the predicted panel's title (its edge count) show the new setting in the page, or,
where the viewed head's graph does not change with the setting, the run the press started has
ended (``MOVED_JS``). A move back to a setting seen before reads the app's shared prediction
cache, as a user's would; such moves are counted and named. Websocket bytes received per move
are summed (Streamlit's deltas: figures, metrics), which is the payload of one update.

Prints per-move timings, p50/p95, and last ``p50_ms=<x> p95_ms=<y> payload_kb=<z>``.
Goal on the 2-core dev CPU: p50 <= 300 ms, p95 <= 600 ms.

    .venv/bin/python benchmarks/app_latency.py [--moves 30] [--method kmeans] [--slider window]
        [--projections PATH]   # default: assets/default/projections.pt when it exists

Long texts (issue 14): ``--tokens N`` pastes a text of N tokens (consecutive passages of
the default corpus' train split) instead of opening the example, on ``--model PATH``, or,
without ``--model``, on a tiny random long-context decoder (``sparsefinder.models.decoders``: Qwen2,
4096 positions, GQA, a sliding-window layer) saved to a temporary folder. Such a model has
no projections, so use ``--method window`` (the window-size slider drives window ∪ global
tokens; prediction, scoring, the windowed head figure and the block overview all rerun).

    .venv/bin/python benchmarks/app_latency.py --tokens 4096 --method window --moves 20

``--smoke``: one timed move (after the two warm-up moves), waits of at most 180 s.
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "app"))

from _common import parse, parser  # noqa: E402
from browser_helpers import IDLE_JS, wait_until_idle  # noqa: E402  (the browser tests' own)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SNAPSHOT_JS = """() => {
  const metrics = [...document.querySelectorAll('[data-testid="stMetricValue"]')]
    .map(e => e.textContent).join('|');
  const titles = [...document.querySelectorAll('.js-plotly-plot .annotation-text')]
    .map(e => e.textContent).join('|');
  return [metrics, titles];
}"""
#: The Explorer's first screen is drawn: every headline metric of the app's ``w_headline``
#: container (app/app_pages/explorer.py) shows its value (no skeleton of a lazily loaded
#: element left) and the head figure (``w_fig_head``) is plotted. It counts the metrics the
#: app renders rather than expecting a number of them; the figure comes after the metrics in
#: the script, so once it is drawn every metric's delta has arrived. An expression, so it
#: can run inside other checks (benchmarks/app_load.py).
FIRST_SCREEN_JS = """(() => {
  const headline = document.querySelector('.st-key-w_headline');
  if (headline === null) return false;
  const metrics = headline.querySelectorAll('[data-testid="stMetric"]').length;
  return metrics > 0
    && headline.querySelectorAll('[data-testid="stMetricValue"]').length === metrics
    && headline.querySelector('[data-testid^="stSkeleton"]') === null
    && document.querySelector('.st-key-w_fig_head .js-plotly-plot') !== null;
})()"""
#: The label of each slider ``--slider`` can move.
SLIDERS = {"target": "Target sparsity", "window": "Window size"}
CHANGED_JS = """([before]) => {
  const metrics = [...document.querySelectorAll('[data-testid="stMetricValue"]')]
    .map(e => e.textContent).join('|');
  const titles = [...document.querySelectorAll('.js-plotly-plot .annotation-text')]
    .map(e => e.textContent).join('|');
  return metrics !== before[0] && titles !== before[1];
}"""
#: Before a key press: ``window.__sfRan`` turns true once the app starts the run it causes.
ARM_RUN_JS = """() => {
  window.__sfRan = false;
  const app = document.querySelector('[data-testid="stApp"]');
  const observer = new MutationObserver(() => {
    if (app.dataset.testScriptState === 'running') { window.__sfRan = true; observer.disconnect(); }
  });
  observer.observe(app, {attributes: true, attributeFilter: ['data-test-script-state']});
}"""
#: A move has landed (``before``: the snapshot before the press): the metrics and the viewed
#: head's panel titles show the new setting, or else the run the press started is over. A
#: calibrated head can keep its graph from one target to the next (its threshold, or its
#: per-row floor, holds), and past the floor's sparsity nothing on the page changes at all;
#: the end of the run is then the moment the page has caught up. Returns why it landed.
MOVED_JS = f"""([before]) => {{
  const metrics = [...document.querySelectorAll('[data-testid="stMetricValue"]')]
    .map(e => e.textContent).join('|');
  const titles = [...document.querySelectorAll('.js-plotly-plot .annotation-text')]
    .map(e => e.textContent).join('|');
  if (metrics !== before[0] && titles !== before[1]) return 'shown';
  if (!window.__sfRan || !({IDLE_JS})()) return false;
  return metrics !== before[0] ? 'head unchanged' : 'nothing changed';
}}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, projections: Path | None) -> subprocess.Popen:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT))
    if projections is not None:
        env["SPARSEFINDER_DEFAULT_PROJECTIONS"] = str(projections)
    venv = ROOT / ".venv" / "bin" / "python"
    python = str(venv) if venv.exists() else sys.executable
    return subprocess.Popen(  # what `make run` serves
        [python, "-m", "app.serve",
         "--server.port", str(port), "--server.headless", "true",
         "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait_healthy(port: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://localhost:{port}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"streamlit did not become healthy on port {port} in {timeout:.0f}s")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def long_setup(model: str | None, tokens: int, folder: Path) -> tuple[str, str]:
    """(model folder, text of ``tokens`` tokens) for the long-text measurement."""
    from sparsefinder.data.long_context import long_texts
    from sparsefinder.models.decoders import save_tiny_decoder
    from sparsefinder.models.loading import load_model

    if model is None:
        model = str(save_tiny_decoder("qwen2", folder / "qwen2", max_positions=4096))
    tokenizer = load_model(model, device="cpu").tokenizer
    return model, long_texts(tokenizer, tokens, 1, "train")[0]


def method_and_slider(method: str | None, slider: str | None) -> tuple[str, str, str]:
    """(the link's method parameters, the method as written, the slider to move): the app's
    own default method without ``method``; a calibrated method moves its target sparsity,
    any other the window size (``slider`` forces one)."""
    from sparsefinder.explore.app_methods import APP_METHODS
    from sparsefinder.explore.state import ViewState

    if method is not None and method.partition(":")[0] not in APP_METHODS:
        raise SystemExit(f"--method {method}: the app offers {', '.join(APP_METHODS)}")
    if method is None:
        state, query = ViewState(), ""  # the link names no method: the app's own default
    else:
        family, _, calibration = method.partition(":")
        state = ViewState(method=family, calibration=calibration, floor=0)  # a link: none
        if calibration and state.calibration != calibration:
            raise SystemExit(f"--method {method}: the app offers {family} with calibration "
                             f"{state.calibration}, not {calibration}")
        query = f"&method={state.method}&calibration={state.calibration}"
    calibrated = state.calibration != "none"
    slider = slider or ("target" if calibrated else "window")
    if slider == "target" and not calibrated:
        raise SystemExit(f"--method {state.method_id} has no target sparsity slider (it is not "
                         "calibrated): use --slider window or a calibrated method")
    if slider == "window":
        query += "&window=3"
    return query, state.method_id, slider


def _position(thumb) -> tuple[int, int, int]:
    """(value, min, max) of a slider's range input (a select slider's value is an index)."""
    return tuple(thumb.evaluate("e => [+e.value, +e.min, +e.max]"))


def measure(port: int, moves: int, query: str, slider: str, timeout_ms: int,
            model: str | None = None, text: str | None = None
            ) -> tuple[list[float], list[int], list[list[str]]]:
    """(ms, websocket bytes and notes of each timed move); a note says a move went back to
    a setting seen before, or landed without a new head graph (``MOVED_JS``)."""
    from playwright.sync_api import sync_playwright

    received = [0]

    def on_websocket(ws) -> None:
        ws.on("framereceived", lambda payload: received.__setitem__(
            0, received[0] + len(payload if isinstance(payload, bytes) else payload.encode())))

    times, sizes, notes = [], [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1800})
        page.on("websocket", on_websocket)
        if text is None:
            page.goto(f"http://localhost:{port}/?example=long_report_512{query}"
                      "&layer=0&head=0", timeout=timeout_ms)
        else:  # paste the long text, as a user would
            page.goto(f"http://localhost:{port}/?model={model}{query}&layer=0&head=0",
                      timeout=timeout_ms)
            # a click or key press while the app is still running can be lost (the rerun
            # redraws the widget): wait for each run to end first
            wait_until_idle(page, timeout=timeout_ms)
            page.get_by_text("Paste", exact=True).click()
            area = page.get_by_label("Paste a text")
            area.wait_for(timeout=timeout_ms)
            wait_until_idle(page, timeout=timeout_ms)
            shown = page.evaluate(SNAPSHOT_JS)  # the text the page opened on
            area.fill(text)
            area.press("Control+Enter")
            # the pasted text's graphs are drawn (a long text also adds the block overview:
            # a plot count would wait forever on a text of the model's length or less)
            page.wait_for_function(CHANGED_JS, arg=[shown], timeout=2 * timeout_ms)
            wait_until_idle(page, timeout=2 * timeout_ms)
        page.wait_for_function(FIRST_SCREEN_JS, timeout=timeout_ms)
        time.sleep(2)
        thumb = (page.locator("[data-testid='stSlider']").filter(has_text=SLIDERS[slider])
                 .get_by_role("slider"))
        thumb.focus()
        value, low, high = _position(thumb)
        step, seen = (1 if high - value >= value - low else -1), {value}  # the farther end
        for move in range(moves + 2):  # two warm-up moves
            value, low, high = _position(thumb)
            if not low < value < high:  # at an end (or a slider of one value): turn round
                step = -1 if value >= high else 1
            key = "ArrowRight" if step > 0 else "ArrowLeft"
            before = page.evaluate(SNAPSHOT_JS)
            page.evaluate(ARM_RUN_JS)
            received[0] = 0
            start = time.perf_counter()
            thumb.press(key)
            landed = page.wait_for_function(MOVED_JS, arg=[before], polling="raf",
                                            timeout=min(60_000, timeout_ms)).json_value()
            elapsed = (time.perf_counter() - start) * 1e3
            # the run has ended (its trailing frames counted) before the next key press: a
            # press during a run can be lost when the rerun redraws the slider
            wait_until_idle(page, timeout=timeout_ms)
            note = [*(["seen before"] if value + step in seen else []),
                    *([landed] if landed != "shown" else [])]
            seen.add(value + step)
            if move >= 2:
                times.append(elapsed)
                sizes.append(received[0])
                notes.append(note)
                print(f"move {move - 1:2d} {key:10s} {elapsed:7.1f} ms "
                      f"{received[0] / 1024:7.1f} KB"
                      + (f"  ({', '.join(note)})" if note else ""), flush=True)
        browser.close()
    return times, sizes, notes


def _count(notes: list[list[str]]) -> str:
    """How many moves carry each note: "3 seen before, 2 nothing changed"."""
    kinds = [kind for note in notes for kind in note]
    return ", ".join(f"{kinds.count(kind)} {kind}" for kind in dict.fromkeys(kinds)) or \
        "every one a new setting with a new head graph"


def main() -> int:
    made = parser(__doc__.splitlines()[0])
    made.add_argument("--moves", type=int, default=30)
    made.add_argument("--method", default=None,
                      help="the method shown (FAMILY or FAMILY:CALIBRATION; default: the "
                           "app's own, distance:budget with floor=12)")
    made.add_argument("--slider", choices=sorted(SLIDERS), default=None,
                      help="the slider moved (default: target for a calibrated method, else "
                           "window)")
    made.add_argument("--projections", type=Path, default=None,
                      help="projections for the default model (else the bundled ones)")
    made.add_argument("--tokens", type=int, default=None,
                      help="paste a text of this many tokens (long-text mode)")
    made.add_argument("--model", default=None,
                      help="model folder for --tokens (default: a tiny long-context Qwen2)")
    made.add_argument("--timeout", type=float, default=300.0,
                      help="seconds a page load may take (a move: at most 60)")
    args = parse(made, smoke={"moves": 1, "timeout": 180.0})
    query, method, slider = method_and_slider(args.method, args.slider)
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is missing: `make browser` (apt-get install chromium) first",
              file=sys.stderr)
        return 2
    print(f"load average: {os.getloadavg()}; method {method}, moving the "
          f"{SLIDERS[slider].lower()} slider", flush=True)
    scratch = tempfile.TemporaryDirectory()
    model, text = (None, None)
    if args.tokens is not None:
        model, text = long_setup(args.model, args.tokens, Path(scratch.name))
    port = free_port()
    server = start_server(port, args.projections)
    try:
        wait_healthy(port)
        times, sizes, notes = measure(port, args.moves, query, slider,
                                         int(args.timeout * 1000), model, text)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        scratch.cleanup()
    p50, p95 = statistics.median(times), percentile(times, 0.95)
    payload_kb = statistics.median(sizes) / 1024
    what = (f"a pasted {args.tokens}-token text" if args.tokens else "the 512-token example")
    print(f"{len(times)} moves of the {SLIDERS[slider].lower()} slider ({method}) on {what} "
          f"({_count(notes)}): p50 {p50:.0f} ms, p95 {p95:.0f} ms, "
          f"median websocket payload {payload_kb:.0f} KB per update "
          f"(load average {os.getloadavg()[0]:.2f})")
    print(f"p50_ms={p50:.0f} p95_ms={p95:.0f} payload_kb={payload_kb:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
