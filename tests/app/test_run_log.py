"""app.run_log: the load benchmark's per-run timing is off by default and counts each run once."""

from __future__ import annotations

import time

import pytest

from app import run_log


def test_off_without_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.delenv(run_log.ENV, raising=False)
    with run_log.timed("full"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_one_line_per_run_and_nested_runs_count_once(monkeypatch, tmp_path):
    log = tmp_path / "runs.log"
    monkeypatch.setenv(run_log.ENV, str(log))
    # a fragment drawn inside a full run is part of that run
    with run_log.timed("full"), run_log.timed("fragment"):
        time.sleep(0.02)
    with run_log.timed("fragment"):  # a fragment-only rerun
        sum(range(200_000))
    lines = [line.split() for line in log.read_text().splitlines()]
    assert [line[1] for line in lines] == ["full", "fragment"]
    end, _, wall, cpu = lines[0]
    assert float(wall) >= 0.02 > float(cpu)  # sleeping is wall time, not CPU time
    assert abs(float(end) - time.time()) < 60


def test_a_run_that_raises_is_logged_and_the_error_kept(monkeypatch, tmp_path):
    log = tmp_path / "runs.log"
    monkeypatch.setenv(run_log.ENV, str(log))
    with pytest.raises(RuntimeError), run_log.timed("full"):  # Streamlit's rerun/stop
        raise RuntimeError("rerun")
    with run_log.timed("full"):
        pass
    assert len(log.read_text().splitlines()) == 2
