"""The Dockerfile's serve step on a GPU machine (run3.sh): the installed package's app opens on
the default model with CUDA visible and says so ("Device: CUDA"), in Streamlit's AppTest and
from a headless `streamlit run` answering its health check and first page."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

from streamlit.testing.v1 import AppTest


def apptest_device() -> None:
    start = time.perf_counter()
    at = AppTest.from_file(os.path.abspath("app/main.py"), default_timeout=240).run()
    captions = [c.value for c in at.sidebar.caption]
    print(f"AppTest first run {time.perf_counter() - start:.1f}s, exceptions: {len(at.exception)}")
    for e in at.exception:
        print("EXCEPTION", e.value)
    device = [c for c in captions if c.startswith("Device:")]
    print("sidebar device caption:", device)
    assert device and "CUDA" in device[0], "the app did not report CUDA"
    print("APPTEST_CUDA_OK")


def served() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.serve", "--server.port", "8501",  # the Dockerfile's CMD
         "--server.headless", "true", "--server.address", "0.0.0.0",
         # Streamlit run from an unpacked folder (not site-packages) thinks it is in its own
         # development mode, which refuses --server.port; the image's pip install is not.
         "--global.developmentMode", "false"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(60):
            try:
                health = "http://localhost:8501/_stcore/health"
                body = urllib.request.urlopen(health, timeout=2).read()
                print("health:", body.decode())
                page = urllib.request.urlopen("http://localhost:8501/", timeout=5).read()
                print("first page bytes:", len(page), "streamlit page:", b"<title>" in page)
                print("SERVE_OK")
                return
            except OSError:
                time.sleep(1)
        raise SystemExit("the server did not answer its health check in 60 s")
    finally:
        proc.terminate()
        print((proc.communicate(timeout=10)[0] or "")[-600:])


if __name__ == "__main__":
    if "--serve-only" not in sys.argv:
        apptest_device()
    served()
