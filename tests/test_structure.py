"""The package's shape holds: imports point down the domain layers, no cycles, small modules,
and ``import sparsefinder`` stays light.

The layers are import-linter's contract in ``pyproject.toml`` (``[tool.importlinter]``);
grimp, the graph library under it, sees imports inside function bodies too, so an import
hidden in a function to dodge a cycle still counts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sparsefinder"
MAX_LINES = 400


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("sparsefinder", cache_dir=None)


def test_layers_contract_holds():
    """`lint-imports` checks the layers of pyproject.toml; it exits non-zero on a breach."""
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


def test_no_import_cycles_between_modules():
    graph = _graph()
    digraph = nx.DiGraph()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            # a package's __init__ re-exporting its own modules is not a cycle of jobs
            if not imported.startswith(module + "."):
                digraph.add_edge(module, imported)
    cycles = [c for c in nx.simple_cycles(digraph) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_no_module_over_the_size_limit():
    """The library and the app alike (a page that grows past the limit splits by job)."""
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for root in (PACKAGE, ROOT / "app") for p in root.rglob("*.py")}
    assert any(name.startswith("app/") for name in sizes)
    big = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines (split them by job): {big}"


def test_importing_the_package_imports_nothing_heavy():
    """The top-level API is lazy: names resolve on first use, so `import sparsefinder` (e.g.
    for `sparsefinder --help` or docs) does not pull torch, transformers or streamlit."""
    code = ("import sys, sparsefinder; "
            "print(sorted(m for m in ('torch', 'transformers', 'streamlit', 'pandas', 'spacy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "[]"


def test_public_api_resolves_every_name():
    import sparsefinder

    assert len(sparsefinder.__all__) >= 10
    for name in sparsefinder.__all__:
        assert getattr(sparsefinder, name) is not None, name
    assert set(sparsefinder.__all__) <= set(dir(sparsefinder))
