"""Writing the manifests of the bundled files from the files themselves.

``python -m sparsefinder.bundle_manifest --write`` (the last step of ``make assets``) rewrites
``assets/bundle.json`` and ``assets/NAME/bundle.json``; ``--check`` (and
``tests/test_bundle.py``) compares them with what the files give now, so a rebuilt asset whose
manifest was not updated fails. Per file:

- ``kind``, ``purpose``, ``rebuild`` (the command) and ``make`` (the Makefile target) follow
  from its name (:data:`RULES`, mirroring the Makefile's ``assets*`` targets); a file no rule
  knows is refused, so a new asset gets a rule and a line of purpose;
- ``built_for`` (model id and α; the base model's weight fingerprint for the adapter) and
  ``details`` (objective, rank, centroids, block size…) are read from the file's own metadata,
  through the same loader the library uses (:func:`sparsefinder.files.load_payload`);
- ``bytes`` and ``sha256`` from its bytes.

A bundle's ``best`` map says which file serves a use best: ``projections`` is the file its
calibration table was fitted for (the best measured projections); ``centroids`` the shared
projections with k-means centroids (k-means, quantization, clusters and coref need queries and
keys in one space, which the augmented low-rank files do not have).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparsefinder.bundle import (
    FORMAT,
    FORMAT_VERSION,
    KINDS,
    MANIFEST,
    SHARED_FORMAT,
    BundleError,
    assets_root,
    bundle,
    shared,
)
from sparsefinder.files import atomic_write, file_sha256, load_payload

_OUT = "assets/{model}"
_TRAIN = "sparsefinder train --model {model} --corpus default --out " + _OUT
_OBJECTIVES = {
    "paper": "the paper's Eq. 7 hinge, one map for queries and keys",
    "logistic": "one shared map trained with a pointwise logistic loss (one distance "
                "threshold per head)",
    "lowrank": "training-free: each head's best rank-r approximation of q·k, augmented to a "
               "distance (separate query/key maps)",
    "lowrank-logistic": "the lowrank fit refined by one epoch of logistic loss on the bilinear "
                        "logit (separate query/key maps)",
    "lowrank-mass": "the lowrank-logistic refinement with each gold edge weighted by its entmax "
                    "probability (separate query/key maps)",
    "lowrank-pairwise": "lowrank-mass plus a mass-weighted pairwise term (separate query/key "
                        "maps)",
}


def _listing(values: list) -> str:
    return "{" + ", ".join(map(str, values)) + "}"


def _projections_purpose(d: dict) -> str:
    use = (f"k-means centroids B ∈ {_listing(d['centroids'])}" if d["centroids"]
           else "no k-means centroids: distance and calibrated methods")
    return f"Projections, r = {d['rank']}: {_OBJECTIVES.get(d['objective'], d['objective'])}; {use}"


@dataclass(frozen=True)
class Rule:
    """How a bundled file's name maps to its kind, purpose and rebuild command."""

    pattern: str
    kind: str
    make: str
    rebuild: str
    purpose: Callable[[dict], str]


