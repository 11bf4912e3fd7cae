"""Text corpora for exploring attention sparsity: user files, folders and a built-in default.

Sources
-------
* ``.txt`` file: one passage per blank-line-separated paragraph; newlines and whitespace runs
  inside a paragraph collapse to single spaces (hard-wrapped prose reads as one passage).
* ``.jsonl`` file: one JSON object per line with a string ``text`` field (whitespace collapsed the
  same way; blank lines and empty texts are skipped).
* folder: every ``*.txt`` / ``*.jsonl`` file below it, **recursively**, in sorted order of the
  relative path (so results do not depend on the file system); hidden files and folders (names
  starting with ``.``, e.g. ``.ipynb_checkpoints``) are skipped, as are other extensions.
* the string ``"default"``: the built-in corpus (below). Only the *string* means the built-in one;
  a ``Path("default")`` or ``"./default"`` is a path.

Built-in corpus
---------------
Every CPython install ships ``pydoc_data.topics`` (the English reference prose that ``help()``
shows), so the default corpus needs no download. Its paragraphs are cleaned: headings with
``****``/``====`` underlines, tables, grammar rules (``::=``), doctest (``>>>``) and indented
code blocks are dropped; only prose paragraphs of at least ``MIN_WORDS`` words are kept, and
duplicates are removed. The exact passages depend on the Python version (the docs change).

Splits
------
A passage goes to "validation" when the first 8 bytes of the SHA-256 of its UTF-8 text, read as
an integer, fall in the lowest ``VALIDATION_FRACTION`` (15 %) of the range, else to "train". The
split is a pure function of the text: stable across runs, machines and Python versions
(``hash()`` is salted per process, so it is not used), and the same for user corpora."""

from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from sparsefinder.data.chunking import chunk_passages

__all__ = [
    "CorpusError",
    "MIN_WORDS",
    "SPLITS",
    "VALIDATION_FRACTION",
    "corpus_texts",
    "default_corpus",
    "load_corpus",
    "load_texts",
    "split_of",
]


#: Fraction of passages (by hash) that go to the "validation" split.
VALIDATION_FRACTION = 0.15


#: Minimum length of a kept paragraph of the built-in corpus (shorter ones are titles, labels...).
MIN_WORDS = 40


#: Allowed values of ``split``.
SPLITS = ("train", "validation", "all")


#: Extensions read from a file or folder.
EXTENSIONS = (".txt", ".jsonl")


DEFAULT_SOURCE = "default"


_HASH_BUCKETS = 1 << 64


_VALIDATION_CUTOFF = int(VALIDATION_FRACTION * _HASH_BUCKETS)


_WS = re.compile(r"\s+")


_PARAGRAPH_BREAK = re.compile(r"\n[ \t\f\v]*\n")


class CorpusError(ValueError):
    """The corpus content cannot be used (bad encoding, bad JSONL, nothing left after cleaning)."""


def split_of(passage: str) -> str:
    """The split ("train" or "validation") a passage belongs to — a stable hash of its text."""
    digest = hashlib.sha256(passage.encode("utf-8")).digest()
    return "validation" if int.from_bytes(digest[:8], "big") < _VALIDATION_CUTOFF else "train"


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(map(repr, SPLITS))}")


def _select(passages: list[str], split: str, source: str) -> list[str]:
    """Keeps the passages of ``split``; an empty result is an error (nothing to train/evaluate)."""
    if split == "all":
        return list(passages)
    chosen = [p for p in passages if split_of(p) == split]
    if not chosen:
        raise CorpusError(
            f"the {split!r} split of {source} is empty ({len(passages)} passages in total, "
            f"~{VALIDATION_FRACTION:.0%} go to validation); add more passages or use split=None"
        )
    return chosen


# A line made only of markup characters: heading underlines (****, ====, ----), table borders.
_MARKUP_LINE = re.compile(r"^\s*[*=\-~^#+_|: ]{4,}\s*$")


_TABLE_ROW = re.compile(r"^\s*\|")


_DOCTEST = re.compile(r"^\s*(>>>|\.\.\.)(\s|$)")


_WORDLIKE = re.compile(r"[(\"'“‘]*[A-Za-z][\w'’\-]*[)\"'”’,.;:!?]*")


# Aligned columns (3+ spaces inside a line; prose has at most 2, after a full stop) or a comment.
_ALIGNED = re.compile(r"\S {3,}\S|^\s*#")


_BULLET = re.compile(r"^[*\-•] ")


# reST emphasis left in the text dump: *term*, **CPython implementation detail:**
_EMPHASIS = re.compile(r"(?<![\w*])\*{1,2}(?=\w)([^*]+?)(?<=[\w.:)])\*{1,2}(?![\w*])")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _is_prose(paragraph: str) -> bool:
    """True for a paragraph of running text (not a heading, table, grammar rule or code)."""
    lines = [line.rstrip() for line in paragraph.split("\n") if line.strip()]
    if not lines:
        return False
    if any(_MARKUP_LINE.match(x) or _TABLE_ROW.match(x) or _DOCTEST.match(x) for x in lines):
        return False
    if "::=" in paragraph or any(_ALIGNED.search(x) for x in lines):
        return False
    # Wrapped prose has one indentation after the first line (which may be a definition term,
    # a bullet or a footnote label); code blocks nest, so their indentation varies.
    if len({_indent(x) for x in lines[1:]}) > 1:
        return False
    words = _clean_default(paragraph).split()
    if len(words) < MIN_WORDS:
        return False
    return sum(1 for w in words if _WORDLIKE.fullmatch(w)) >= 0.7 * len(words)


