"""One door for every model run of the app (``app.model_runs.model_run``).

Sessions share one model object per name and α is a setting of that object, so a run that
does not set α under the lock runs at whatever α another session left. Two checks:

* two sessions at different α, at the same time (threads), get what they get one after the
  other (and a run outside the door, as the Coreference page's ranking over all probes once
  was, does not: the harness would see it);
* an AST scan of ``app/`` finds no model run outside ``with model_run(...)``.
"""

from __future__ import annotations

import ast
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import torch
from apptest_helpers import ROOT
from tolerances import bound

from app import model_runs
from app.context import CacheKey
from sparsefinder.analysis import coref
from sparsefinder.explore import inputs
from sparsefinder.methods.spec import PredictorSpec

ALPHAS = (1.5, 2.0)  # entmax and sparsemax: different gold graphs on the same text
TEXT = "The engineer told the pilots that she had checked their engine twice."
PASSAGES = 4
WINDOW = PredictorSpec.of("window", {"window": 1})
TINY_HIDDEN = 32  # the tiny BERT of tests/conftest.py: the outputs' dimension


@pytest.fixture
def tiny(tiny_model_dirs, monkeypatch) -> str:
    """A tiny random BERT as a model name (a local folder), and model runs that pause a
    moment inside: a session whose run is not kept whole gets overtaken."""
    original = inputs.extract_one

    def slow(*args, **kwargs):
        time.sleep(0.002)
        return original(*args, **kwargs)

    monkeypatch.setattr(inputs, "extract_one", slow)
    return str(tiny_model_dirs["bert"])


def _golds(records) -> list[torch.Tensor]:
    return [layer.gold for record in records for layer in record.layers]


def _session(name: str, alpha: float, start: threading.Barrier | None,
             probes: Callable[[str, float], list]) -> dict:
    """What one browser session runs: the sidebar's text, then (once both sessions have drawn
    their page: ``start``) the Coreference ranking over all probes, the validation records of
    Pareto/Clusters and the Explorer's output accuracy."""
    prepared = model_runs.cached_prepared(name, alpha, TEXT, "none", None)
    if start is not None:
        start.wait(timeout=60)
    ranking, probe_records = probes(name, alpha)
    records = model_runs.validation_records(name, alpha, PASSAGES)
    key = CacheKey(name, alpha, "text", "none")
    accuracy = model_runs.cached_accuracy(key, WINDOW.key, WINDOW, prepared)
    return {"text": _golds([prepared.record]), "ranking": ranking,
            "probes": _golds(probe_records), "records": _golds(records),
            "cosine": accuracy.output_cosine}


def _door_probes(name: str, alpha: float) -> tuple[pd.DataFrame, list]:
    ranking, prepared = model_runs.all_probes((name, alpha, "none"), None)
    return ranking, [p.record for p in prepared]


def _outside_probes(name: str, alpha: float) -> tuple[pd.DataFrame, list]:
    """The ranking as the Coreference page once ran it: the shared model as it stands."""
    probes = coref.load_probes()
    loaded = model_runs.cached_model(name)
    records = [inputs.extract_one(loaded, p.text)[0] for p in probes]
    return coref.rank_heads(records, probes), records


def _in_turn(name: str, probes) -> list[dict]:
    model_runs.st.cache_resource.clear()
    return [_session(name, alpha, None, probes) for alpha in ALPHAS]


def _at_once(name: str, probes) -> list[dict]:
    model_runs.st.cache_resource.clear()
    start = threading.Barrier(len(ALPHAS))
    with ThreadPoolExecutor(len(ALPHAS)) as pool:
        futures = [pool.submit(_session, name, alpha, start, probes) for alpha in ALPHAS]
        return [f.result(timeout=600) for f in futures]


def _differences(one: dict, other: dict) -> list[str]:
    """What differs between two sessions' results (gold graphs bit for bit: the same
    operations on the same inputs; the ranking's float32 means over the probes' keys and the
    cosine of d-dimensional float32 outputs within their rounding, tests/tolerances.py)."""
    found = [part for part in ("text", "probes", "records")
             if len(one[part]) != len(other[part])
             or not all(torch.equal(a, b) for a, b in zip(one[part], other[part], strict=True))]
    keys = max((gold.shape[-1] for gold in one["probes"]), default=1)
    try:  # a mean over the probes of masses summed over ≤ `keys` keys
        pd.testing.assert_frame_equal(one["ranking"], other["ranking"],
                                      rtol=bound(1.0, terms=2 * (keys + len(one["probes"]))))
    except AssertionError:
        found.append("ranking")
    if abs(one["cosine"] - other["cosine"]) > bound(1.0, terms=2 * TINY_HIDDEN + 4):
        found.append("cosine")
    return found


def test_two_sessions_at_different_alpha_at_once_get_what_they_get_in_turn(tiny):
    expected = _in_turn(tiny, _door_probes)
    assert _differences(*expected) == ["text", "probes", "records", "ranking", "cosine"]
    together = _at_once(tiny, _door_probes)
    for alpha, want, got in zip(ALPHAS, expected, together, strict=True):
        assert _differences(want, got) == [], f"the session at α={alpha}"