RULES = (
    Rule(r"projections\.pt", "projections", "assets", _TRAIN, _projections_purpose),
    # the default's projections: built by `make assets` (the others by assets-projections)
    Rule(r"projections-r(?P<r>8)-(?P<objective>lowrank-mass)\.pt", "projections", "assets",
         _TRAIN + " --objective {objective} --rank {r} --filename {name}", _projections_purpose),
    Rule(r"projections-r(?P<r>\d+)-(?P<objective>[a-z-]+)\.pt", "projections",
         "assets-projections", _TRAIN + " --objective {objective} --rank {r} --filename {name}",
         _projections_purpose),
    Rule(r"calibration\.pt", "calibration", "assets",
         "sparsefinder calibrate --model {model} --projections " + _OUT + "/{projections_file} "
         "--out " + _OUT + "/{name}",
         lambda d: (f"Per-head settings of the calibrated methods ({', '.join(d['methods'])}) at "
                    f"target sparsities {min(d['targets'])}–{max(d['targets'])}, fitted on the "
                    f"train split for {d['projections_file']}: the app's target-sparsity "
                    "slider")),
    Rule(r"key_codebooks\.pt", "key codebooks", "assets",
         "sparsefinder fit-codebooks --model {model} --corpus default --out " + _OUT + "/{name}",
         lambda d: (f"Per-head k-means centroids of the model's own keys, B ∈ "
                    f"{_listing(d['clusters'])}: routed k-means (kmeans-routed, "
                    "kmeans-routed:budget)")),
    Rule(r"hash_codes\.pt", "hash codes", "assets",
         "sparsefinder fit-hash-codes --model {model} --corpus default --out " + _OUT + "/{name}",
         lambda d: f"Learned HashAttention codes, {d['bits']} bits per head: hashattention"),
    Rule(r"block_projections-b(?P<block>\d+)\.pt", "block projections", "assets",
         "sparsefinder fit-block-projections --model {model} --corpus default --block {block} "
         "--out " + _OUT + "/{name}",
         lambda d: (f"Eq. 7 projections of pooled {d['block']}-token query/key blocks "
                    f"(r = {d['rank']}, paper §6): the block-learned methods")),
    Rule(r"entmax_adapter\.safetensors", "adapter", "assets-adapter",
         "make build/austen.txt build/news.txt && sparsefinder adapt --model {model} "
         "--corpus build/austen.txt --corpus build/news.txt --out build/adapter --resume "
         "--steps 1000 --lr 2e-3 --w-sparse 0.5 --rank 16 --max-tokens 512 --batch-size 4 "
         "--measure-every 250 --eval-corpus narrative && cp build/adapter/{name} " + _OUT + "/",
         lambda d: (f"LoRA entmax adapter (rank {d['rank']}) merged into the base model at load:"
                    f" its {d['alpha']}-entmax outputs match its softmax ones (the `default` "
                    "model)")),
)
_WHY_PROJECTIONS = ("the calibration table was fitted for it; the best measured projections "
                    "(chosen on train: the default floored distance:budget's output cosine at "
                    "sparsity 0.90 above the lowrank-logistic file's, on validation too; "
                    "docs/results/quality.md)")
_WHY_CENTROIDS = ("shared query/key space with k-means centroids, which k-means, quantization, "
                  "clusters and coref need (the augmented low-rank files have none)")


def _rule(name: str) -> tuple[Rule, dict[str, str]]:
    for rule in RULES:
        match = re.fullmatch(rule.pattern, name)
        if match:
            return rule, match.groupdict()
    raise BundleError(f"no rule for bundled file {name!r}: add one to "
                      "sparsefinder.bundle_manifest.RULES (kind, purpose, rebuild command)")


def _pt_facts(path: Path, kind: str) -> tuple[dict, dict]:
    """(built_for, details) of a payload file, read with the library's loader."""
    from sparsefinder.calibration.table import CALIBRATION_FILE
    from sparsefinder.projections.hash_code_table import HASH_CODES_FILE
    from sparsefinder.projections.heads import PROJECTIONS_FILE
    from sparsefinder.projections.key_codebooks import CODEBOOKS_FILE

    fmt = {"calibration": CALIBRATION_FILE, "key codebooks": CODEBOOKS_FILE,
           "hash codes": HASH_CODES_FILE}.get(kind, PROJECTIONS_FILE)
    payload = load_payload(path, fmt)
    meta = dict(payload.get("metadata") or {})
    alpha = payload.get("alpha", meta.get("alpha"))
    built_for = {"model_id": payload["model_id"], "alpha": float(alpha)}
    trained_on = {k: meta[k] for k in ("corpus", "split") if k in meta}
    if kind in ("projections", "block projections"):
        details = {"objective": meta.get("objective", "paper"),
                   "rank": int(meta.get("rank", payload["rank"])),
                   "space": payload.get("kind", "shared"),
                   "centroids": sorted(int(b) for b in payload.get("centroids") or {})}
        if kind == "block projections":
            details = {"block": int(meta["block"]), "rank": details["rank"],
                       "epochs": int(meta["epochs"])}
    elif kind == "calibration":
        details = {"projections_file": payload["projections_file"],
                   "projections_sha256": payload["projections_sha256"],
                   "methods": sorted(payload["params"]),
                   "targets": [float(t) for t in payload["targets"]]}
    elif kind == "key codebooks":
        details = {"clusters": sorted(int(b) for b in payload["centroids"])}
    else:
        details = {"bits": int(payload["w_query"].shape[-1])}
    return built_for, {**details, **trained_on}


