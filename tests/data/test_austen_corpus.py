"""tools/austen_corpus.py reads R lazy-load data (the janeaustenr package) without R."""

from __future__ import annotations

import importlib.util
import struct
import zlib
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "austen_corpus.py"
spec = importlib.util.spec_from_file_location("austen_corpus", TOOL)
austen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(austen)


def _serialized(strings: list[str | None]) -> bytes:
    """An R character vector as ``serialize(x, NULL, version = 3)`` writes it (XDR)."""
    out = b"X\n" + struct.pack(">iii", 3, 0x040201, 0x030500)
    out += struct.pack(">i", 5) + b"UTF-8" + struct.pack(">ii", 16, len(strings))
    for s in strings:
        if s is None:
            out += struct.pack(">ii", 9, -1)
        else:
            data = s.encode()
            out += struct.pack(">ii", 0x40009, len(data)) + data
    return out


def _record(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + zlib.compress(payload)


def test_reads_each_novel_and_joins_its_paragraphs(tmp_path):
    novel = ["CHAPTER I", "", "It was a _truth_ universally", "acknowledged, of course.",
             None, "Short.", "", "Another long enough paragraph here."]
    other = ["Second novel opens", "with two lines."]
    rdb = tmp_path / "Rdata.rdb"
    not_text = b"X\n" + struct.pack(">iii", 2, 0, 0) + struct.pack(">ii", 14, 0)  # a number
    rdb.write_bytes(_record(_serialized(novel)) + _record(not_text)
                    + _record(_serialized(other)))
    out = tmp_path / "austen.txt"
    assert austen.main([str(rdb), "--out", str(out), "--min-words", "3"]) == 0
    assert out.read_text().split("\n\n") == [
        "It was a truth universally acknowledged, of course.",
        "Another long enough paragraph here.", "Second novel opens with two lines.\n"]
    assert austen.main([str(rdb), "--out", str(out), "--min-words", "3",
                        "--max-passages", "2"]) == 0
    assert out.read_text().count("\n\n") == 1
