"""One reader and one writer for the files Sparsefinder ships and the ones users make.

Every ``.pt`` file (projections, calibration tables, key codebooks, hash codes, block
projections, gold-graph records) is a *payload*: a plain dict of tensors and primitives with a
``format`` marker, a format version and the model it was made for, described by a
:class:`FileFormat`. The same description drives both directions:

- :func:`save_payload` writes it through :func:`atomic_write` (a temporary file in the same
  folder, flushed and fsynced, then ``os.replace``: the path holds either the old file or the
  whole new one, never half of one; the entmax adapter's safetensors file uses it too);
- :func:`load_payload` reads it: a size cap first (``max_bytes``, for files a user hands to a
  served app), then ``torch.load(weights_only=True)`` (no code runs on load), the format
  marker and the version. Each failure is the format's own error class with one message
  naming the file, the problem and the command that makes a good one.

Every file error derives from :class:`SparsefinderFileError` (a ``ValueError``), so a caller
can catch "this file cannot be used" once: ``ProjectionsError``, ``CalibrationError``,
``CodebooksError``, ``HashCodesError``, ``AdapterError``, ``RecordsFileError`` and the
manifest's ``BundleError``. A missing file is a plain ``FileNotFoundError``.

Checks that depend on the caller (the model a file must be for, shapes) stay with each format's
class, which reads the payload returned here.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

_MB = 1024 * 1024


class SparsefinderFileError(ValueError):
    """A Sparsefinder file (bundled or the user's) cannot be used: damaged, of another format
    or version, too large, or made for another model. The message says which file, what is
    wrong and how to make a good one."""


@dataclass(frozen=True)
class FileFormat:
    """What a payload file is: its marker, readable versions and the words its errors use.

    ``version_key`` names the payload's version field; None means the version is part of the
    marker itself (e.g. ``"sparsefinder-hash-codes/1"``). ``unversioned`` is the version of
    files written before the field existed (None: such files are refused). ``what`` names the
    file in messages ("Sparsefinder projections file"), ``noun`` the format in short
    ("projections"), ``command`` the command that (re)makes one.
    """

    name: str
    what: str
    noun: str
    command: str
    error: type[SparsefinderFileError] = SparsefinderFileError
    versions: tuple[int, ...] = (1,)
    version_key: str | None = "format_version"
    unversioned: int | None = None

    def header(self, version: int | None = None) -> dict[str, Any]:
        """The ``format`` marker and version a writer puts first in its payload."""
        head: dict[str, Any] = {"format": self.name}
        if self.version_key is not None:
            head[self.version_key] = self.versions[0] if version is None else int(version)
        return head

    def version_of(self, payload: dict) -> Any:
        if self.version_key is None:
            return self.versions[0]
        return payload.get(self.version_key, self.unversioned)


def _creation_mode() -> int:
    """The mode ``open(path, "w")`` would give a new file (0o666 less the umask), read without
    changing the umask (``os.umask`` would, for a moment, in every thread)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o644


def atomic_write(path: str | Path, fill: Callable[[IO[bytes]], object], *,
                 temp: str | None = None, fsync: bool = True) -> Path:
    """Write a file all at once or not at all; returns ``path``.

    ``fill(handle)`` writes the content into a temporary file in the same folder (created with
    its parents), which is flushed, fsynced and renamed over ``path`` (``os.replace``, atomic on
    one file system). If ``fill`` or any step raises, the temporary file is removed and
    ``path`` is left as it was. The new file gets the mode a plain ``open`` would give it.

    ``temp``: a fixed name for the temporary file (default: a unique one), so a resumable
    writer finds what a killed run left (the shard store's ``chunk-N.pt.partial``).
    ``fsync`` False skips the fsyncs: a killed process loses no written pages, only an OS
    crash may (for files whose checksum catches that, and that are redone then).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if temp is None:
        handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed below, also on failure)
            "wb", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False)
    else:
        handle = open(path.with_name(temp), "wb")  # noqa: SIM115 (closed below)
    tmp = Path(handle.name)
    try:
        with handle:
            fill(handle)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        os.chmod(tmp, _creation_mode())  # NamedTemporaryFile creates 0o600
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        _fsync_folder(path.parent)
    return path


def _fsync_folder(folder: Path) -> None:
    """Make the rename durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_payload(path: str | Path, payload: dict[str, Any]) -> Path:
    """``torch.save`` a payload dict atomically (see :func:`atomic_write`)."""
    import torch

    return atomic_write(path, lambda handle: torch.save(payload, handle))


def size_limit_message(path: Path, size: int, limit: int, fmt: FileFormat) -> str:
    return (f"{path.name} is too large for a {fmt.noun} file ({size / _MB:.1f} MB, the limit is "
            f"{limit / _MB:.0f} MB); check that this is the file written by {fmt.command}")


def load_payload(path: str | Path, fmt: FileFormat, *, max_bytes: int | None = None,
                 command: str | None = None) -> dict[str, Any]:
    """Read a payload file of format ``fmt`` and check its marker and version.

    ``max_bytes`` refuses a larger file before ``torch.load`` reads any of it (user files on a
    served app). ``command`` overrides ``fmt.command`` in messages (e.g. naming the model).
    Raises ``FileNotFoundError`` for a missing file and ``fmt.error`` for everything else.
    """
    import torch

    path = Path(path)
    fix = f"regenerate it with {command or fmt.command}"
    if not path.is_file():
        raise FileNotFoundError(f"no {fmt.what} at {path}; create one with "
                                f"{command or fmt.command}")
    size = path.stat().st_size
    if max_bytes is not None and size > max_bytes:
        shown = fmt if command is None else replace(fmt, command=command)
        raise fmt.error(size_limit_message(path, size, max_bytes, shown))
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for a bad zip/pickle
        # torch's own text (zip internals, unpickler hints) and the folder help nobody.
        raise fmt.error(f"{path.name} is corrupt or truncated: it is not a readable "
                        f"{fmt.what}; {fix}") from error
    return check_payload(payload, fmt, path, command=command)


def check_payload(payload: object, fmt: FileFormat, path: str | Path, *,
                  command: str | None = None) -> dict[str, Any]:
    """``payload`` when it carries ``fmt``'s marker and a readable version, else ``fmt.error``
    (``path`` names it; for payloads read from bytes, e.g. a shard chunk)."""
    fix = f"regenerate it with {command or fmt.command}"
    if not isinstance(payload, dict) or payload.get("format") != fmt.name:
        raise fmt.error(f"{path} is not a {fmt.what} (no '{fmt.name}' marker); {fix}")
    version = fmt.version_of(payload)
    if version not in fmt.versions:
        raise fmt.error(f"{path} has {fmt.noun} format version {version!r}, but this version "
                        f"of sparsefinder reads versions {fmt.versions}; {fix}")
    return payload


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes, read in blocks."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
