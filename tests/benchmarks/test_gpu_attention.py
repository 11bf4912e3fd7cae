"""benchmarks/gpu_attention.py keeps running when a method cannot even be set up: on a GPU
machine an optional package (AdaSplash, Triton) may fail at import in ways other than a
missing module, and one such method must not cost the rows of all the others."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gpu_attention(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_attention

    return gpu_attention


def test_a_method_that_fails_to_set_up_is_a_row_and_the_others_still_run(
        gpu_attention, monkeypatch, tmp_path, capsys):
    made = gpu_attention._method

    def broken(name, args, n):
        if name == "select":
            raise AttributeError("module 'triton' has no attribute 'something_new'")
        return made(name, args, n)

    monkeypatch.setattr(gpu_attention, "_method", broken)
    table = tmp_path / "table.md"
    monkeypatch.setattr(sys, "argv", ["gpu_attention.py", "--smoke", "--table", str(table),
                                      "--methods", "select", "sdpa", "block"])
    assert gpu_attention.main() == 0
    rows = {line.split(" | ")[3]: line for line in table.read_text().splitlines()
            if line.startswith("| random")}
    assert "failed to set up: AttributeError: module 'triton'" in rows["select"]
    for timed in ("sdpa", "block"):  # measured: a time in ms, then a max |Δ|
        cells = rows[timed].split(" | ")
        assert float(cells[4]) > 0 and float(cells[6]) >= 0
    assert "block_vs_sdpa=" in capsys.readouterr().out.strip().splitlines()[-1]


def test_the_selector_budget_follows_the_length_and_each_flag_overrides_its_part(
        gpu_attention, monkeypatch):
    monkeypatch.setattr(gpu_attention, "BUDGETS", {0: (448, 1024, 3072), 16384: (640, 1280, 6144)})

    def parsed(*flags):
        return gpu_attention.arguments().parse_args(list(flags))

    plain = parsed()
    assert gpu_attention.budget(plain, 4096) == (448, 1024, 3072)
    assert gpu_attention.budget(plain, 16383) == (448, 1024, 3072)
    assert gpu_attention.budget(plain, 16384) == (640, 1280, 6144)
    assert gpu_attention.budget(plain, 32768) == (640, 1280, 6144)
    assert gpu_attention.budget(parsed("--n-keys", "512"), 32768) == (512, 1280, 6144)
    # one stage: no block is widened, whatever the table says
    assert gpu_attention.budget(parsed("--candidates", "0"), 32768) == (640, 0, 0)
    assert gpu_attention.budget(parsed("--wide-keys", "0"), 4096) == (448, 0, 3072)
