"""The CI entry point and the Makefile's portability target: `.ci/run` runs the whole suite,
then the numerical tests again under the CPU's other kernels (`make test-portable`), whose
recipe runs the `numerical` marker under each capability torch can run here and says why it
skips the others; and the float comparisons it re-runs are the ones marked."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CAPABILITIES = ("default", "avx2", "avx512")
#: Modules with tolerance-derived comparisons that `make test-portable` leaves to `make test`,
#: and why (each would cost more than all the others together, three times).
NOT_REPORTED = {
    "tests/data/test_shards.py": "torchrun workers; their differences are thread counts",
    "tests/test_distributed.py": "torchrun workers; their differences are thread counts",
    "tests/evaluation/test_sweep.py": "one float32 sum behind a 15-second sweep fixture",
    "tests/app/test_model_runs.py": "app sessions in threads; its bounds only tell two α apart",
}


def test_ci_runs_the_suite_then_the_portable_numerical_tests():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert "set -euo pipefail" in lines  # the first failing target fails CI
    assert [line for line in lines if line.startswith("make")] == ["make test",
                                                                 "make test-portable"]


def test_test_portable_runs_the_numerical_marker_under_each_capability_or_says_why_not():
    """The target, run with a stand-in for pytest that reports what torch runs: every
    capability this CPU has runs `-m numerical` under it; the others are skipped by name."""
    probe = (".venv/bin/python -c 'import os, sys, torch; print(\"ran\", "
             "os.environ[\"ATEN_CPU_CAPABILITY\"], torch.backends.cpu.get_cpu_capability(), "
             "os.environ[\"MKL_ENABLE_INSTRUCTIONS\"], *sys.argv[1:])'")
    run = subprocess.run(["make", "-s", "-o", ".venv/.installed", "test-portable",
                          f"PORTABLE_PYTEST={probe}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    ran = re.findall(r"^ran (\S+) (\S+) (\S+) -m numerical$", out, flags=re.MULTILINE)
    skipped = re.findall(r"^test-portable: skipping (\S+): this CPU runs (\S+) kernels at most$",
                         out, flags=re.MULTILINE)
    assert sorted([cap for cap, *_ in ran] + [cap for cap, _ in skipped]) == sorted(CAPABILITIES)
    assert ("default", "DEFAULT", "SSE4_2") in ran  # every CPU runs the plain kernels
    for cap, torch_runs, _ in ran:  # torch really switched kernels
        assert torch_runs == cap.upper()


def test_the_numerical_marker_is_registered_and_documented():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^\s*"numerical: ', pyproject, flags=re.MULTILINE)
    docs = (ROOT / "docs" / "development.md").read_text()
    assert re.search(r"^\| `numerical` \|", docs, flags=re.MULTILINE)
    assert "make test-portable" in docs


def test_modules_with_derived_tolerances_are_rerun_by_test_portable():
    """A module comparing floats with tests/tolerances.py carries the `numerical` marker (on
    the module or on its float tests), so `make test-portable` re-runs it under the other
    kernels; the few left to `make test` are listed with their reason."""
    unmarked = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(ROOT).as_posix()
        if re.search(r"^from tolerances import", text, flags=re.MULTILINE) and \
                "pytest.mark.numerical" not in text and name not in NOT_REPORTED:
            unmarked.append(name)
    assert not unmarked, f"mark these `numerical` (or say in NOT_REPORTED why not): {unmarked}"
    for name in NOT_REPORTED:
        assert (ROOT / name).is_file(), name
