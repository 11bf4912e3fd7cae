"""``sparsefinder prepare`` as a background job: its progress file, and the process that runs it.

Why a separate process: preparing a model takes minutes of CPU (tens of minutes for a
BERT-base). Run inside the app's server it would hold the model lock every session needs and
die with the page; as a subprocess the app stays usable, and the job survives a page rerun.
Its progress is a JSON-lines file in the bundle folder, one line per stage (stage, fraction
of the cost-weighted work done, seconds left), which any session or a reloaded page reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparsefinder.bundle import MANIFEST

PROGRESS = ".progress.jsonl"
LOG = ".prepare.log"
#: The line the CLI prints for an error it explains (``sparsefinder.cli.main``).
_ERROR_PREFIX = "sparsefinder prepare: error: "


@dataclass(frozen=True)
class PrepareStatus:
    """Where a prepare job stands: ``state`` is "running", "done", "failed" or "none"."""

    state: str
    stage: str = ""
    fraction: float = 0.0
    seconds_left: float | None = None
    message: str = ""

    def label(self) -> str:
        """One line for a progress bar: the stage and the time left."""
        left = ("estimating the time left" if self.seconds_left is None
                else f"about {_duration(self.seconds_left)} left")
        return f"stage {self.stage or 'starting'} · {left}"


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def write_progress(folder: Path, stage: str, fraction: float,
                   seconds_left: float | None) -> None:
    """Append one progress line (a whole line per write: a reader never sees half of one)."""
    folder.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"stage": stage, "fraction": round(fraction, 4),
                       "seconds_left": None if seconds_left is None else round(seconds_left, 1),
                       "time": time.time(), "pid": os.getpid()})
    with open(folder / PROGRESS, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")


def read_progress(folder: Path) -> dict[str, Any] | None:
    """The last whole progress line of ``folder`` (None: no progress written yet)."""
    try:
        lines = (folder / PROGRESS).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        with contextlib.suppress(ValueError):
            return json.loads(line)
    return None


def start(model: str, root: Path, folder: Path, extra: Sequence[str] = ()) -> subprocess.Popen:
    """Start ``python -m sparsefinder prepare --model MODEL --out ROOT`` in its own process
    session, its output in ``folder``'s log; ``folder`` is where its bundle lands (the
    model's fingerprint folder), so its progress can be read from the first second."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PROGRESS).unlink(missing_ok=True)
    command = [sys.executable, "-m", "sparsefinder", "prepare", "--model", model,
               "--out", str(root), *extra]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(job_threads()))
    with open(folder / LOG, "wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def job_threads() -> int:
    """Torch threads of a background job: every core but one, which stays the app's. On a
    busy machine more threads than free cores also slow the job itself: torch's threads
    wait for each other (hash codes of a tiny BERT at load 9 on 2 cores: 68 s with 2
    threads, 13 s with 1)."""
    return max(1, (os.cpu_count() or 2) - 1)


def status(folder: Path, process: subprocess.Popen | None) -> PrepareStatus:
    """The job's state from its process (None: not started by this server) and its files."""
    running = process is not None and process.poll() is None
    if (folder / MANIFEST).is_file() and not running:
        return PrepareStatus("done", "done", 1.0, 0.0)
    record = read_progress(folder) or {}
    if running or (process is None and _alive(record.get("pid"))):
        left = record.get("seconds_left")
        if left is not None:  # the estimate was made when the stage started
            left = max(0.0, left - (time.time() - record.get("time", time.time())))
        return PrepareStatus("running", record.get("stage", ""),
                             float(record.get("fraction", 0.0)), left)
    if process is None:
        return PrepareStatus("none")
    return PrepareStatus("failed", record.get("stage", ""), float(record.get("fraction", 0.0)),
                         message=failure(folder / LOG, process.returncode))


def _alive(pid: Any) -> bool:
    """Whether ``pid`` (a job another server process started) still runs."""
    if not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def failure(log: Path, returncode: int | None) -> str:
    """Why the job ended without a bundle, in one sentence: the CLI's own error line when it
    printed one, else the exit status and the log's last line (never a whole traceback)."""
    try:
        lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines()
                 if line.strip()]
    except OSError:
        lines = []
    for line in reversed(lines):
        if line.startswith(_ERROR_PREFIX):
            return line.removeprefix(_ERROR_PREFIX)
    last = lines[-1].strip() if lines else "no output"
    return f"prepare stopped (exit status {returncode}): {last[:300]} (full log: {log})"
