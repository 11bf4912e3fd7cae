"""sparsefinder.files: atomic writes, one .pt loader, one error base class for every file."""

from __future__ import annotations

import stat

import pytest
import torch

from sparsefinder import files
from sparsefinder.bundle import BundleError
from sparsefinder.calibration.table import CalibrationError, CalibrationTable
from sparsefinder.data.records_io import RecordsFileError, load_records, save_records
from sparsefinder.files import (
    FileFormat,
    SparsefinderFileError,
    atomic_write,
    load_payload,
    save_payload,
)
from sparsefinder.models.adapter_file import AdapterError, read_adapter, save_adapter
from sparsefinder.projections.blocks import load_block_projections
from sparsefinder.projections.hash_code_table import HashCodesError, HashCodeTable
from sparsefinder.projections.heads import HeadProjections, ProjectionsError
from sparsefinder.projections.key_codebooks import CodebooksError, KeyCodebooks

ERRORS = (ProjectionsError, CalibrationError, CodebooksError, HashCodesError, AdapterError,
          RecordsFileError, BundleError)
TOY = FileFormat("toy-format", "toy file", "toy", "`make toy`", versions=(1, 2))


def _projections() -> HeadProjections:
    return HeadProjections(weight=torch.randn(1, 2, 2, 4), bias=torch.zeros(1, 2, 2),
                           model_id="m", alpha=1.5)


def _writers() -> dict:
    """Every file writer, as ``name: write(path)``."""
    lora = {"base_model.model.q.lora_A.weight": torch.ones(2, 4),
            "base_model.model.q.lora_B.weight": torch.ones(4, 2)}
    return {
        "projections": lambda p: _projections().save(p),
        "calibration": lambda p: CalibrationTable(
            model_id="m", projections_sha256="0" * 64, targets=[0.9],
            params={"distance:budget": torch.ones(1, 1, 2)}).save(p),
        "key codebooks": lambda p: KeyCodebooks(
            model_id="m", alpha=1.5, centroids={2: torch.zeros(1, 2, 2, 4)}).save(p),
        "hash codes": lambda p: HashCodeTable(
            model_id="m", alpha=1.5, maps=[(torch.zeros(2, 4, 3), torch.zeros(2, 4, 3))]).save(p),
        "records": lambda p: save_records([], p, {"model_id": "m"}),
        "adapter": lambda p: save_adapter(p, lora, {"base_model": "m", "rank": 2}),
    }


#: Every reader, as ``name: read(path)`` (the block projections' loader included).
READERS = {
    "projections": HeadProjections.load,
    "block projections": load_block_projections,
    "calibration": CalibrationTable.load,
    "key codebooks": KeyCodebooks.load,
    "hash codes": HashCodeTable.load,
    "records": load_records,
    "adapter": read_adapter,
}
#: What each reader's message says to run.
COMMANDS = {"projections": "sparsefinder train", "block projections": "sparsefinder train",
            "calibration": "sparsefinder calibrate", "key codebooks": "fit-codebooks",
            "hash codes": "fit-hash-codes", "records": "sparsefinder extract",
            "adapter": "make assets-adapter"}


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e.__name__)
def test_one_base_class_catches_every_file_error(error) -> None:
    assert issubclass(error, SparsefinderFileError) and issubclass(error, ValueError)
    with pytest.raises(SparsefinderFileError):
        raise error("x.pt is damaged")


@pytest.mark.parametrize("kind", list(READERS))
@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_a_damaged_file_is_one_clear_error(kind, damage, tmp_path) -> None:
    good = tmp_path / "good.bin"
    _writers()["projections" if kind == "block projections" else kind](good)
    bad = tmp_path / "bad.bin"
    data = {"garbage": b"not a file of ours", "truncated": good.read_bytes()[:120],
            "empty": b""}[damage]
    bad.write_bytes(data)
    with pytest.raises(SparsefinderFileError) as info:
        READERS[kind](bad)
    message = str(info.value)
    assert "bad.bin" in message and "corrupt or truncated" in message, message
    assert COMMANDS[kind] in message, message
    assert "PytorchStreamReader" not in message and "Traceback" not in message


@pytest.mark.parametrize("kind", list(_writers()))
def test_every_writer_round_trips_and_is_atomic(kind, tmp_path, monkeypatch) -> None:
    path = tmp_path / "sub" / "file.bin"
    _writers()[kind](path)
    reader = READERS[kind]
    assert reader(path) is not None
    before = path.read_bytes()

    def disk_failure(fd: int) -> None:  # the content is written, the flush to disk fails
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", disk_failure)
    with pytest.raises(OSError, match="No space left"):
        _writers()[kind](path)
    assert path.read_bytes() == before  # the old file is untouched
    with pytest.raises(OSError):
        _writers()[kind](tmp_path / "new.bin")
    assert sorted(p.name for p in path.parent.iterdir()) == ["file.bin"]  # no temporary left
    assert not (tmp_path / "new.bin").exists()


