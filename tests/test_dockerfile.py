"""The GPU Dockerfile serves what `make run` serves (it cannot be built here: no Docker engine).

The image's command must be the Makefile's serve command (same script, port and flags) with
``HOST=0.0.0.0`` (`make run` binds 127.0.0.1; inside a container that would be unreachable);
the port it exposes and health-checks must be that port, and the repository's Streamlit
config (.streamlit/config.toml: upload limit, XSRF, no usage statistics) must be in the image.
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


def _make_serve_command(**overrides: str) -> list[str]:
    """The recipe of the Makefile's `run` target with its variables expanded (as
    `make run NAME=value` would, for ``overrides``)."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"^run:.*\n\t(.+)$", makefile, flags=re.MULTILINE)
    assert match, "Makefile has no `run` target"
    variables = dict(re.findall(r"^([A-Z_]+) :?= (.+)$", makefile, flags=re.MULTILINE))
    variables.update(overrides)
    recipe = match.group(1)
    while "$(" in recipe:
        expanded = re.sub(r"\$\(([A-Z_]+)\)", lambda m: variables[m.group(1)], recipe)
        assert expanded != recipe, recipe
        recipe = expanded
    return shlex.split(recipe)


def _port(command: list[str]) -> str:
    return command[command.index("--server.port") + 1]


def test_cmd_is_the_makefile_serve_command_listening_on_all_interfaces():
    cmd = json.loads(_one("CMD"))  # exec form: signals reach streamlit directly
    assert cmd == _make_serve_command(HOST="0.0.0.0")
    local = _make_serve_command()  # apart from the address, exactly `make run`
    at = local.index("--server.address") + 1
    assert local[at] == "127.0.0.1"
    assert cmd[:at] + cmd[at + 1:] == local[:at] + local[at + 1:]


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


@pytest.mark.parametrize("path", ["app/main.py", "sparsefinder", "assets", "assets/default",
                                  ".streamlit/config.toml"])
def test_everything_the_command_needs_is_copied(path):
    copied = [rest.split()[0] for key, rest in _instructions() if key == "COPY"]
    assert any(path == c.rstrip("/") or path.startswith(c.rstrip("/") + "/") for c in copied)
