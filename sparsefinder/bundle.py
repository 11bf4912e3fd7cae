"""The bundled files, read through their manifests: one bundle per model.

``assets/`` at the top of the repository is shipped as the package ``sparsefinder.assets``
(``pyproject.toml`` maps it), so ``importlib.resources`` finds it in an editable install and
in a wheel; a source tree (``sparsefinder/`` beside ``assets/`` and ``pyproject.toml``) reads
its own ``assets/``. It holds::

    assets/bundle.json           the shared files (example texts, coreference probes) and the
                                 list of model bundles
    assets/default/bundle.json   the default model's bundle: per file its kind, purpose, the
                                 model it was built for, size, sha256 and rebuild command, and
                                 which file is the best for what
    assets/default/*.pt, *.safetensors

Usage::

    from sparsefinder.bundle import bundle, shared

    bundle().best("projections")   # best projections: r = 8 lowrank-logistic (the calibration
                                   # table was fitted for them)
    bundle().best("centroids")     # best projections WITH k-means centroids (shared space):
                                   # k-means, quantization, clusters, coref
    bundle().path("calibration")   # the one file of a kind, or a file by name:
    bundle().path("projections-r4-logistic.pt")
    bundle().files("block projections")   # every file of a kind (BundledFile: kind, purpose,
                                          # built_for, bytes, sha256, rebuild, details, path)
    shared().path("coref_probes.json"), examples_dir()

Loading reads only the manifest (no hashing); :meth:`Bundle.verify` compares names, sizes and
SHA-256 with the files. ``python -m sparsefinder.bundle_manifest --write`` regenerates the
manifests from the files (``make assets`` runs it), ``--check`` reports a stale one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.resources import files as package_files
from pathlib import Path
from typing import Any

from sparsefinder.files import SparsefinderFileError, file_sha256

MANIFEST = "bundle.json"
FORMAT = "sparsefinder-bundle"
SHARED_FORMAT = "sparsefinder-assets"
FORMAT_VERSION = 1
DEFAULT_BUNDLE = "default"
#: Kinds of the files of a model bundle.
KINDS = ("projections", "calibration", "key codebooks", "hash codes", "block projections",
         "adapter")
_WRITE = "`python -m sparsefinder.bundle_manifest --write`"


class BundleError(SparsefinderFileError):
    """A manifest is missing or damaged, or names no such file, kind or use."""


def assets_root() -> Path:
    """The folder of the bundled files: ``assets/`` of a source tree, else the installed
    ``sparsefinder.assets`` package (a wheel, or the mapping of an editable install)."""
    tree = Path(__file__).resolve().parent.parent
    if (tree / "pyproject.toml").is_file() and (tree / "assets" / "__init__.py").is_file():
        return tree / "assets"
    try:
        installed = package_files("sparsefinder.assets")
    except ModuleNotFoundError:  # neither: report where the files were looked for
        return tree / "assets"
    return installed if isinstance(installed, Path) else Path(str(installed))


@dataclass(frozen=True)
class BundledFile:
    """One file of a manifest (``path``: where it is on this machine)."""

    name: str
    kind: str
    purpose: str
    path: Path
    bytes: int
    sha256: str
    built_for: dict[str, Any] = field(default_factory=dict)
    rebuild: str | None = None
    make: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


class Bundle:
    """The files of one manifest: a model's bundle, or the shared files (:func:`shared`)."""

    def __init__(self, folder: Path, manifest: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.manifest = manifest
        self._files = [_entry(self.folder, item) for item in manifest.get("files", [])]

    def __repr__(self) -> str:
        return f"Bundle({self.name!r}, {len(self._files)} files in {self.folder})"

    @property
    def name(self) -> str:
        return str(self.manifest.get("bundle", ""))

    @property
    def model_id(self) -> str | None:
        """The model every file of the bundle was built for (None for the shared files)."""
        return self.manifest.get("model_id")

    def files(self, kind: str | None = None) -> list[BundledFile]:
        """Every file, or those of one ``kind`` (see :data:`KINDS`), in manifest order."""
        if kind is not None and kind not in self.kinds():
            raise BundleError(f"no {kind!r} files in {self._where()}; kinds: {self.kinds()}")
        return [f for f in self._files if kind is None or f.kind == kind]

    def kinds(self) -> list[str]:
        return list(dict.fromkeys(f.kind for f in self._files))

    def file(self, name_or_kind: str) -> BundledFile:
        """A file by name (``"calibration.pt"``), or the one file of a kind, or the best of a
        kind with several (:meth:`best`)."""
        for f in self._files:
            if f.name == name_or_kind:
                return f
        if name_or_kind in self.kinds():
            of_kind = self.files(name_or_kind)
            if len(of_kind) == 1:
                return of_kind[0]
            if name_or_kind in self.uses():
                return self.file(self.uses()[name_or_kind])
            raise BundleError(f"{self._where()} has {len(of_kind)} {name_or_kind} files "
                              f"({', '.join(f.name for f in of_kind)}); name one")
        raise BundleError(f"{name_or_kind!r} is neither a file nor a kind of {self._where()} "
                          f"(kinds: {', '.join(self.kinds())}); if it was just built, "
                          f"update the manifest with {_WRITE}")

    def path(self, name_or_kind: str) -> Path:
        """Where :meth:`file`'s file is (it may be missing on disk: check ``is_file()``)."""
        return self.file(name_or_kind).path

    def uses(self) -> dict[str, str]:
        """What the manifest marks best, by use: ``{use: file name}``."""
        return {use: str(best["file"]) for use, best in self.manifest.get("best", {}).items()}

    def best(self, use: str = "projections") -> Path:
        """The file the manifest marks best for ``use`` (``"projections"``, ``"centroids"``)."""
        uses = self.uses()
        if use not in uses:
            raise BundleError(f"{self._where()} marks no best file for {use!r} "
                              f"(uses: {', '.join(uses) or 'none'})")
        return self.path(uses[use])

    def why_best(self, use: str = "projections") -> str:
        """The manifest's reason for :meth:`best`."""
        self.best(use)
        return str(self.manifest["best"][use].get("why", ""))

    def verify(self) -> list[str]:
        """Differences between the manifest and the files on disk (names, sizes, SHA-256);
        empty when they agree."""
        problems = []
        for f in self._files:
            if not f.path.is_file():
                problems.append(f"{f.name}: listed but missing")
            elif f.path.stat().st_size != f.bytes:
                problems.append(f"{f.name}: {f.path.stat().st_size} bytes, manifest {f.bytes}")
            elif file_sha256(f.path) != f.sha256:
                problems.append(f"{f.name}: sha256 differs from the manifest")
        return problems

    def _where(self) -> str:
        return f"bundle {self.name!r}" if self.name else f"{self.folder}/{MANIFEST}"


def _entry(folder: Path, item: dict[str, Any]) -> BundledFile:
    try:
        return BundledFile(
            name=str(item["name"]), kind=str(item["kind"]), purpose=str(item["purpose"]),
            path=folder / str(item["name"]), bytes=int(item["bytes"]),
            sha256=str(item["sha256"]), built_for=dict(item.get("built_for") or {}),
            rebuild=item.get("rebuild"), make=item.get("make"),
            details=dict(item.get("details") or {}))
    except (KeyError, TypeError, ValueError) as error:
        raise BundleError(f"{folder / MANIFEST} has a damaged entry ({error!r}); regenerate "
                          f"it with {_WRITE}") from error


def read_manifest(path: Path, fmt: str = FORMAT) -> dict[str, Any]:
    """A manifest's JSON, checked for its format marker and version."""
    if not path.is_file():
        raise BundleError(f"no manifest at {path}; the bundled files are listed there: "
                          f"regenerate it with {_WRITE}")
    return _read_cached(str(path), path.stat().st_mtime_ns, fmt)


@lru_cache(maxsize=16)
def _read_cached(path: str, mtime_ns: int, fmt: str) -> dict[str, Any]:
    try:
        manifest = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BundleError(f"{path} is not a readable manifest ({error}); regenerate it with "
                          f"{_WRITE}") from error
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        raise BundleError(f"{path} is not a {fmt} manifest; regenerate it with {_WRITE}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BundleError(f"{path} has manifest format version "
                          f"{manifest.get('format_version')!r}, this version of sparsefinder "
                          f"reads {FORMAT_VERSION}; regenerate it with {_WRITE}")
    return manifest


def bundle(name: str = DEFAULT_BUNDLE, root: Path | None = None) -> Bundle:
    """The bundle of model ``name`` (``assets/NAME/bundle.json``; ``root``: another assets
    folder)."""
    root = Path(root) if root is not None else assets_root()
    folder = root / name
    if not (folder / MANIFEST).is_file():
        listed = shared(root).manifest.get("bundles", []) if (root / MANIFEST).is_file() else []
        raise BundleError(f"no bundle {name!r} in {root} (bundles: "
                          f"{', '.join(listed) or 'none'}); a bundle is a folder with a "
                          f"{MANIFEST}, written by {_WRITE}")
    return Bundle(folder, read_manifest(folder / MANIFEST))


def shared(root: Path | None = None) -> Bundle:
    """The model-independent files (``assets/bundle.json``): example texts, probes."""
    root = Path(root) if root is not None else assets_root()
    return Bundle(root, read_manifest(root / MANIFEST, SHARED_FORMAT))


def examples_dir() -> Path:
    """The folder of the bundled example texts (every one is listed in ``assets/bundle.json``)."""
    return shared().path("examples/README.md").parent


def narrative_holdout() -> Path:
    """The bundled narrative hold-out (``narrative_holdout.txt``: story and news passages the
    entmax adapter is measured on, never trained on)."""
    return shared().path("narrative hold-out")


def coref_probes() -> Path:
    """The bundled coreference probes (``coref_probes.json``)."""
    return shared().path("coreference probes")
