"""Latency of a live slider move in the real app, measured in a real headless browser.

Serves the app (``streamlit run app/main.py``) on a free port, opens the Explorer on the
~480-token example (assets/examples/long_report_512.txt) in Debian's chromium,
then moves the window-size slider with the keyboard N times. Each sample is the time from the
key press to the moment both the metric values and the predicted panel's title (its edge
count) show the new setting in the page. Websocket bytes received per move are summed
(Streamlit's deltas: figures, metrics), which is the payload of one update.

Prints per-move timings, p50/p95, and last ``p50_ms=<x> p95_ms=<y> payload_kb=<z>``.
Goal on the 2-core dev CPU: p50 <= 300 ms, p95 <= 600 ms.

    .venv/bin/python benchmarks/app_latency.py [--moves 30] [--method kmeans]
        [--projections PATH]   # default: assets/default/projections.pt when it exists

Long texts (issue 14): ``--tokens N`` pastes a text of N tokens (consecutive passages of
the default corpus' train split) instead of opening the example, on ``--model PATH``, or,
without ``--model``, on a tiny random long-context decoder (``sparsefinder.models.decoders``: Qwen2,
4096 positions, GQA, a sliding-window layer) saved to a temporary folder. Such a model has
no projections, so use ``--method fixed`` (the window-size slider drives window ∪ global
tokens; prediction, scoring, the windowed head figure and the block overview all rerun).

    .venv/bin/python benchmarks/app_latency.py --tokens 4096 --method fixed --moves 20
"""

from __future__ import annotations

import argparse
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
CHANGED_JS = """([before]) => {
  const metrics = [...document.querySelectorAll('[data-testid="stMetricValue"]')]
    .map(e => e.textContent).join('|');
  const titles = [...document.querySelectorAll('.js-plotly-plot .annotation-text')]
    .map(e => e.textContent).join('|');
  return metrics !== before[0] && titles !== before[1];
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, projections: Path | None) -> subprocess.Popen:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT))
    if projections is not None:
        env["SPARSEFINDER_DEFAULT_PROJECTIONS"] = str(projections)
    venv = ROOT / ".venv" / "bin" / "streamlit"
    command = [str(venv)] if venv.exists() else [sys.executable, "-m", "streamlit"]
    return subprocess.Popen(
        [*command, "run", "app/main.py",
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
    sys.path.insert(0, str(ROOT))
    from sparsefinder.data.long_context import long_texts
    from sparsefinder.models.decoders import save_tiny_decoder
    from sparsefinder.models.loading import load_model

    if model is None:
        model = str(save_tiny_decoder("qwen2", folder / "qwen2", max_positions=4096))
    tokenizer = load_model(model, device="cpu").tokenizer
    return model, long_texts(tokenizer, tokens, 1, "train")[0]


def measure(port: int, moves: int, method: str, model: str | None = None,
            text: str | None = None) -> tuple[list[float], list[int]]:
    from playwright.sync_api import sync_playwright

    received = [0]

    def on_websocket(ws) -> None:
        ws.on("framereceived", lambda payload: received.__setitem__(
            0, received[0] + len(payload if isinstance(payload, bytes) else payload.encode())))

    sys.path.insert(0, str(ROOT / "tests" / "app"))
    from browser_helpers import wait_until_idle  # the browser tests' "the run has ended"

    times, sizes = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1800})
        page.on("websocket", on_websocket)
        if text is None:
            page.goto(f"http://localhost:{port}/?example=long_report_512&method={method}"
                      "&window=3&layer=0&head=0", timeout=300_000)
        else:  # paste the long text, as a user would
            page.goto(f"http://localhost:{port}/?model={model}&method={method}"
                      "&window=3&layer=0&head=0", timeout=300_000)
            # a click or key press while the app is still running can be lost (the rerun
            # redraws the widget): wait for each run to end first
            wait_until_idle(page, timeout=300_000)
            page.get_by_text("Paste", exact=True).click()
            area = page.get_by_label("Paste a text")
            area.wait_for(timeout=300_000)
            wait_until_idle(page, timeout=300_000)
            shown = page.evaluate(SNAPSHOT_JS)  # the text the page opened on
            area.fill(text)
            area.press("Control+Enter")
            # the pasted text's graphs are drawn (a long text also adds the block overview:
            # a plot count would wait forever on a text of the model's length or less)
            page.wait_for_function(CHANGED_JS, arg=[shown], timeout=600_000)
            wait_until_idle(page, timeout=600_000)
        page.wait_for_function(
            "document.querySelectorAll('.js-plotly-plot').length >= 2 && "
            "document.querySelectorAll('[data-testid=\"stMetricValue\"]').length >= 6",
            timeout=300_000)
        time.sleep(2)
        thumb = (page.locator("[data-testid='stSlider']").filter(has_text="Window size")
                 .get_by_role("slider"))
        thumb.focus()
        for move in range(moves + 2):  # two warm-up moves
            key = "ArrowRight" if (move // 10) % 2 == 0 else "ArrowLeft"
            before = page.evaluate(SNAPSHOT_JS)
            received[0] = 0
            start = time.perf_counter()
            thumb.press(key)
            page.wait_for_function(CHANGED_JS, arg=[before], polling="raf", timeout=60_000)
            elapsed = (time.perf_counter() - start) * 1e3
            time.sleep(0.3)  # let trailing frames of this update arrive before the next move
            if move >= 2:
                times.append(elapsed)
                sizes.append(received[0])
                print(f"move {move - 1:2d} {key:10s} {elapsed:7.1f} ms "
                      f"{received[0] / 1024:7.1f} KB", flush=True)
        browser.close()
    return times, sizes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moves", type=int, default=30)
    parser.add_argument("--method", default="kmeans",
                        help="predictor shown while the window slider moves")
    parser.add_argument("--projections", type=Path, default=None,
                        help="projections for the default model (else the bundled ones)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="paste a text of this many tokens (long-text mode)")
    parser.add_argument("--model", default=None,
                        help="model folder for --tokens (default: a tiny long-context Qwen2)")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is missing: `make browser` (apt-get install chromium) first",
              file=sys.stderr)
        return 2
    print(f"load average: {os.getloadavg()}", flush=True)
    scratch = tempfile.TemporaryDirectory()
    model, text = (None, None)
    if args.tokens is not None:
        model, text = long_setup(args.model, args.tokens, Path(scratch.name))
    port = free_port()
    server = start_server(port, args.projections)
    try:
        wait_healthy(port)
        times, sizes = measure(port, args.moves, args.method, model, text)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        scratch.cleanup()
    p50, p95 = statistics.median(times), percentile(times, 0.95)
    payload_kb = statistics.median(sizes) / 1024
    what = (f"a pasted {args.tokens}-token text" if args.tokens else "the 512-token example")
    print(f"{len(times)} moves on {what}: p50 {p50:.0f} ms, p95 {p95:.0f} ms, "
          f"median websocket payload {payload_kb:.0f} KB per update "
          f"(load average {os.getloadavg()[0]:.2f})")
    print(f"p50_ms={p50:.0f} p95_ms={p95:.0f} payload_kb={payload_kb:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
