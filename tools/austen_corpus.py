"""Write Jane Austen's six novels as a plain-text training corpus for ``sparsefinder adapt``.

The text comes from the Debian package ``r-cran-janeaustenr`` (CRAN's janeaustenr, MIT
licence; the novels are public domain, from Project Gutenberg). R is not needed: the package
is unpacked without installing it and its R lazy-load data file is read here directly.

    apt-get download r-cran-janeaustenr          # or: apt-get install r-cran-janeaustenr
    PYTHONPATH=$PWD .venv/bin/python tools/austen_corpus.py r-cran-janeaustenr_*.deb \\
        --out build/austen.txt

The output holds one paragraph a block (blank-line separated; chapter headings and paragraphs
under ``--min-words`` dropped), the format ``--corpus`` reads (its split is a stable hash).
"""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

INSTALLED = Path("/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb")
IN_PACKAGE = "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"
_STRSXP, _CHARSXP = 16, 9


def _records(blob: bytes) -> list[bytes]:
    """The decompressed records of an R lazy-load database (.rdb): each is a 4-byte
    big-endian length and a zlib stream (R's default ``--data-compress``)."""
    out, pos = [], 0
    while pos < len(blob):
        size = struct.unpack(">I", blob[pos:pos + 4])[0]
        unzip = zlib.decompressobj()
        data = unzip.decompress(blob[pos + 4:])
        if len(data) != size:
            raise ValueError(f"unexpected record at byte {pos} (not zlib-compressed R data?)")
        out.append(data)
        pos = len(blob) - len(unzip.unused_data)
    return out


def character_vector(record: bytes) -> list[str] | None:
    """The strings of a serialized R character vector (XDR format), or None for any other
    object; NA elements become empty strings."""
    if record[:2] != b"X\n":
        return None
    version = struct.unpack(">i", record[2:6])[0]
    pos = 14
    if version == 3:
        pos += 4 + struct.unpack(">i", record[pos:pos + 4])[0]  # native encoding name
    flags, length = struct.unpack(">ii", record[pos:pos + 8])
    if flags & 0xFF != _STRSXP:
        return None
    pos += 8
    strings = []
    for _ in range(length):
        flags, size = struct.unpack(">ii", record[pos:pos + 8])
        pos += 8
        if flags & 0xFF != _CHARSXP:
            raise ValueError("malformed character vector")
        if size < 0:
            strings.append("")
            continue
        strings.append(record[pos:pos + size].decode("utf-8", "replace"))
        pos += size
    return strings


def paragraphs(lines: list[str], min_words: int) -> list[str]:
    """Join the lines of a novel into paragraphs (blank lines separate them)."""
    out, current = [], []
    for line in [*lines, ""]:
        if line.strip():
            current.append(line.strip())
            continue
        text = " ".join(current).replace("_", "")
        current = []
        if len(text.split()) >= min_words:
            out.append(text)
    return out


def read_rdb(source: Path) -> bytes:
    if source.suffix == ".deb":
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(["dpkg-deb", "-x", str(source), tmp], check=True)
            return (Path(tmp) / IN_PACKAGE).read_bytes()
    if source.is_dir():
        source = source / IN_PACKAGE if (source / IN_PACKAGE).exists() else source / "Rdata.rdb"
    return source.read_bytes()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", nargs="?", type=Path, default=INSTALLED,
                        help="the .deb, the unpacked folder, or Rdata.rdb (default: installed)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--min-words", type=int, default=40,
                        help="drop paragraphs shorter than this (headings, one-line replies)")
    parser.add_argument("--max-passages", type=int, default=None,
                        help="keep at most N paragraphs, evenly spaced through the novels")
    args = parser.parse_args(argv)
    novels = [v for v in map(character_vector, _records(read_rdb(args.source))) if v]
    passages = [p for novel in novels for p in paragraphs(novel, args.min_words)]
    if args.max_passages is not None and len(passages) > args.max_passages:
        step = len(passages) / args.max_passages
        passages = [passages[int(i * step)] for i in range(args.max_passages)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n\n".join(passages) + "\n", encoding="utf-8")
    words = sum(len(p.split()) for p in passages)
    print(f"wrote {args.out}: {len(novels)} novels, {len(passages)} paragraphs, {words} words",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
