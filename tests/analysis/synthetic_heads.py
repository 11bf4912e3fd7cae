"""Records whose heads are built to be one pattern type each (the atlas tests' ground truth).

Tokens: ``[CLS]`` w1 … ``,`` … ``[SEP]``; one layer, one head per type in :data:`KINDS`.
"""

from __future__ import annotations

import torch

from sparsefinder.data.records import AttentionRecord, LayerGraph

KINDS = ("diagonal", "previous", "next", "sink", "local", "broad", "mixed")
#: Heads built to meet only one of ``local``'s two conditions (not in :data:`KINDS`).
HALF_LOCAL = ("near-scattered", "far-run")


def head_probs(kind: str, n: int) -> torch.Tensor:
    """(n, n) row-stochastic attention of one head built to be ``kind``."""
    eye = torch.eye(n)
    if kind == "diagonal":
        probs = 0.8 * eye
        probs[:, 0] += 0.2
    elif kind in {"previous", "next"}:
        shift = torch.diag(torch.ones(n - 1), -1 if kind == "previous" else 1)
        probs = 0.9 * shift + 0.1 * eye
        edge = 0 if kind == "previous" else n - 1
        probs[edge] = eye[edge]  # the first (last) row has no previous (next) token
    elif kind == "sink":
        probs = 0.3 * eye
        probs[:, 0] += 0.7
    elif kind == "local":
        rows, cols = torch.arange(n)[:, None], torch.arange(n)[None, :]
        probs = ((rows - cols).abs() <= 2).float()
    elif kind == "broad":
        probs = torch.ones(n, n)
        probs[torch.arange(n), (torch.arange(n) + n // 2) % n] = 0.0  # one key dropped per row
    elif kind == "near-scattered":  # local distance (2), never a contiguous run
        rows = torch.arange(n)
        probs = torch.zeros(n, n)
        probs[rows, (rows - 2).clamp(min=0)] = 1.0
        probs[rows, (rows + 2).clamp(max=n - 1)] = 1.0
    elif kind == "far-run":  # one contiguous run of 3 keys, 6 to 8 tokens away
        rows = torch.arange(n)
        start = torch.where(rows + 8 < n, rows + 6, rows - 8)
        probs = torch.zeros(n, n)
        for offset in range(3):
            probs[rows, start + offset] = 1.0
    elif kind == "mixed":
        probs = torch.zeros(n, n)
        rows = torch.arange(n)
        probs[rows, (rows + 5) % n] = 0.5
        probs[rows, (rows + 9) % n] = 0.5
    else:
        raise ValueError(kind)
    return probs / probs.sum(-1, keepdim=True)


def synthetic_record(n: int = 16, kinds: tuple[str, ...] = KINDS, layers: int = 1,
                     seed: int = 0) -> AttentionRecord:
    """A record whose layers all hold one head of each of ``kinds`` (random q/k)."""
    gen = torch.Generator().manual_seed(seed)
    words = [f"w{i}" for i in range(1, n - 1)]
    words[len(words) // 2] = ","
    tokens = ["[CLS]", *words, "[SEP]"]
    special = [True] + [False] * (n - 2) + [True]
    graphs = []
    for _ in range(layers):
        probs = torch.stack([head_probs(kind, n) for kind in kinds])
        gold = probs > 0
        graphs.append(LayerGraph(queries=torch.randn(len(kinds), n, 4, generator=gen),
                                 keys=torch.randn(len(kinds), n, 4, generator=gen), gold=gold,
                                 prob_values=probs[gold], scaling=0.5))
    text = " ".join(tokens[1:-1]) + f" {seed}"
    return AttentionRecord(text=text, tokens=tokens, offsets=[(0, 0)] * n, special=special,
                           causal=False, layers=graphs)