def test_the_harness_sees_a_run_outside_the_door(tiny):
    """The old Coreference ranking (the shared model at whatever α it was left at) is right
    in turn and wrong at once: the session whose sidebar ran first ranks at the α the other
    one's sidebar left (and the other may be overtaken by the first one's later runs)."""
    expected = _in_turn(tiny, _outside_probes)
    assert _differences(expected[0], _in_turn(tiny, _door_probes)[0]) == []
    together = _at_once(tiny, _outside_probes)
    wrong = [alpha for alpha, want, got in zip(ALPHAS, expected, together, strict=True)
             if "probes" in _differences(want, got)]
    assert wrong, "two sessions at once ranked as they do in turn"


def test_model_run_sets_alpha_and_is_not_reentrant(tiny):
    with model_runs.model_run(tiny, 2.0) as loaded:
        assert loaded.alpha == 2.0
        with pytest.raises(RuntimeError, match="inside model_run"), model_runs.model_run(
                tiny, 1.5):
            pass
    with model_runs.model_run(tiny, 1.5) as loaded:  # released after the error
        assert loaded.alpha == 1.5


# ------------------------------------------------------------------------------------------
# No model run in app/ outside the door
# ------------------------------------------------------------------------------------------

DOOR = ("app.model_runs", "model_run")
#: Only the door sets α (set_alpha, use_entmax) and only cached_model loads a model.
OWNERS = {"set_alpha": "model_run", "use_entmax": "model_run", "load_model": "cached_model"}
LOADED_NAMES = {"loaded", "_loaded"}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _takes_model(arg: ast.arg) -> bool:
    """A parameter that receives a loaded model: named ``loaded``, typed ``LoadedModel``, or a
    ``model`` typed as a torch module (the forward pass itself)."""
    note = ast.unparse(arg.annotation) if arg.annotation is not None else ""
    return (arg.arg in LOADED_NAMES or "LoadedModel" in note
            or (arg.arg == "model" and ("Module" in note or "PreTrained" in note)))


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = node.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs]


@functools.cache
def _sources() -> dict[str, ast.Module]:
    """The parsed modules of app/ and the library (read once)."""
    return {_module_name(p): ast.parse(p.read_text(encoding="utf-8"))
            for folder in ("app", "sparsefinder") for p in sorted((ROOT / folder).rglob("*.py"))}


def model_takers(trees: dict[str, ast.Module]) -> set[tuple[str, str]]:
    """(module, function) of every module-level function that takes a loaded model."""
    return {(module, node.name) for module, tree in trees.items() for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and any(_takes_model(a) for a in _params(node))}


