"""The one cache root: ``$SPARSEFINDER_CACHE_DIR``, else XDG, else ``~/.cache``."""

from __future__ import annotations

from pathlib import Path

from sparsefinder.user_cache import user_cache_dir


def test_the_variable_moves_every_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("SPARSEFINDER_CACHE_DIR", str(tmp_path / "sf"))
    assert user_cache_dir("jit") == tmp_path / "sf" / "jit"
    assert user_cache_dir() == tmp_path / "sf"


def test_without_the_variable_xdg_then_home(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("SPARSEFINDER_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir("atlas") == tmp_path / "xdg" / "sparsefinder" / "atlas"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache_dir("a", "b") == Path(tmp_path / "home" / ".cache" / "sparsefinder" / "a"
                                            / "b")
