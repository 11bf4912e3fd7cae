"""The structural masks every layer shares: the causal triangle and the window band.

One convention everywhere (attention, gold graphs, metrics, predictors, projection training):
query i of n is aligned with key ``i + (m - n)`` of m, so keys may include a prefix (a
decoder's cache). With that alignment

- the causal mask keeps key j for query i iff ``j <= i + (m - n)``: for ``n == m`` the lower
  triangle with the diagonal, ``n(n+1)/2`` pairs;
- the window band of size w keeps ``|i + (m - n) - j| <= w // 2``;
- a decoder's *sliding-window* layer (Mistral, Qwen2, Gemma local layers) of window W keeps
  key j iff ``0 <= i + (m - n) - j < W`` (transformers' ``sliding_window_overlay``), i.e. the
  query and its W - 1 predecessors;
- an encoder's *bidirectional* sliding-window layer (ModernBERT's local layers) of window W
  keeps key j iff ``|i + (m - n) - j| < W``: W - 1 keys on each side and the query itself.
  W is the number transformers hands the attention function (flash attention's
  ``window_size = (W - 1, W - 1)``): ModernBERT with ``local_attention=128`` passes W = 65,
  i.e. ±64. Whether a window is causal or bidirectional follows the layer's ``causal`` flag
  (a causal model's window looks back, a bidirectional model's both ways).

Masks are cached (a slider move rebuilds the same ones for every layer); the cached tensors
are read-only by convention, so the public functions return them only where documented.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor


class RestrictionWarning(UserWarning):
    """Some query rows of a predicted graph had no allowed key; their diagonal was kept so
    entmax stays defined (raised by the dense and the block-sparse restricted paths)."""

def _device(device: torch.device | str | None) -> torch.device:
    return torch.device(device or "cpu")


@lru_cache(maxsize=64)
def _causal(n: int, m: int, device: torch.device) -> Tensor:
    return torch.ones(n, m, dtype=torch.bool, device=device).tril(diagonal=m - n)


def causal_mask(n: int, m: int, device: torch.device | str | None = None) -> Tensor:
    """Bool (n, m), True where key j is not in the future of query i (a fresh tensor)."""
    return _causal(n, m, _device(device)).clone()


def shared_causal_mask(n: int, m: int, device: torch.device | str | None = None) -> Tensor:
    """Like :func:`causal_mask` but the cached tensor itself: never modify it in place."""
    return _causal(n, m, _device(device))


def apply_causal(mask: Tensor, causal: bool) -> Tensor:
    """``mask`` (..., n, m) with the future cut off when ``causal`` (a new tensor then)."""
    if not causal:
        return mask
    n, m = mask.shape[-2:]
    return mask & _causal(n, m, mask.device)


def allowed_per_row(n: int, m: int, *, causal: bool,
                    device: torch.device | str | None = None) -> Tensor:
    """int64 (n,): how many keys each query may see (m, or its non-future keys)."""
    if not causal:
        return torch.full((n,), m, dtype=torch.int64, device=device)
    return (torch.arange(n, dtype=torch.int64, device=device) + (m - n) + 1).clamp(0, m)


def allowed_key_range(n: int, m: int, *, causal: bool, sliding_window: int | None = None,
                      device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """int64 (n,) first allowed key and (n,) number of allowed keys of each query row.

    Every layer's allowed keys form one contiguous run per row: all ``m`` keys; the
    non-future ones (causal); or the last ``sliding_window`` of those (a local layer: keys
    ``0 <= i + (m - n) - j < window``, as :func:`sliding_window_mask`). Samplers draw from
    this run, so a local layer's negatives and calibration pairs are keys it can attend to.
    A bidirectional local layer (``causal=False``) allows keys ``|i + (m - n) - j| < window``.
    """
    if sliding_window:
        position = torch.arange(n, dtype=torch.int64, device=device) + (m - n)
        reach = int(sliding_window)
        end = (position + (1 if causal else reach)).clamp(0, m)
        first = (position - reach + 1).clamp(0, m)
        return first, (end - first).clamp(min=0)
    count = allowed_per_row(n, m, causal=causal, device=device)
    return torch.zeros_like(count), count


def hidden_offsets(ahead: Tensor, *, causal: bool, sliding_window: int | None = None) -> Tensor:
    """bool like ``ahead`` (a key's position less its query's, ``j − (i + m − n)``): True
    where the layer hides the key — ahead of the query (causal), or ``sliding_window`` or
    more away (a local layer, as :func:`allowed_key_range`). For gathered keys, where a
    query's keys are not a row of an (n, m) mask."""
    hidden = ahead > 0 if causal else torch.zeros(ahead.shape, dtype=torch.bool,
                                                  device=ahead.device)
    if sliding_window:
        hidden |= (ahead <= -sliding_window) | (ahead >= sliding_window)
    return hidden


def n_allowed_pairs(n: int, m: int, *, causal: bool = False,
                    sliding_window: int | None = None) -> int:
    """How many (query, key) pairs exist: ``n·m``, or ``n(n+1)/2`` causal with ``n == m``, or
    those within a local layer's window (:func:`allowed_key_range`), without an (n, m) mask.

    The denominator of sparsity (paper Eq. 5).
    """
    if sliding_window:
        return int(allowed_key_range(n, m, causal=causal, sliding_window=sliding_window)[1].sum())
    return int(allowed_per_row(n, m, causal=causal).sum()) if causal else n * m


@lru_cache(maxsize=64)
def _band(n: int, m: int, size: int, device: torch.device) -> Tensor:
    if size == 0:
        return torch.zeros(n, m, dtype=torch.bool, device=device)
    half, offset = size // 2, m - n
    ones = torch.ones(n, m, dtype=torch.bool, device=device)
    return ones.tril(diagonal=offset + half).triu(diagonal=offset - half)


def window_band(n: int, m: int, size: int, device: torch.device | str | None = None) -> Tensor:
    """Bool (n, m): True where ``|i + (m - n) - j| <= size // 2``; all False for size 0.

    A fresh tensor (a copy of a cached band), so callers may modify it.
    """
    return _band(n, m, max(int(size), 0), _device(device)).clone()


@lru_cache(maxsize=64)
def _sliding(n: int, m: int, window: int, causal: bool, device: torch.device) -> Tensor:
    if causal:
        return _causal(n, m, device).triu(diagonal=m - n - window + 1)
    ones = torch.ones(n, m, dtype=torch.bool, device=device)
    return ones.tril(diagonal=m - n + window - 1).triu(diagonal=m - n - window + 1)


def sliding_window_mask(n: int, m: int, window: int,
                        device: torch.device | str | None = None, *,
                        causal: bool = True) -> Tensor:
    """Bool (n, m): a sliding-window layer's allowed pairs (cached: never modify it).

    Causal: ``0 <= i + (m - n) - j < window``; bidirectional (``causal=False``, ModernBERT's
    local layers): ``|i + (m - n) - j| < window``.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"sliding window must be an integer >= 1, got {window!r}")
    return _sliding(n, m, window, bool(causal), _device(device))


def layer_allowed(n: int, m: int, *, causal: bool, sliding_window: int | None = None,
                  device: torch.device | str | None = None) -> Tensor | None:
    """The (n, m) pairs a layer may attend to, or None when every pair is allowed.

    Why one function: gold extraction, predictions and the sparsity denominator must agree on
    what "allowed" means, or a sliding-window layer's predictions would be credited (or
    charged) for pairs the model can never attend to.
    """
    if sliding_window:
        return sliding_window_mask(n, m, int(sliding_window), device, causal=causal)
    if causal:
        return shared_causal_mask(n, m, device)
    return None
