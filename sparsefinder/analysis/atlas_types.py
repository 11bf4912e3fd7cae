"""What a head does, in one word: its pattern type, from its atlas statistics.

Rules, first match wins (the thresholds are the constants below; they are documented in
``docs/atlas.md`` and tested on synthetic heads built to be each type):

1. ``dense`` — the layer uses softmax (α = 1), or no row of any text ever dropped a key
   (``not_full`` = 0): there is no sparsity pattern to name.
2. ``sink`` (first-token/sink) — at least :data:`DOMINANT` of the mass on the first token
   plus the last token (``[CLS]``/``[SEP]`` in BERT-like encoders, the no-op targets).
3. ``diagonal`` / ``previous`` / ``next`` — at least :data:`DOMINANT` of the mass on the
   token itself, the one before or the one after (the largest of the three).
4. ``local`` (block/local) — the mass stays within :data:`LOCAL_DISTANCE` tokens on average
   and at least :data:`CONTIGUOUS` of the rows keep one contiguous run of keys.
5. ``broad`` — rows keep at least :data:`BROAD_FRACTION` of their keys on average.
6. ``mixed`` — none of the above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

#: Share of the attention mass that makes a position a head's pattern.
DOMINANT = 0.5
#: Mean attended distance (tokens) below which a head is local...
LOCAL_DISTANCE = 3.0
#: ...when at least this share of its rows keep a contiguous run of keys.
CONTIGUOUS = 0.6
#: Mean share of keys per row from which a head is broad.
BROAD_FRACTION = 0.25

PATTERN_TYPES: tuple[str, ...] = ("dense", "sink", "diagonal", "previous", "next", "local",
                                  "broad", "mixed")
PATTERN_LABELS: dict[str, str] = {
    "dense": "dense (softmax)", "sink": "first-token/sink", "diagonal": "diagonal",
    "previous": "previous token", "next": "next token", "local": "block/local",
    "broad": "broad", "mixed": "mixed",
}


def pattern_types(stats: Mapping[str, Tensor],
                  dense_layers: Sequence[bool] | None = None) -> list[list[str]]:
    """The pattern type of every (layer, head) from :meth:`HeadSums.means` statistics.
    ``dense_layers``: layers known to be softmax (α = 1), dense whatever their numbers."""
    shape = stats["diagonal"].shape
    dense = stats["not_full"] <= 0
    if dense_layers is not None:
        dense = dense | torch.tensor(list(dense_layers), dtype=torch.bool)[:, None]
    sink = stats["first"] + stats["last"]
    positional = torch.stack([stats["diagonal"], stats["previous"], stats["next"]])
    best = positional.argmax(0)
    local = (stats["distance"] <= LOCAL_DISTANCE) & (stats["contiguous"] >= CONTIGUOUS)
    broad = stats["support_fraction"] >= BROAD_FRACTION
    names = ("diagonal", "previous", "next")
    out: list[list[str]] = []
    for layer in range(shape[0]):
        row = []
        for head in range(shape[1]):
            if dense[layer, head]:
                kind = "dense"
            elif sink[layer, head] >= DOMINANT:
                kind = "sink"
            elif positional[best[layer, head], layer, head] >= DOMINANT:
                kind = names[int(best[layer, head])]
            elif local[layer, head]:
                kind = "local"
            elif broad[layer, head]:
                kind = "broad"
            else:
                kind = "mixed"
            row.append(kind)
        out.append(row)
    return out
