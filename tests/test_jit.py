"""Generated kernels are imported from a file in the user cache, so numba compiles them once
per machine: a second process loads the first one's compiled code."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from sparsefinder.jit import generated_module

_SOURCE = textwrap.dedent('''\
    from numba import njit


    @njit(cache=True)
    def twice(x):
        return 2 * x
''')


def test_the_same_source_is_one_file_and_one_module(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("SPARSEFINDER_CACHE_DIR", str(tmp_path))
    module = generated_module("twice_test_a", _SOURCE)
    files = list((tmp_path / "jit").glob("twice_test_a_*.py"))
    assert len(files) == 1 and files[0].read_text() == _SOURCE
    assert module.__file__ == str(files[0])
    assert generated_module("twice_test_a", _SOURCE) is module
    assert module.twice(21) == 42


def test_a_second_process_loads_the_compiled_kernel(tmp_path) -> None:
    probe = textwrap.dedent(f'''\
        from sparsefinder.jit import generated_module
        twice = generated_module("twice_test_b", {_SOURCE!r}).twice
        assert twice(4) == 8
        print(sum(twice.stats.cache_hits.values()), sum(twice.stats.cache_misses.values()))
    ''')
    env = {**os.environ, "SPARSEFINDER_CACHE_DIR": str(tmp_path)}

    def run() -> tuple[int, int]:
        out = subprocess.run([sys.executable, "-c", probe], env=env, check=True,
                             capture_output=True, text=True).stdout.split()
        return int(out[0]), int(out[1])

    hits, misses = run()
    assert (hits, misses) == (0, 1)  # compiled here
    hits, misses = run()
    assert (hits, misses) == (1, 0)  # loaded from the first process's cache


def test_an_unwritable_cache_still_imports(monkeypatch, tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPARSEFINDER_CACHE_DIR", str(blocker))
    assert generated_module("twice_test_c", _SOURCE).twice(3) == 6
