"""Mutation testing of the core modules with mutmut (`make mutation`; not part of `make test`).

Each core module is mutated on its own and judged ONLY by the tests that mirror it
(sparsefinder/metrics/scorer.py -> tests/metrics/test_scorer.py, predictors/kmeans.py ->
tests/predictors/test_kmeans.py, explore/live.py -> tests/explore/test_live.py, ...), so the
score says how well a module's own tests pin its behaviour, not whether some far-off app test
happens to trip over it. mutmut runs in a scratch copy (build/mutation/<module>/) so the work
tree is never touched; within a module it runs each mutant only against the mirrored tests
that execute the mutated function (its own coverage-based selection), forked from a process
that already imported torch, which keeps the whole run well under an hour on two cores.

Counting: killed = killed + timeout + segfault (the tests noticed); survived = survived +
"no tests" (the mirrored tests never reach the mutated function) + suspicious. Mutants listed
in tools/equivalent_mutants.txt (one per line: name, then why) are equivalent to the original
program; they are reported apart and counted in neither. `--sample N` keeps a deterministic
sample of at most N mutants per module (sha1 of the name) and says so; the default runs all.

The last line is `killed=<k> survived=<s> score=<k/(k+s)>`. Survivors, with their diffs, are
written to build/mutation/survivors.txt.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = ROOT / "build" / "mutation"
EQUIVALENT_FILE = ROOT / "tools" / "equivalent_mutants.txt"

# module (relative to sparsefinder/) -> the test files that mirror it.
CORE: dict[str, list[str]] = {
    "metrics/measures.py": ["tests/metrics/test_scorer.py", "tests/metrics/test_measures.py"],
    "metrics/scorer.py": ["tests/metrics/test_scorer.py", "tests/metrics/test_measures.py"],
    "attention/entmax_ops.py": ["tests/attention/test_entmax_ops.py"],
    "attention/entmax_blocks.py": ["tests/attention/test_entmax_ops.py"],
    "projections/heads.py": ["tests/projections/test_heads.py",
                             "tests/projections/test_objectives.py"],
    "projections/hinge.py": ["tests/projections/test_heads.py",
                             "tests/projections/test_objectives.py"],
    "projections/pairs.py": ["tests/projections/test_pairs.py",
                             "tests/projections/test_heads.py",
                             "tests/projections/test_objectives.py"],
    "evaluation/sweep.py": ["tests/evaluation/test_sweep.py"],
    "evaluation/frontier.py": ["tests/evaluation/test_sweep.py",
                               "tests/evaluation/test_frontier.py"],
    "evaluation/curves.py": ["tests/evaluation/test_sweep.py"],
    "data/records.py": ["tests/data/test_records.py"],
    "attention/masks.py": ["tests/attention/test_masks.py"],
    "methods/spec.py": ["tests/methods/test_spec.py"],
    "explore/live.py": ["tests/explore/test_live.py"],
    "explore/state.py": ["tests/explore/test_state.py"],
}
# predictors/base.py is left out: it declares typing.Protocol classes, and mutmut's
# trampolines add members to them, so runtime isinstance() checks fail on the UNMUTATED copy
# (mutmut cannot collect its stats); its one function, owns_output, is a getattr.
for _path in sorted((ROOT / "sparsefinder" / "predictors").glob("*.py")):
    if _path.name not in ("__init__.py", "base.py"):
        CORE[f"predictors/{_path.name}"] = [f"tests/predictors/test_{_path.name}"]

# Tests left out of mutation runs (they still run in `make test`), with why:
# - the progress-bar test: when a mutant makes it fail inside a forked mutmut worker, the
#   worker hangs (tqdm + fork) until mutmut's timeout, ~15 s each, instead of failing; the
#   progress-bar mutants it would kill are counted as survivors instead.
# - warning-location tests: mutmut's trampolines add a stack frame between the caller and
#   the library, so a correct stacklevel points at the trampoline there.
DESELECT = [
    "tests/projections/test_heads.py::test_progress_bars_count_layers_and_fits",
    "tests/data/test_records.py::test_long_text_warning_points_at_the_caller",
    "tests/evaluation/test_sweep.py::test_the_skip_warning_points_at_the_caller",
]

KILLED = {"killed", "timeout", "segfault", "caught by type check"}
SURVIVED = {"survived", "no tests", "suspicious"}


def _status(code: int | None) -> str:
    """mutmut's own exit-code table, so our counts mean what its UI shows."""
    from mutmut.stats import status_by_exit_code

    return status_by_exit_code[code]


