"""Entry-point opt-ins (sparsefinder.runtime) and the promise that importing changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from sparsefinder import runtime


def test_importing_the_library_leaves_malloc_alone():
    code = ("import sparsefinder.attention.entmax_ops, sparsefinder.models.loading, "
            "sparsefinder.explore.live, sparsefinder.evaluation.sweep, torch; "
            "from transformers.utils import logging as l; "
            "print(l.is_progress_bar_enabled(), torch.get_num_threads())")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "SPARSEFINDER"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    assert out[0] == "True"  # transformers' progress bars are not switched off globally
    assert int(out[1]) == torch.get_num_threads()


def test_allocator_tuning_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("SPARSEFINDER_MALLOC_TUNING", "0")
    assert runtime.tune_cpu_allocator() is False
    monkeypatch.setenv("SPARSEFINDER_MALLOC_TUNING", "1")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")  # the user configured malloc: leave it alone
    assert runtime.tune_cpu_allocator() is False