def _adapter_facts(path: Path) -> tuple[dict, dict]:
    from sparsefinder.models.adapter_file import read_adapter

    _, meta = read_adapter(path)
    built_for = {"base_model": meta["base_model"], "base_fingerprint": meta["base_fingerprint"],
                 "alpha": float(meta["alpha"])}
    return built_for, {"rank": int(meta["rank"]), "lora_alpha": float(meta["lora_alpha"]),
                       "model_type": meta["model_type"], "alpha": float(meta["alpha"]),
                       "targets": json.loads(meta.get("targets", "[]"))}


def _file_entry(path: Path, model: str) -> dict[str, Any]:
    rule, groups = _rule(path.name)
    built_for, details = (_adapter_facts(path) if rule.kind == "adapter"
                          else _pt_facts(path, rule.kind))
    fields = {**groups, **details, "name": path.name, "model": model}
    return {"name": path.name, "kind": rule.kind, "purpose": rule.purpose(details),
            "built_for": built_for, "bytes": path.stat().st_size, "sha256": file_sha256(path),
            "rebuild": rule.rebuild.format(**fields), "make": rule.make, "details": details}


def build_bundle_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of a model's bundle folder, from its files."""
    model = folder.name
    entries = [_file_entry(p, model) for p in sorted(folder.iterdir())
               if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")]
    entries.sort(key=lambda e: (KINDS.index(e["kind"]), e["name"]))
    model_ids = sorted({e["built_for"]["model_id"] for e in entries
                        if "model_id" in e["built_for"]})
    if len(model_ids) > 1:
        raise BundleError(f"{folder} mixes files of several models: {model_ids}")
    best: dict[str, dict[str, str]] = {}
    names = {e["name"] for e in entries}
    for e in entries:
        if e["kind"] == "calibration":
            if e["details"]["projections_file"] not in names:
                raise BundleError(f"{e['name']} was fitted for {e['details']['projections_file']}"
                                  f", which is not in {folder}")
            best["projections"] = {"file": e["details"]["projections_file"],
                                   "why": _WHY_PROJECTIONS}
    with_centroids = [e["name"] for e in entries
                      if e["kind"] == "projections" and e["details"]["centroids"]]
    if with_centroids:
        chosen = "projections.pt" if "projections.pt" in with_centroids else with_centroids[0]
        best["centroids"] = {"file": chosen, "why": _WHY_CENTROIDS}
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "bundle": model,
            "model_id": model_ids[0] if model_ids else None,
            "note": "Generated from the files by `python -m sparsefinder.bundle_manifest --write` "
                    "(`make assets` runs it); read with sparsefinder.bundle.bundle().",
            "best": best, "files": entries}


def _example_purposes(readme: Path) -> dict[str, str]:
    """``- `name.txt` — description`` lines of the examples' README."""
    found = re.findall(r"^- `([^`]+)` — (.+)$", readme.read_text(encoding="utf-8"), re.M)
    return dict(found)


def build_shared_manifest(root: Path) -> dict[str, Any]:
    """The manifest of the model-independent files under ``root`` and its bundle list."""
    entries = []
    probes = root / "coref_probes.json"
    if probes.is_file():
        data = json.loads(probes.read_text(encoding="utf-8"))
        entries.append({"name": probes.name, "kind": "coreference probes",
                        "purpose": "Hand-annotated pronoun → antecedent probes: `sparsefinder "
                                   "coref` and the app's Coreference page",
                        "details": {"version": data["version"], "probes": len(data["probes"]),
                                    "heldout": sum(p.get("split") == "heldout"
                                                   for p in data["probes"])}})
    holdout = root / "narrative_holdout.txt"
    if holdout.is_file():
        passages = [p for p in holdout.read_text(encoding="utf-8").split("\n\n") if p.strip()]
        entries.append({"name": holdout.name, "kind": "narrative hold-out",
                        "purpose": "Hand-written story and news passages, never trained on nor "
                                   "used to choose settings: `sparsefinder adapt --evaluate "
                                   "--eval-corpus narrative` measures the entmax adapter on them",
                        "details": {"passages": len(passages)}})
    examples = root / "examples"
    purposes = _example_purposes(examples / "README.md") if examples.is_dir() else {}
    for path in sorted(examples.iterdir()) if examples.is_dir() else []:
        if path.name == "README.md":
            entries.append({"name": "examples/README.md", "kind": "example notes",
                            "purpose": "What each example text is for"})
        elif path.suffix == ".txt":
            if path.name not in purposes:
                raise BundleError(f"{path.name} is not described in {examples / 'README.md'}")
            entries.append({"name": f"examples/{path.name}", "kind": "example text",
                            "purpose": f"App example: {purposes[path.name]}"})
    for e in entries:
        path = root / e["name"]
        e.update({"bytes": path.stat().st_size, "sha256": file_sha256(path),
                  "rebuild": None, "make": None})
    bundles = sorted(p.name for p in root.iterdir() if p.is_dir() and (
        (p / MANIFEST).is_file() or any(p.glob("*.pt")) or any(p.glob("*.safetensors"))))
    return {"format": SHARED_FORMAT, "format_version": FORMAT_VERSION, "bundles": bundles,
            "note": "Model-independent files (hand-written: no rebuild command); each model's "
                    "files are in its bundle, BUNDLE/bundle.json.", "files": entries}