def load_equivalent() -> dict[str, str]:
    """name -> reason, from tools/equivalent_mutants.txt (`name  why`; # starts a comment)."""
    out: dict[str, str] = {}
    if not EQUIVALENT_FILE.exists():
        return out
    for line in EQUIVALENT_FILE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, why = line.partition(" ")
        if not why.strip():
            raise SystemExit(f"{EQUIVALENT_FILE}: {name!r} has no reason; say why it is equivalent")
        out[name] = why.strip()
    return out


def _prepare(module: str, tests: list[str]) -> Path:
    """A fresh scratch copy of the package and tests with a [tool.mutmut] section for `module`."""
    work = _work_dir(module)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    shutil.copytree(ROOT / "sparsefinder", work / "sparsefinder", ignore=ignore)
    shutil.copytree(ROOT / "tests", work / "tests", ignore=ignore)
    config = "\n".join(
        [
            "",
            "[tool.mutmut]",
            'source_paths = ["sparsefinder"]',
            f'only_mutate = ["sparsefinder/{module}"]',
            f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
            # A fixed hypothesis seed: a mutant's verdict must not depend on the draw.
            'pytest_add_cli_args = ["-p", "no:cacheprovider", '
            '"--hypothesis-seed=0", "-q", '
            + ", ".join(f'"--deselect", "{t}"' for t in DESELECT) + "]",
            "use_git_change_detection = false",
            "",
        ]
    )
    (work / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text() + config)
    return work


def _mutmut(work: Path, args: list[str], log) -> int:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the scratch copy must be the one imported
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    cmd = [sys.executable, "-m", "mutmut", *args]
    return subprocess.call(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)


def _generated_names(work: Path, module: str) -> list[str]:
    meta = work / "mutants" / "sparsefinder" / (module + ".meta")
    return sorted(json.loads(meta.read_text())["exit_code_by_key"])


def _results(work: Path, module: str) -> dict[str, int | None]:
    meta = work / "mutants" / "sparsefinder" / (module + ".meta")
    return json.loads(meta.read_text())["exit_code_by_key"]


def _diffs(work: Path, module: str, names: list[str]) -> dict[str, str]:
    """name -> unified diff, from mutmut's own diff function, in one process per module."""
    if not names:
        return {}
    code = (
        "import json, sys\n"
        "from mutmut.mutation.diff_apply import get_diff_for_mutant\n"
        "names = json.loads(sys.argv[1])\n"
        "print(json.dumps({n: get_diff_for_mutant(n, path=sys.argv[2]) for n in names}))\n"
    )
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(names), f"sparsefinder/{module}"],
        cwd=work, env=env, capture_output=True, text=True,
    )
    if out.returncode != 0:
        return {n: f"(no diff: {out.stderr.strip()[-300:]})" for n in names}
    return json.loads(out.stdout)


def _sample(names: list[str], n: int) -> list[str]:
    key = lambda s: hashlib.sha1(s.encode()).hexdigest()  # noqa: E731 - deterministic order
    return sorted(sorted(names, key=key)[:n])


def _work_dir(module: str) -> Path:
    return SCRATCH / module.replace("/", "_").removesuffix(".py")


