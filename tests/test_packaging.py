"""A non-editable install (`pip install .`) has its assets and runs the CLI and the app."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

APP_CHECK = """
import sys
import sparsefinder
assert sparsefinder.__file__.startswith(sys.argv[1]), sparsefinder.__file__
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(sys.argv[2], default_timeout=240).run()
assert not at.exception, [e.value for e in at.exception]
from app import shell
assert str(shell.DEFAULT_PROJECTIONS).startswith(sys.argv[1]), shell.DEFAULT_PROJECTIONS
labels = [m.label for m in at.metric]
assert "Head recall" in labels, labels
print("APP OK", sys.modules["sparsefinder"].__file__)
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The package installed from a built wheel into its own folder (not editable)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--target", str(target), str(ROOT)],
        check=True, cwd=target, timeout=600,
    )
    assert (target / "sparsefinder" / "assets" / "default" / "projections.pt").is_file()
    assert (target / "sparsefinder" / "assets" / "default" / "entmax_adapter.safetensors").is_file()
    assert (target / "sparsefinder" / "assets" / "default" / "hash_codes.pt").is_file()
    assert not (target / "sparsefinder" / "__editable__").exists()
    return target


def _env(target: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(target), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1"}


@pytest.mark.slow
def test_python_m_sparsefinder_info_runs_from_the_installed_copy(installed: Path, tmp_path):
    code = "import sparsefinder, sys; print(sparsefinder.__file__)"
    where = subprocess.run([sys.executable, "-c", code], env=_env(installed), cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(installed))
    result = subprocess.run([sys.executable, "-m", "sparsefinder", "info"], env=_env(installed),
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "all-MiniLM-L6-v2" in result.stdout


@pytest.mark.slow
def test_the_app_runs_on_the_installed_package(installed: Path, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", APP_CHECK, str(installed), str(ROOT / "app" / "main.py")],
        env=_env(installed), cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "APP OK" in result.stdout
