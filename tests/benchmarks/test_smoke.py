"""Every script in benchmarks/ runs end to end in its smoke mode (``--smoke``: tiny sizes,
seconds), so a benchmark that stops working fails here instead of rotting unseen.

The scripts are found by glob: a new benchmark lands in ``TestOtherSmoke`` and fails until it
has a smoke mode (``benchmarks/_common.py``). Each group is a class because ``make test``
distributes with ``--dist loadscope``, which keeps a class on one worker: four groups of
similar cost (about 40-65 CPU seconds each, ~210 in all) let two workers share them. Each
run is a subprocess with one torch thread (as a pytest-xdist worker on two cores gets),
whose last line must be ``key=value`` pairs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
CHROMIUM = Path("/usr/bin/chromium")
#: Every benchmark script (helpers such as _common.py start with an underscore).
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
#: Real-browser runs (a served app and chromium).
BROWSER = ("app_latency", "app_load", "app_waits")
#: The costliest of the rest: several fresh processes each, a model built or loaded in each
#: (prepare: a whole `sparsefinder prepare` of a tiny model).
HEAVY = ("distributed", "prepare", "real_size")
#: Runs on the default model's vectors (and the two with a GPU-only mode).
MODEL = ("accuracy", "calibration_gap", "extract", "extract_long", "gpu_solver", "restricted")
#: Everything else, and any new script.
OTHER = tuple(name for name in SCRIPTS if name not in BROWSER + HEAVY + MODEL)
#: The scripts that load the default model (marked ``slow``, as the suite's other such tests).
LOADS_DEFAULT_MODEL = {*BROWSER, *MODEL, "distributed", "restricted", "learned_space",
                       "quality_table", "train"}
KEY_VALUE = re.compile(r"[^\s=]+=\S+")
#: The script's output tail shown when a run fails.
TAIL = 4000


def _params(names: tuple[str, ...]) -> list:
    return [pytest.param(name, id=name,
                         marks=[pytest.mark.slow] if name in LOADS_DEFAULT_MODEL else [])
            for name in names]


def run_benchmark(name: str, *extra: str) -> list[str]:
    """``benchmarks/<name>.py --smoke [extra]`` in a subprocess: its non-empty stdout lines,
    after checking it exited 0."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--smoke", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (
        f"{name}.py --smoke exited {done.returncode}:\n{done.stdout[-TAIL:]}\n"
        f"{done.stderr[-TAIL:]}")
    return [line for line in done.stdout.splitlines() if line.strip()]


def check_smoke_run(name: str) -> None:
    lines = run_benchmark(name)
    assert any(line.startswith("smoke run") for line in lines), (
        f"{name}.py ran without a smoke mode (parse its arguments with "
        f"benchmarks/_common.py): {lines[-3:]}")
    last = lines[-1].split()
    assert all(KEY_VALUE.fullmatch(part) for part in last), (
        f"{name}.py's last line is not key=value pairs: {lines[-1]!r}")


def test_every_benchmark_is_in_one_group() -> None:
    groups = BROWSER + HEAVY + MODEL + OTHER
    assert sorted(groups) == SCRIPTS, f"named but missing, or listed twice: {groups}"


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (`make browser`)")
class TestBrowserSmoke:
    @pytest.mark.parametrize("name", _params(BROWSER))
    def test_smoke_run(self, name: str) -> None:
        check_smoke_run(name)


class TestHeavySmoke:
    @pytest.mark.parametrize("name", _params(HEAVY))
    def test_smoke_run(self, name: str) -> None:
        check_smoke_run(name)


class TestModelSmoke:
    @pytest.mark.parametrize("name", _params(MODEL))
    def test_smoke_run(self, name: str) -> None:
        check_smoke_run(name)

    @pytest.mark.parametrize("name", ["decoder_supports", "gpu_attention", "gpu_solver",
                                      "restricted"])
    def test_a_gpu_run_skips_cleanly_without_a_gpu(self, name: str) -> None:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA GPU is visible: the run would not skip")
        lines = run_benchmark(name, "--device", "cuda")
        assert lines[-2].startswith("skipped: --device cuda needs a CUDA GPU"), lines[-3:]
        assert "skipped=1" in lines[-1].split(), lines[-1]


class TestOtherSmoke:
    @pytest.mark.parametrize("name", _params(OTHER))
    def test_smoke_run(self, name: str) -> None:
        check_smoke_run(name)