def run_module(module: str, tests: list[str], sample: int | None, children: int,
               rerun: bool = True) -> dict:
    """mutmut on one module → {"work", "results", "seconds"}; ``rerun=False`` reads the
    results a previous run left in build/mutation/ (seconds as that run logged them)."""
    if not rerun:
        work = _work_dir(module)
        timing = work / "seconds.txt"
        try:
            results = _results(work, module)
        except (FileNotFoundError, KeyError, ValueError) as error:
            return {"work": work, "error": f"no results in {work}: {error}", "seconds": 0.0}
        return {"work": work, "results": results,
                "seconds": float(timing.read_text()) if timing.exists() else math.nan}
    work = _prepare(module, tests)
    log_path = work / "mutmut.log"
    start = time.monotonic()
    with open(log_path, "w") as log:
        names: list[str] = []
        if sample is not None:
            # Generate only (a name that matches nothing), then run the deterministic sample.
            _mutmut(work, ["run", "sparsefinder.__no_such_mutant__*"], log)
            all_names = _generated_names(work, module)
            names = _sample(all_names, sample)
        rc = _mutmut(work, ["run", "--max-children", str(children), *names], log)
    seconds = time.monotonic() - start
    (work / "seconds.txt").write_text(f"{seconds:.1f}")
    if rc != 0:
        tail = log_path.read_text()[-1500:]
        return {"work": work, "error": f"mutmut exit {rc}; log {log_path}:\n{tail}",
                "seconds": seconds}
    results = _results(work, module)
    if names:
        results = {k: v for k, v in results.items() if k in set(names)}
    return {"work": work, "results": results, "seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="subset of core modules, e.g. metrics.py")
    parser.add_argument("--sample", type=int, default=None, help="at most N mutants per module")
    parser.add_argument("--children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--report-only", action="store_true",
                        help="summarise the last run's results in build/mutation/ again")
    args = parser.parse_args(argv)
    modules = args.modules or list(CORE)
    unknown = [m for m in modules if m not in CORE]
    if unknown:
        raise SystemExit(f"unknown module(s) {unknown}; choose from {sorted(CORE)}")
    equivalent = load_equivalent()
    seen: set[str] = set()
    total_killed = total_survived = total_equivalent = 0
    survivors: list[tuple[Path, str, str, str]] = []  # work dir, module, name, status
    start = time.monotonic()
    if args.sample is not None:
        print(f"sampling: at most {args.sample} mutants per module (sha1 order, deterministic)")
    failed: list[str] = []
    not_equivalent: list[str] = []
    for module in modules:
        out = run_module(module, CORE[module], args.sample, args.children,
                         rerun=not args.report_only)
        if "error" in out:
            print(f"{module:28s} FAILED: {out['error']}", flush=True)
            failed.append(module)
            continue
        killed = survived = eq = timeouts = unchecked = 0
        for name, code in sorted(out["results"].items()):
            seen.add(name)
            status = _status(code)
            if status in KILLED:
                killed += 1
                timeouts += status == "timeout"
                if name in equivalent:  # a test tells it apart: it is not equivalent
                    not_equivalent.append(name)
            elif name in equivalent:
                eq += 1
            elif status in SURVIVED:
                survived += 1
                survivors.append((out["work"], module, name, status))
            elif status == "not checked":  # an interrupted run: say so, count nothing
                unchecked += 1
            else:
                raise SystemExit(f"{name}: unexpected mutmut status {status!r} (exit {code})")
        score = killed / max(killed + survived, 1)
        print(
            f"{module:28s} killed={killed:4d} survived={survived:3d} equivalent={eq:3d} "
            f"score={score:.3f} timeouts={timeouts} ({out['seconds']:.0f} s)"
            + (f" NOT CHECKED={unchecked} (interrupted run)" if unchecked else ""),
            flush=True,
        )
        total_killed += killed
        total_survived += survived
        total_equivalent += eq
    stale = sorted(
        n for n in equivalent if n not in seen and any(n.startswith(_prefix(m)) for m in modules)
    )
    report = SCRATCH / "survivors.txt"
    with open(report, "w") as f:
        for module in modules:
            mine = [(w, n, st) for w, m, n, st in survivors if m == module]
            if not mine:
                continue
            diffs = _diffs(mine[0][0], module, [n for _, n, _ in mine])
            for _, name, status in mine:
                f.write(f"### {name} ({status})\n{diffs.get(name, '')}\n\n")
    print(f"survivors with diffs: {report.relative_to(ROOT)}")
    for _, _, name, status in survivors:
        print(f"  survivor: {name} ({status})")
    if not_equivalent:
        print(f"listed as equivalent but killed (remove them from {EQUIVALENT_FILE.name}): "
              f"{not_equivalent}")
    if stale:
        print(f"equivalent_mutants.txt entries no longer generated (stale): {stale}")
    module_seconds = sum(float((_work_dir(m) / "seconds.txt").read_text())
                         for m in modules if (_work_dir(m) / "seconds.txt").exists())
    print(f"equivalent={total_equivalent} time={time.monotonic() - start:.0f}s "
          f"(mutmut time of these modules: {module_seconds:.0f}s)")
    score = total_killed / max(total_killed + total_survived, 1)
    if failed:
        print(f"modules where mutmut failed (not counted): {failed}")
    print(f"killed={total_killed} survived={total_survived} score={score:.3f}")
    if failed:
        raise SystemExit(1)


def _prefix(module: str) -> str:
    return "sparsefinder." + module.removesuffix(".py").replace("/", ".") + ".x"


if __name__ == "__main__":
    main()
