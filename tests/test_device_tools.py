"""The GPU machine's scripts (tools/device/) stay runnable: a lent GPU gives minutes, so a
script that fails on a renamed file or a syntax error wastes the only chance to measure."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEVICE = ROOT / "tools" / "device"
SCRIPTS = sorted(DEVICE.glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_device_script_parses(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_tests_and_benchmarks_a_script_runs_exist(script: Path) -> None:
    named = re.findall(r"\b((?:tests|benchmarks)/[\w/]+\.py)", script.read_text())
    missing = [path for path in named if not (ROOT / path).exists()]
    assert not missing, f"{script.name} runs files that are gone: {missing}"


def test_the_long_context_check_carries_its_script() -> None:
    prepare = (DEVICE / "prepare_long.sh").read_text()
    assert "cp tools/device/run_long.sh .gpu/long/" in prepare
    assert "bash .gpu/long/run_long.sh" in prepare