def _clean_default(paragraph: str) -> str:
    """One line of text without emphasis asterisks or a leading bullet."""
    return _BULLET.sub("", _EMPHASIS.sub(r"\1", _WS.sub(" ", paragraph).strip()))


@lru_cache(maxsize=1)
def _default_passages() -> tuple[str, ...]:
    """All cleaned, deduplicated prose passages of ``pydoc_data.topics`` (sorted topic order)."""
    from pydoc_data.topics import topics

    seen: dict[str, None] = {}
    for name in sorted(topics):
        text = topics[name].replace("\r\n", "\n")
        for paragraph in _PARAGRAPH_BREAK.split(text):
            if _is_prose(paragraph):
                seen.setdefault(_clean_default(paragraph), None)
    if not seen:  # pragma: no cover - would mean a broken Python install
        raise CorpusError("the built-in corpus (pydoc_data.topics) has no prose passages")
    return tuple(seen)


def default_corpus(split: str = "train") -> list[str]:
    """Passages of the built-in corpus; ``split`` is "train", "validation" or "all"."""
    _check_split(split)
    return _select(list(_default_passages()), split, "the built-in corpus")


def _read_text(path: Path) -> str:
    """Reads UTF-8 (a BOM is accepted), turning OS/encoding errors into actionable messages."""
    try:
        data = path.read_bytes()
    except PermissionError as e:
        raise CorpusError(f"cannot read {path}: permission denied; check its permissions") from e
    except OSError as e:
        raise CorpusError(f"cannot read {path}: {e.strerror or e}") from e
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise CorpusError(
            f"{path}: invalid byte at offset {e.start}: expected UTF-8 text; re-save as UTF-8"
        ) from e
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _passages_from_txt(path: Path) -> list[str]:
    """One passage per blank-line-separated paragraph, internal whitespace collapsed."""
    paragraphs = (_WS.sub(" ", p).strip() for p in _PARAGRAPH_BREAK.split(_read_text(path)))
    return [p for p in paragraphs if p]


def _passages_from_jsonl(path: Path) -> list[str]:
    """The ``text`` field of every non-blank line; any bad line is an error naming it."""
    passages: list[str] = []
    for number, line in enumerate(_read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record: Any = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorpusError(
                f"{path}, line {number}: invalid JSON ({e.msg}); "
                'expected one object per line like {"text": "..."}'
            ) from e
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise CorpusError(
                f'{path}, line {number}: expected an object with a string "text" field, '
                f'like {{"text": "..."}}'
            )
        text = _WS.sub(" ", text).strip()
        if text:
            passages.append(text)
    return passages


def _passages_from_file(path: Path) -> list[str]:
    suffix = path.suffix.lower()
    if suffix == ".txt":
        return _passages_from_txt(path)
    if suffix == ".jsonl":
        return _passages_from_jsonl(path)
    raise CorpusError(
        f"unsupported file type {path.suffix or '(no extension)'!r} for {path}; "
        'use a .txt file (blank-line-separated paragraphs), a .jsonl file with a "text" field '
        "per line, or a folder of them"
    )


def _corpus_files(folder: Path) -> list[Path]:
    """Every .txt/.jsonl file below ``folder`` (recursive, hidden skipped), sorted by path."""
    files = [
        p
        for p in folder.rglob("*")
        if p.suffix.lower() in EXTENSIONS
        and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]
    if not files:
        raise CorpusError(
            f"no .txt or .jsonl files in folder {folder} (searched recursively); "
            "add some or point to a file"
        )
    return sorted(files, key=lambda p: p.relative_to(folder).as_posix())


def load_texts(source: str | Path) -> list[str]:
    """All passages of a .txt/.jsonl file, a folder of them, or ``"default"`` (built-in)."""
    if isinstance(source, str) and source == DEFAULT_SOURCE:
        return list(_default_passages())
    path = Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"corpus {str(source)!r} not found; pass an existing .txt/.jsonl file or folder, "
            f'or "{DEFAULT_SOURCE}" for the built-in corpus'
        )
    if path.is_dir():
        passages = [p for f in _corpus_files(path) for p in _passages_from_file(f)]
    else:
        passages = _passages_from_file(path)
    if not passages:
        raise CorpusError(
            f"corpus {path} has no passages (only blank text); add paragraphs separated by blank "
            'lines (.txt) or lines like {"text": "..."} (.jsonl)'
        )
    return passages


def load_corpus(source: str | Path, split: str | None = None) -> list[str]:
    """Passages of ``source`` (see ``load_texts``), optionally restricted to one hash split.

    ``split=None`` (or "all") returns everything; "train"/"validation" apply the same stable
    hash split as the built-in corpus, so a user corpus can be divided without extra files.
    """
    if split is not None:
        _check_split(split)
    passages = load_texts(source)
    if split is None or split == "all":
        return passages
    name = "the built-in corpus" if source == DEFAULT_SOURCE else f"corpus {source}"
    return _select(passages, split, name)


def corpus_texts(
    source: str | Path,
    split: str | None,
    tokenizer: Any,
    max_tokens: int,
    max_passages: int | None = None,
) -> list[str]:
    """Texts ready for extraction: the passages of ``split`` (see :func:`load_corpus`), the
    first ``max_passages`` of them, chunked to ``max_tokens`` (:func:`chunk_passages`), so
    nothing is truncated by the model. The one way the CLI, the app and benchmarks read a
    corpus."""
    passages = load_corpus(source, None if split == "all" else split)
    if max_passages is not None:
        if max_passages < 1:
            raise ValueError(f"max_passages must be >= 1, got {max_passages}")
        passages = passages[:max_passages]
    return chunk_passages(passages, tokenizer, max_tokens)
