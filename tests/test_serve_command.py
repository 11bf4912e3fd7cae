"""`make run` serves on this machine only unless asked, with the repository's Streamlit config.

The binding is checked on the real server: `make run` itself is started on a free port (its
install step marked done with ``-o``, so nothing is installed), and the kernel's socket table
must show it listening on 127.0.0.1 only. The effective configuration is read the way
`streamlit run` reads it: from a fresh process started in the repository root.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sparsefinder import serving

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv running the tests holds streamlit
MAKE = shutil.which("make")
STAMP = ".venv/.installed"  # Makefile's $(STAMP): `-o` marks it up to date, so no install runs

needs_make = pytest.mark.skipif(MAKE is None, reason="`make` is not installed")


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without STREAMLIT_* variables (they would override the file)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLIT_")}
    return {**env, **extra}


def _make_run_dry(*variables: str) -> list[str]:
    out = subprocess.run(
        [MAKE, "-s", "-n", "run", "-o", STAMP, *variables], cwd=ROOT, check=True,
        capture_output=True, text=True, timeout=30, env=_clean_env(HOST="ignored.example"),
    ).stdout.strip().splitlines()
    assert len(out) == 1, out
    return shlex.split(out[0])


def _option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


@needs_make
def test_make_run_binds_loopback_unless_host_is_given():
    default = _make_run_dry()  # an environment variable HOST does not change it
    assert default[:3] == [".venv/bin/python", "-m", "app.serve"]  # streamlit run + warm-up
    assert _option(default, "--server.address") == "127.0.0.1"
    assert _option(default, "--server.port") == "8501"
    exposed = _make_run_dry("HOST=0.0.0.0", "PORT=9000")
    assert _option(exposed, "--server.address") == "0.0.0.0"
    assert _option(exposed, "--server.port") == "9000"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening_addresses(port: int) -> set[str]:
    """Local addresses of LISTEN sockets on ``port``, from /proc/net/tcp and tcp6."""
    found = set()
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address_hex, port_hex = local.split(":")
            if state != "0A" or int(port_hex, 16) != port:  # 0A = LISTEN
                continue
            raw = bytes.fromhex(address_hex)  # 32-bit words in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))
            found.add(str(ipaddress.ip_address(raw)))
    return found


def _non_loopback_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: routing lookup only
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if ipaddress.ip_address(address).is_loopback else address


@needs_make
@pytest.mark.skipif(not (BIN / "streamlit").exists(), reason="streamlit is not installed")
def test_the_real_server_listens_on_loopback_only():
    port = _free_port()
    process = subprocess.Popen(
        [MAKE, "-s", "run", "-o", STAMP, f"BIN={BIN}", f"PORT={port}"],
        cwd=ROOT, env=_clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health",
                                            timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                assert process.poll() is None, "`make run` exited before serving"
                assert time.monotonic() < deadline, "the server did not answer in 90 s"
                time.sleep(0.3)
        listening = _listening_addresses(port)
        if Path("/proc/net/tcp").exists():
            assert listening == {"127.0.0.1"}
        other = _non_loopback_address()
        if other is not None:
            with pytest.raises(ConnectionRefusedError), socket.socket() as s:
                s.settimeout(5)
                s.connect((other, port))
        # The repository's config is in force: an upload without the XSRF token is refused.
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/_stcore/upload_file/session/file", data=b"x",
            method="PUT")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 403
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def test_effective_streamlit_config_from_the_repository_root(tmp_path):
    """What `streamlit run` (started from the root) would use, read in a fresh process with
    an empty home folder, so a user's ~/.streamlit cannot hide a missing setting."""
    keys = ["server.address", "server.maxUploadSize", "server.enableXsrfProtection",
            "server.enableCORS", "browser.gatherUsageStats", "server.fileWatcherType",
            "runner.postScriptGC"]
    script = (
        "import json, sys\nfrom streamlit import config\n"
        "config.get_config_options(force_reparse=True)\n"
        "keys = sys.argv[1:]\n"
        "print(json.dumps({k: [config.get_option(k), config.get_where_defined(k)] "
        "for k in keys}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, *keys], cwd=ROOT, check=True, capture_output=True,
        text=True, timeout=60, env=_clean_env(HOME=str(tmp_path)),
    ).stdout
    effective = json.loads(out.strip().splitlines()[-1])
    for key in keys:
        assert Path(effective[key][1]) == ROOT / ".streamlit" / "config.toml", key
    values = {k: v[0] for k, v in effective.items()}
    assert values["server.address"] == "127.0.0.1"
    assert values["server.enableXsrfProtection"] is True
    assert values["browser.gatherUsageStats"] is False
    # ten users (issue 12): no per-run module scan and no full GC after every script run
    assert values["server.fileWatcherType"] == "none"
    assert values["runner.postScriptGC"] is False
    upload_bytes = values["server.maxUploadSize"] * 1024 * 1024
    assert upload_bytes <= 10 * 1024 * 1024  # a few MB, not Streamlit's default 200 MB
    assert upload_bytes == serving.ServingPolicy().max_projections_bytes
    assert upload_bytes >= 4 * serving.DEFAULT_MAX_TEXT_CHARS  # the largest text accepted
