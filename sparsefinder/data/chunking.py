"""Long passages cut into model-sized chunks on token boundaries, so nothing is silently
truncated: sentence ends first, then whitespace, with an optional overlap.
"""

from __future__ import annotations

from typing import Any

_CLOSERS = "\"')]’”»"


def _cut_points(
    text: str, offsets: list[tuple[int, int]], budget: int, stride: int
) -> list[tuple[int, int]]:
    """Character spans of chunks of ≤ ``budget`` tokens that together cover all of ``text``.

    A cut between tokens b-1 and b happens at the start of token b. It prefers, in order: a
    sentence end in the second half of the window, whitespace, a punctuation boundary, and
    only then a cut inside a word (a single "word" longer than the budget).
    """
    n = len(offsets)
    spans: list[tuple[int, int]] = []
    a, start = 0, 0
    while True:
        if n - a <= budget:
            spans.append((start, len(text)))
            return spans
        best: dict[int, int] = {}
        for b in range(a + budget, a, -1):
            prev_end, nxt = offsets[b - 1][1], offsets[b][0]
            if nxt <= offsets[a][0]:
                continue  # would leave the chunk empty (tokens sharing a character)
            gap = text[prev_end:nxt]  # what lies between the two tokens
            if any(ch.isspace() for ch in gap):
                before = text[max(0, prev_end - 4) : prev_end].rstrip(_CLOSERS)
                tier = 0 if before.endswith((".", "!", "?")) and b - a >= budget // 2 else 1
            elif gap or not (text[prev_end - 1 : prev_end].isalnum() and text[nxt].isalnum()):
                tier = 2  # punctuation boundary, or characters the tokenizer drops
            else:
                tier = 3  # inside a word
            best.setdefault(tier, b)
            if tier == 0 or (1 in best and b - a < budget // 2):
                break  # nothing better can come further left
        if not best:
            raise ValueError(f"cannot split text at token {a}: tokens share one character")
        b = best[min(best)]
        cut = offsets[b][0]
        spans.append((start, cut))
        if stride:
            # Overlap: restart `stride` tokens back, at a word start so no word is torn.
            nxt_a = b
            for c in range(max(a + 1, b - stride), b):
                if offsets[c][0] > offsets[c - 1][1] or not text[offsets[c][0]].isalnum():
                    nxt_a = c
                    break
            a, start = nxt_a, min(offsets[nxt_a][0], cut)
        else:
            a, start = b, cut


def chunk_passages(texts: list[str], tokenizer: Any, max_tokens: int, stride: int = 0) -> list[str]:
    """Splits passages longer than ``max_tokens`` so none is truncated by the model.

    ``max_tokens`` includes the special tokens the tokenizer adds ([CLS]/[SEP]), e.g.
    ``tokenizer.model_max_length``. Passages that fit are returned unchanged; longer ones are cut
    on token boundaries (preferring sentence ends, then whitespace) into consecutive chunks
    whose concatenation contains every non-whitespace character, in order. ``stride`` > 0 makes
    consecutive chunks overlap by about that many tokens. ``tokenizer`` must be a Hugging Face
    *fast* tokenizer (character offsets are needed).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError(
            "chunk_passages needs a Hugging Face *fast* tokenizer (for character offsets); "
            "load it with AutoTokenizer.from_pretrained(..., use_fast=True)"
        )
    budget = max_tokens - tokenizer.num_special_tokens_to_add(pair=False)
    if budget < 1:
        raise ValueError(
            f"max_tokens={max_tokens} leaves no room for text after the tokenizer's special "
            "tokens; use the model's maximum length (tokenizer.model_max_length)"
        )
    if not 0 <= stride < budget:
        raise ValueError(f"stride must be in [0, {budget}) for max_tokens={max_tokens}")
    # Segments in output order, each flagged when known to fit. Cut pieces are re-tokenized
    # once more: a piece starting inside a word can tokenize differently from the whole text.
    segments: list[tuple[str, bool]] = [(t, False) for t in texts]
    for _ in range(16):  # pieces strictly shrink, so this ends; the bound is only a safeguard
        todo = [text for text, fits in segments if not fits]
        if not todo:
            return [text for text, _ in segments]
        enc = tokenizer(  # verbose=False: no "longer than the maximum" warning, we split them
            todo, add_special_tokens=False, return_offsets_mapping=True, verbose=False
        )
        replacements: list[list[tuple[str, bool]]] = []
        for text, ids, offsets in zip(todo, enc["input_ids"], enc["offset_mapping"], strict=True):
            if len(ids) <= budget:
                replacements.append([(text, True)])
                continue
            spans = _cut_points(text, [(s, e) for s, e in offsets], budget, stride)
            replacements.append([(text[s:e].strip(), False) for s, e in spans])
        it = iter(replacements)
        segments = [seg for old in segments for seg in ([old] if old[1] else next(it))]
    raise ValueError(f"could not split passages into chunks of at most {max_tokens} tokens")


def chunk_spans(text: str, tokenizer: Any, max_tokens: int, stride: int = 0,
                offsets: list[tuple[int, int]] | None = None) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of ``text``'s model-sized chunks (one pass of the
    cuts :func:`chunk_passages` makes), in order, overlapping by about ``stride`` tokens; one
    span when the text fits. Where a chunk sits in the text is what a viewer of long texts
    needs; the chunks' own texts are ``text[start:end]``. ``offsets``: the text's token
    offsets (no special tokens) when the caller has them, so the text is not tokenized twice."""
    budget = max_tokens - tokenizer.num_special_tokens_to_add(pair=False)
    if budget < 1 or not 0 <= stride < budget:
        raise ValueError(f"max_tokens={max_tokens} with stride={stride} leaves no room for text")
    if offsets is None:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                        verbose=False)
        offsets = [(s, e) for s, e in enc["offset_mapping"]]
    if len(offsets) <= budget:
        return [(0, len(text))]
    return _cut_points(text, offsets, budget, stride)
