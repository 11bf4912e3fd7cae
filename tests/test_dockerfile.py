"""The GPU Dockerfile serves what `make run` serves (it cannot be built here: no Docker engine).

The image's command must be the Makefile's serve command (same script, port and flags) plus
``--server.address 0.0.0.0``; the port it exposes and health-checks must be that port.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def _one(keyword: str) -> str:
    found = [rest for key, rest in _instructions() if key == keyword]
    assert len(found) == 1, f"expected one {keyword} in the Dockerfile, got {found}"
    return found[0]


def _make_serve_command() -> list[str]:
    """The recipe of the Makefile's `run` target, with $(BIN) expanded."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"^run:.*\n\t(.+)$", makefile, flags=re.MULTILINE)
    assert match, "Makefile has no `run` target"
    bin_dir = re.search(r"^BIN := (.+)$", makefile, flags=re.MULTILINE).group(1)
    venv = re.search(r"^VENV := (.+)$", makefile, flags=re.MULTILINE).group(1)
    recipe = match.group(1).replace("$(BIN)", bin_dir).replace("$(VENV)", venv)
    return shlex.split(recipe)


def _port(command: list[str]) -> str:
    return command[command.index("--server.port") + 1]


def test_cmd_is_the_makefile_serve_command_listening_on_all_interfaces():
    cmd = json.loads(_one("CMD"))  # exec form: signals reach streamlit directly
    serve = _make_serve_command()
    assert cmd[: len(serve)] == serve
    assert cmd[len(serve):] == ["--server.address", "0.0.0.0"]


def test_exposes_and_healthchecks_the_served_port():
    port = _port(_make_serve_command())
    assert _one("EXPOSE") == port
    healthcheck = _one("HEALTHCHECK")
    assert f"http://localhost:{port}/_stcore/health" in healthcheck
    assert "CMD" in healthcheck and "curl -f" in healthcheck


def test_cuda_base_python_311_and_the_pinned_requirements():
    base = _one("FROM")
    assert base.startswith("nvidia/cuda:12.") and "runtime-ubuntu22.04" in base
    runs = " ".join(rest for key, rest in _instructions() if key == "RUN")
    assert "python3.11" in runs and "-r requirements.txt" in runs
    assert "torch==2.13.0" in (ROOT / "requirements.txt").read_text(encoding="utf-8")


@pytest.mark.parametrize("path", ["app/main.py", "sparsefinder", "sparsefinder/assets"])
def test_everything_the_command_needs_is_copied(path):
    copied = [rest.split()[0] for key, rest in _instructions() if key == "COPY"]
    assert any(path == c.rstrip("/") or path.startswith(c.rstrip("/") + "/") for c in copied)
