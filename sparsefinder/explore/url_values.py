"""Parsers of single URL values of the view state: each returns the value or raises
ValueError naming what was expected (:func:`~sparsefinder.explore.state.parse_view_state`
turns that into one problem message per parameter)."""

from __future__ import annotations

import math
import re
from typing import Any

from sparsefinder.methods.param import TARGET_SPARSITY
from sparsefinder.methods.spec import GLOBAL_CHOICES

#: The α range the app offers (1 = softmax, 1.5 = entmax15, 2 = sparsemax).
ALPHA_RANGE = (1.0, 4.0)
MAX_MODEL_NAME = 300


def parse_int(text: str, low: int, high: int | None) -> int:
    value = int(float(text))
    if value < low or (high is not None and value > high):
        raise ValueError(f"{value} is outside [{low}, {high if high is not None else '∞'}]")
    return value


def bad(expected: str) -> Any:
    raise ValueError(f"expected {expected}")


def parse_target(text: str) -> float:
    """The link's ``target``: checked by the one declaration of the target's range."""
    value = float(text)
    try:
        TARGET_SPARSITY.check(value)
    except ValueError:
        raise ValueError(f"expected a target sparsity: {TARGET_SPARSITY.describe()}") from None
    return value


def parse_model(text: str) -> str:
    if not text or len(text) > MAX_MODEL_NAME or any(ord(c) < 32 for c in text):
        raise ValueError(f"expected a model name or path of 1–{MAX_MODEL_NAME} characters")
    return text


def parse_alpha(text: str) -> float:
    value = float(text)
    low, high = ALPHA_RANGE
    if not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"expected a number in [{low:g}, {high:g}]")
    return value


def parse_number(text: str, low: float, high: float | None) -> float:
    value = float(text)
    if not math.isfinite(value) or value < low or (high is not None and value > high):
        raise ValueError(f"expected a finite number >= {low:g}" if high is None
                         else f"expected a number in [{low:g}, {high:g}]")
    return value


def parse_global(text: str) -> tuple[str, ...]:
    parts = [p for p in (s.strip() for s in text.split(",")) if p and p != "none"]
    unknown = [p for p in parts if p not in GLOBAL_CHOICES]
    if unknown:
        raise ValueError(f"expected a comma list of {GLOBAL_CHOICES} or 'none'")
    return tuple(c for c in GLOBAL_CHOICES if c in parts)


def parse_pairs(text: str) -> tuple[tuple[int, int], ...]:
    """``"6-1,12-4"`` (pronoun-antecedent word indices) → pairs; ``none`` = no pair."""
    pairs: list[tuple[int, int]] = []
    for item in (p.strip() for p in text.split(",")):
        match = re.fullmatch(r"(\d{1,5})-(\d{1,5})", item)
        if text != "none" and (match is None or match[1] == match[2]):
            raise ValueError("expected pronoun-antecedent word indices such as 6-1,12-4 (two "
                             "different words each), or none")
        if match is not None and (pair := (int(match[1]), int(match[2]))) not in pairs:
            pairs.append(pair)
    return tuple(pairs)


def parse_head(text: str) -> tuple[int, int]:
    """``"L3H1"`` (layer 3, head 1; 0-based, as the page shows it) → (3, 1)."""
    match = re.fullmatch(r"[Ll](\d{1,4})[Hh](\d{1,4})", text)
    if match is None:
        raise ValueError("expected a head as L<layer>H<head>, such as L3H1")
    return int(match[1]), int(match[2])