def _dump(manifest: dict) -> str:
    """Indented JSON with short lists of numbers or names on one line."""
    text = json.dumps(manifest, indent=2, ensure_ascii=False)
    one_line = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]",
                      lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text)
    return one_line + "\n"


def manifests(root: Path) -> dict[Path, str]:
    """Every manifest under ``root`` as it should read now: {path: JSON text}."""
    shared = build_shared_manifest(root)
    out = {root / MANIFEST: _dump(shared)}
    for name in shared["bundles"]:
        out[root / name / MANIFEST] = _dump(build_bundle_manifest(root / name))
    return out


def write_manifests(root: Path) -> list[Path]:
    """(Re)write every manifest under ``root`` (atomically); returns their paths."""
    written = []
    for path, text in manifests(root).items():
        written.append(atomic_write(path, lambda handle, text=text: handle.write(text.encode())))
    return written


def check_manifests(root: Path) -> list[str]:
    """How the stored manifests differ from the files (empty: they match)."""
    problems = []
    for path, text in manifests(root).items():
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        stored, now = json.loads(path.read_text(encoding="utf-8")), json.loads(text)
        old = {e["name"]: e for e in stored.get("files", [])}
        new = {e["name"]: e for e in now.get("files", [])}
        for name in sorted(old.keys() | new.keys()):
            if name not in new:
                problems.append(f"{path.parent.name}/{name}: listed, but no such file")
            elif name not in old:
                problems.append(f"{path.parent.name}/{name}: not listed in {MANIFEST}")
            else:
                changed = [k for k in new[name] if old[name].get(k) != new[name][k]]
                if changed:
                    problems.append(f"{path.parent.name}/{name}: {', '.join(changed)} changed")
        rest = [k for k in now if k != "files" and stored.get(k) != now[k]]
        if rest:
            problems.append(f"{path}: {', '.join(rest)} changed")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sparsefinder.bundle_manifest [--write | --check] [--root DIR]``: list the
    bundles' files; ``--write`` regenerates the manifests from the files, ``--check`` exits 1
    when a manifest does not match them."""
    parser = argparse.ArgumentParser(prog="python -m sparsefinder.bundle_manifest",
                                     description=main.__doc__)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="regenerate the manifests")
    action.add_argument("--check", action="store_true", help="exit 1 if a manifest is stale")
    parser.add_argument("--root", type=Path, default=None, help="assets folder (default: "
                        "the bundled one)")
    args = parser.parse_args(argv)
    root = args.root or assets_root()
    if args.write:
        for path in write_manifests(root):
            print(f"wrote {path}")
        return 0
    if args.check:
        problems = check_manifests(root)
        for problem in problems:
            print(problem)
        print("manifests are stale: run `python -m sparsefinder.bundle_manifest --write`"
              if problems else "manifests match the files")
        return 1 if problems else 0
    for name in shared(root).manifest.get("bundles", []):
        b = bundle(name, root)
        print(f"bundle {name} ({b.model_id}), best: {b.uses()}")
        for f in b.files():
            print(f"  {f.name:40s} {f.kind:18s} {f.bytes / 1024:8.0f} KB  {f.purpose}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
