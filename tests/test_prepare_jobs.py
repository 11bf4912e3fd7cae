"""sparsefinder.prepare_jobs: the progress file and the status of a background prepare."""

from __future__ import annotations

import subprocess
import sys

from sparsefinder.prepare_jobs import (
    LOG,
    PROGRESS,
    PrepareStatus,
    read_progress,
    status,
    write_progress,
)


def test_progress_lines_read_back_last_whole_line(tmp_path):
    assert read_progress(tmp_path) is None
    write_progress(tmp_path, "gold", 0.0, None)
    write_progress(tmp_path, "projections", 0.25, 90.0)
    with open(tmp_path / PROGRESS, "a") as handle:
        handle.write('{"stage": "codeb')  # a line being written
    record = read_progress(tmp_path)
    assert record["stage"] == "projections" and record["seconds_left"] == 90.0


def test_status_of_a_running_job_counts_its_time_left_down(tmp_path):
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        write_progress(tmp_path, "calibration", 0.6, 120.0)
        state = status(tmp_path, job)
        assert state.state == "running" and state.stage == "calibration"
        assert 110.0 < state.seconds_left <= 120.0 and state.fraction == 0.6
        assert state.label() == f"stage calibration · about {state.label().split('about ')[1]}"
        assert "min" in state.label()
    finally:
        job.kill()
        job.wait()


def test_status_of_a_failed_job_is_the_cli_error_line_not_a_traceback(tmp_path):
    (tmp_path / LOG).write_text("Traceback (most recent call last):\n  File x\n"
                                "sparsefinder prepare: error: corpus c gives 3 train texts; "
                                "calibrating needs at least 8\n")
    job = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])
    job.wait()
    state = status(tmp_path, job)
    assert state.state == "failed"
    assert state.message == "corpus c gives 3 train texts; calibrating needs at least 8"
    (tmp_path / LOG).write_text("Killed\n")
    assert status(tmp_path, job).message.startswith("prepare stopped (exit status 2): Killed")


def test_status_without_a_job_is_none_and_a_bundle_is_done(tmp_path):
    assert status(tmp_path, None) == PrepareStatus("none")
    (tmp_path / "bundle.json").write_text("{}")
    assert status(tmp_path, None).state == "done"