def test_a_write_failing_midway_leaves_no_partial_file(tmp_path, monkeypatch) -> None:
    path = tmp_path / "p.pt"

    def half_then_fail(payload, handle) -> None:
        handle.write(b"PK\x03\x04 half of a zip")
        raise RuntimeError("killed midway")

    monkeypatch.setattr(torch, "save", half_then_fail)
    with pytest.raises(RuntimeError, match="killed midway"):
        _projections().save(path)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    _projections().save(path)
    monkeypatch.setattr(torch, "save", half_then_fail)
    with pytest.raises(RuntimeError):
        _projections().save(path)
    assert HeadProjections.load(path).model_id == "m"  # still the whole previous file
    assert [p.name for p in tmp_path.iterdir()] == ["p.pt"]


def test_atomic_write_gives_the_usual_file_mode(tmp_path) -> None:
    path = atomic_write(tmp_path / "a.txt", lambda handle: handle.write(b"abc"))
    plain = tmp_path / "plain.txt"
    plain.write_bytes(b"abc")
    assert path.read_bytes() == b"abc"
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)


def test_load_payload_checks_size_first_then_marker_and_version(tmp_path, monkeypatch) -> None:
    path = save_payload(tmp_path / "t.pt", {**TOY.header(2), "x": torch.ones(3)})
    assert load_payload(path, TOY)["format_version"] == 2
    size = path.stat().st_size
    assert load_payload(path, TOY, max_bytes=size)["x"].sum() == 3

    def never(*args, **kwargs):
        raise AssertionError("torch.load must not read a file over the cap")

    with monkeypatch.context() as m:
        m.setattr(torch, "load", never)
        with pytest.raises(SparsefinderFileError, match=r"t.pt is too large for a toy file .*"
                                                         r"`make toy`"):
            load_payload(path, TOY, max_bytes=size - 1)
    save_payload(path, {**TOY.header(), "format_version": 7})
    with pytest.raises(SparsefinderFileError, match=r"toy format version 7, but this version "
                                                     r"of sparsefinder reads versions \(1, 2\)"):
        load_payload(path, TOY)
    save_payload(path, {"format": "other"})
    with pytest.raises(SparsefinderFileError, match="is not a toy file .no 'toy-format' marker"):
        load_payload(path, TOY)
    with pytest.raises(FileNotFoundError, match="no toy file at .*missing.pt; create one with"):
        load_payload(tmp_path / "missing.pt", TOY)


def test_files_written_before_a_version_field_still_read(tmp_path) -> None:
    """Calibration tables had no version: they read as version 1; new ones carry it."""
    path = tmp_path / "calibration.pt"
    _writers()["calibration"](path)
    payload = torch.load(path, weights_only=True)
    assert payload["format_version"] == 1
    del payload["format_version"]
    torch.save(payload, path)
    assert CalibrationTable.load(path).targets == [0.9]


def test_the_payload_layout_on_disk_is_unchanged(tmp_path) -> None:
    """Readers of older versions read the new files: same markers and version fields."""
    expected = {"projections": ("sparsefinder-projections", "format_version", 1),
                "key codebooks": ("sparsefinder-key-codebooks", "format_version", 1),
                "hash codes": ("sparsefinder-hash-codes/1", None, None),
                "records": ("sparsefinder-records", "version", 1)}
    for kind, (marker, key, version) in expected.items():
        path = _writers()[kind](tmp_path / f"{kind}.pt")
        payload = torch.load(path, weights_only=True)
        assert payload["format"] == marker
        if key is not None:
            assert payload[key] == version


def test_torch_load_never_runs_code(tmp_path) -> None:
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "evil.pt"
    torch.save({"format": TOY.name, "format_version": 1, "x": Evil()}, path)
    with pytest.raises(SparsefinderFileError, match="evil.pt is corrupt or truncated"):
        load_payload(path, TOY)


def test_size_message_for_projections_keeps_its_words(tmp_path) -> None:
    path = _projections().save(tmp_path / "big.pt")
    with pytest.raises(ProjectionsError, match=r"big.pt is too large for a projections file "
                                               r".*sparsefinder train"):
        HeadProjections.load(path, max_bytes=10)


def test_every_file_error_is_the_projects_file_error() -> None:
    """One base for "this file cannot be used" (the app and CLI catch it once)."""
    from sparsefinder.analysis.atlas_io import AtlasFileError
    from sparsefinder.data.shard_files import ShardsError
    from sparsefinder.files import SparsefinderFileError

    assert issubclass(AtlasFileError, SparsefinderFileError)
    assert issubclass(ShardsError, SparsefinderFileError)


def test_a_fixed_temporary_name_and_no_fsync(tmp_path, monkeypatch) -> None:
    """``temp``: the temporary file has that name while ``fill`` writes (a resumable writer
    finds it after a kill) and is gone after; ``fsync`` False never calls fsync."""
    from sparsefinder.files import atomic_write

    seen = []
    synced = []
    monkeypatch.setattr(files.os, "fsync", lambda fd: synced.append(fd))
    path = tmp_path / "chunk.pt"

    def fill(handle) -> None:
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        handle.write(b"data")

    atomic_write(path, fill, temp="chunk.pt.partial", fsync=False)
    assert seen == [["chunk.pt.partial"]] and synced == []
    assert [p.name for p in tmp_path.iterdir()] == ["chunk.pt"] and path.read_bytes() == b"data"
    atomic_write(path, lambda handle: handle.write(b"more"), temp="chunk.pt.partial")
    assert synced and path.read_bytes() == b"more"