def _imports(tree: ast.Module, modules: set[str]) -> tuple[dict[str, str], dict]:
    """(alias → module, name → (module, name)) of every import in the file, nested too."""
    aliases: dict[str, str] = {}
    names: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for item in node.names:
                aliases[item.asname or item.name.split(".")[0]] = (
                    item.name if item.asname else item.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            for item in node.names:
                full = f"{node.module}.{item.name}"
                if full in modules:
                    aliases[item.asname or item.name] = full
                else:
                    names[item.asname or item.name] = (node.module, item.name)
    return aliases, names


class Scan:
    """The model runs of app/ (and of any extra source given): where each is, and whether it
    is inside the door."""

    def __init__(self, extra: dict[str, str] | None = None) -> None:
        trees = dict(_sources())
        trees.update({name: ast.parse(code) for name, code in (extra or {}).items()})
        self.modules = set(trees)
        self.imports = {m: _imports(t, self.modules) for m, t in trees.items()}
        self.defined = {m: {n.name for n in t.body if isinstance(n, ast.FunctionDef)}
                        for m, t in trees.items()}
        self.takers = model_takers(trees)
        self.outside: list[str] = []  # "module:line call" of runs outside the door
        self.inside: set[tuple[str, str]] = set()  # model takers called through the door
        for module, tree in trees.items():
            if module.startswith("app.") or module in (extra or {}):
                self._scan(module, tree)

    def resolve(self, module: str, func: ast.expr, depth: int = 0) -> tuple[str, str] | None:
        """The (module, function) a call names, following re-exports (``shell.X``)."""
        aliases, names = self.imports.get(module, ({}, {}))
        if isinstance(func, ast.Name):
            found = names.get(func.id) or (module, func.id)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id not in aliases:
                return None
            found = (aliases[func.value.id], func.attr)
        else:
            return None
        owner, name = found
        if depth < 4 and owner in self.imports and name not in self.defined.get(owner, ()):
            again = self.resolve(owner, ast.Name(name), depth + 1)
            return again if again is not None and again[0] != owner else found
        return found

    def _loaded(self, node: ast.expr, names: set[str], module: str) -> bool:
        """A loaded model (or its torch module): a name bound to one, ``ctx.loaded``, or a
        call of ``cached_model``."""
        if isinstance(node, ast.Name):
            return node.id in names
        if isinstance(node, ast.Attribute):
            return node.attr == "loaded" or (node.attr == "model"
                                             and self._loaded(node.value, names, module))
        if isinstance(node, ast.Call):
            target = self.resolve(module, node.func)
            return target is not None and target[1] == "cached_model"
        return False

    def _scan(self, module: str, tree: ast.Module) -> None:
        names = set(LOADED_NAMES)
        for node in ast.walk(tree):  # names bound to a model anywhere in the file
            if isinstance(node, ast.Assign) and self._loaded(node.value, names, module):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.With):
                names |= {item.optional_vars.id for item in node.items
                          if self._door(module, item) and isinstance(item.optional_vars, ast.Name)}
        self._visit(module, tree, names, inside=False, function=None)

    def _door(self, module: str, item: ast.withitem) -> bool:
        """Whether ``with`` item is ``model_run(...)``, the app's (not a look-alike)."""
        call = item.context_expr
        return isinstance(call, ast.Call) and self.resolve(module, call.func) == DOOR

    def _visit(self, module: str, node: ast.AST, names: set[str], inside: bool,
               function: str | None) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            # a function that takes the model may run it: its callers are checked instead
            inside = inside or (module, node.name) == DOOR or any(
                _takes_model(a) for a in _params(node))
            function = node.name
        elif isinstance(node, ast.With) and any(self._door(module, i) for i in node.items):
            for item in node.items:
                self._visit(module, item.context_expr, names, inside, function)
            for child in node.body:
                self._visit(module, child, names, True, function)
            return
        elif isinstance(node, ast.Call):
            self._check(module, node, names, inside, function)
        for child in ast.iter_child_nodes(node):
            self._visit(module, child, names, inside, function)

    def _check(self, module: str, call: ast.Call, names: set[str], inside: bool,
               function: str | None) -> None:
        target = self.resolve(module, call.func)
        where = f"{module}:{call.lineno} {ast.unparse(call)[:80]}"
        if target is not None and target[1] in OWNERS:
            if (module, function) != (DOOR[0], OWNERS[target[1]]):
                self.outside.append(where)
            return
        runs = (target in self.takers
                or self._loaded(call.func, names, module)
                or any(self._loaded(a, names, module)
                       for a in [*call.args, *(k.value for k in call.keywords)]))
        if runs and not inside:
            self.outside.append(where)
        elif runs and target in self.takers:
            self.inside.add(target)


def test_no_model_run_in_the_app_bypasses_model_run():
    scan = Scan()
    assert scan.outside == []
    # the scan sees the runs it guards: every library entry point the app uses to run the
    # model is found, each inside the door
    called = {name for _, name in scan.inside}
    assert {"extract_one", "corpus_records", "atlas_for", "setting_accuracy", "task_accuracy",
            "accuracy_sweep", "encode", "reference"} <= called, called


#: Ways around the door, each as a page might write it (the first two were the app's own
#: Coreference and Clusters pages).
AROUND = {
    "the ranking over all probes": '''
from app import shell
from sparsefinder.explore import inputs
import streamlit as st

@st.cache_resource
def _all_probes(model_key, _loaded, _projections):
    return [inputs.extract_one(_loaded, text) for text in TEXTS]

def view(ctx):
    return _all_probes(ctx.cache_key.model_key, ctx.loaded, None)
''',
    "validation records without α": '''
from app import shell
from sparsefinder.explore import corpus as excorpus

def view(ctx):
    return excorpus.corpus_records(ctx.loaded, split="validation", max_passages=8)
''',
    "the lock without the door": '''
from app import shell
from sparsefinder.models.loading import set_alpha
from sparsefinder.explore import inputs

def view(ctx, lock):
    with lock:
        set_alpha(ctx.loaded, 2.0)
        return inputs.extract_one(ctx.loaded, "text")
''',
    "a forward pass on an alias": '''
from app import shell

def view(name, batch):
    model = shell.cached_model(name)
    return model.model(**batch)
''',
    "a door of its own": '''
import contextlib
from app import shell
from sparsefinder.data.records import extract

@contextlib.contextmanager
def model_run(name, alpha):
    yield shell.cached_model(name)

def view(name, texts):
    with model_run(name, 2.0) as loaded:
        return extract(loaded, texts)
''',
}


@pytest.mark.parametrize("case", list(AROUND))
def test_the_scan_finds_each_way_around_the_door(case):
    scan = Scan({"app.app_pages.probe_case": AROUND[case]})
    assert [w for w in scan.outside if w.startswith("app.app_pages.probe_case")], case


def test_the_scan_lets_a_run_through_the_door():
    through = '''
from app import shell
from sparsefinder.explore import inputs

def view(ctx, text):
    with shell.model_run(ctx.state.model, ctx.state.alpha) as loaded:
        return inputs.extract_one(loaded, text)
'''
    scan = Scan({"app.app_pages.probe_case": through})
    assert not [w for w in scan.outside if w.startswith("app.app_pages.probe_case")]
    assert ("sparsefinder.explore.inputs", "extract_one") in scan.inside
