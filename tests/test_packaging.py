"""A non-editable install (`pip install .`) has its assets and runs the CLI and the app; an
editable one (`pip install -e .`, as the Makefile does it) reads the checkout's assets/."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BUNDLE_CHECK = """
import sys
from importlib.resources import files
from pathlib import Path
import sparsefinder
from sparsefinder.bundle import assets_root, bundle, coref_probes, examples_dir
where = Path(sys.argv[1])
assert Path(sparsefinder.__file__).is_relative_to(where), sparsefinder.__file__
assets = Path(str(files("sparsefinder.assets")))
assert assets == where / sys.argv[2], assets
assert assets_root() == assets and (assets / "default" / "bundle.json").is_file()
assert bundle().best("projections").name == "projections-r8-lowrank-mass.pt"
assert bundle().best("centroids").is_relative_to(assets)
assert bundle().verify() == [] and examples_dir().is_dir() and coref_probes().is_file()
print("BUNDLE OK", assets)
"""

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
    assert (target / "sparsefinder" / "assets" / "default" / "bundle.json").is_file()
    assert not (target / "sparsefinder" / "__editable__").exists()
    assert not (target / "assets").exists()  # only inside the package
    return target


def test_the_package_list_names_every_subpackage():
    """pyproject.toml spells the packages out (assets/ is mapped to sparsefinder.assets): a new
    subpackage must be added there or a wheel would lack it."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
    found = {"sparsefinder", "sparsefinder.assets"} | {
        f"sparsefinder.{p.parent.name}" for p in (ROOT / "sparsefinder").glob("*/__init__.py")}
    assert set(config["setuptools"]["packages"]) == found
    assert config["setuptools"]["package-dir"] == {"sparsefinder.assets": "assets"}


def test_the_wheel_reads_its_bundle_through_importlib_resources(installed: Path, tmp_path):
    result = subprocess.run([sys.executable, "-c", BUNDLE_CHECK, str(installed),
                             "sparsefinder/assets"], env=_env(installed), cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BUNDLE OK" in result.stdout


def test_an_editable_install_reads_the_checkouts_assets(tmp_path):
    """`pip install -e .` as the Makefile runs it, into a fresh environment that borrows this
    one's dependencies (a path entry: this environment's own editable install stays out)."""
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    (purelib,) = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                 "get_paths()['purelib'])"], capture_output=True, text=True,
                                check=True).stdout.split()
    Path(purelib, "deps.pth").write_text(site.getsitepackages()[0] + "\n", encoding="utf-8")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                    "--no-deps", "--no-build-isolation", "--disable-pip-version-check", "-e",
                    str(ROOT)], check=True, cwd=tmp_path, timeout=600)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([str(python), "-c", BUNDLE_CHECK, str(ROOT), "assets"], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BUNDLE OK" in result.stdout


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
