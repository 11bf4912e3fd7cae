"""Write the Reuters news articles that R's ``tm`` package ships as a training corpus for
``sparsefinder adapt``.

The text comes from the Debian package ``r-cran-tm`` (GPL-3): its ``texts/acq`` (50) and
``texts/crude`` (20) folders hold Reuters-21578 newswire articles from 1987 (Reuters and
Carnegie Group allow their free distribution for research). R is not needed: the package is
unpacked without installing it and the articles' XML is read here.

    apt-get download r-cran-tm                    # or: apt-get install r-cran-tm
    PYTHONPATH=$PWD .venv/bin/python tools/news_corpus.py r-cran-tm_*.deb --out build/news.txt

The output holds one article body a block (blank-line separated, whitespace joined; the
headline and dateline left out), the format ``--corpus`` reads (its split is a stable hash;
long articles are chunked by the reader).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

INSTALLED = Path("/usr/lib/R/site-library/tm/texts")
IN_PACKAGE = "usr/lib/R/site-library/tm/texts"
FOLDERS = ("acq", "crude")


def article_body(xml_text: str) -> str:
    """The body of one Reuters-21578 article, on one line ("" when it has none); the
    trailing " Reuter" signature is dropped."""
    body = ET.fromstring(xml_text).findtext("TEXT/BODY") or ""
    words = body.split()
    if words and words[-1] == "Reuter":
        words = words[:-1]
    return " ".join(words)


def articles(texts: Path, min_words: int = 40) -> list[str]:
    """Every article body of ``texts/acq`` and ``texts/crude`` with at least ``min_words``
    words, in file order."""
    out = []
    for folder in FOLDERS:
        files = sorted((texts / folder).glob("*.xml"))
        if not files:
            raise SystemExit(f"no articles in {texts / folder}: is this the r-cran-tm package?")
        for path in files:
            body = article_body(path.read_text(encoding="utf-8"))
            if len(body.split()) >= min_words:
                out.append(body)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", nargs="?", type=Path,
                        help=f"r-cran-tm .deb, or its texts/ folder (default: the installed "
                             f"{INSTALLED})")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--min-words", type=int, default=40)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        texts = INSTALLED
        if args.source is not None and args.source.is_dir():
            texts = args.source
        elif args.source is not None:
            subprocess.run(["dpkg-deb", "-x", str(args.source), tmp], check=True)
            texts = Path(tmp) / IN_PACKAGE
        if not texts.is_dir():
            print(f"{texts} not found: give the r-cran-tm .deb (apt-get download r-cran-tm)",
                  file=sys.stderr)
            return 2
        bodies = articles(texts, args.min_words)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n\n".join(bodies) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(bodies)} articles, {sum(len(b.split()) for b in bodies)} words")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
