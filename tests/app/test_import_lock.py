"""The heavy imports of a fresh server happen one thread at a time (app/import_lock.py).

A cold server once showed ``partially initialized module 'pandas' has no attribute 'Series'``
when two tabs' sessions imported at the same moment; the race itself is timing-dependent, so
these tests pin the guard: every place that runs the heavy imports in a thread of its own
holds the one shared lock.
"""

from __future__ import annotations

import ast
import threading
from pathlib import Path

from app import import_lock

APP = Path(__file__).resolve().parents[2] / "app"


def _locked_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside a ``with HEAVY_IMPORTS:`` block."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and any(
                isinstance(item.context_expr, ast.Name) and item.context_expr.id == "HEAVY_IMPORTS"
                for item in node.items):
            inside.update(id(child) for child in ast.walk(node))
    return inside


def _heavy_imports(tree: ast.AST) -> list[ast.ImportFrom]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and (node.module or "").split(".")[0] in {"app", "sparsefinder"}
            and node.module != "app.import_lock"]


def test_main_imports_the_app_and_the_library_under_the_lock():
    tree = ast.parse((APP / "main.py").read_text())
    locked = _locked_nodes(tree)
    imports = _heavy_imports(tree)
    assert imports, "app/main.py imports the shell"
    assert all(id(node) in locked for node in imports), [
        ast.unparse(node) for node in imports if id(node) not in locked]
    preload = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
               and ast.unparse(node.func).endswith("plotly_chart")]
    assert preload and all(id(node) in locked for node in preload)  # imports Plotly


def test_the_warm_up_thread_imports_under_the_same_lock():
    tree = ast.parse((APP / "serve.py").read_text())
    warm = next(node for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef) and node.name == "_warm")
    locked = _locked_nodes(warm)
    imports = _heavy_imports(warm)
    assert imports and all(id(node) in locked for node in imports)


def test_the_lock_is_one_reentrant_lock_that_excludes_other_threads():
    lock = import_lock.HEAVY_IMPORTS
    got = []
    with lock, lock:  # a holder may import more under it
        other = threading.Thread(target=lambda: got.append(lock.acquire(timeout=0.05)))
        other.start()
        other.join()
    assert got == [False]
