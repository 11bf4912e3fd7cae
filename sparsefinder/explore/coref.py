"""View-model of the Coreference page: a head's pronoun rows as a tidy table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from torch import Tensor

from sparsefinder.data.records import AttentionRecord


def pronoun_rows_frame(record: AttentionRecord, layer: int, head: int,
                       pairs: Sequence[Any], pred: Tensor | None = None) -> pd.DataFrame:
    """Only the pronoun rows of one head, tidy: one row per (pronoun token, key token).

    ``pairs`` are :class:`sparsefinder.analysis.coref.PairTokens`; ``pred`` the predicted (n, m)
    mask
    of the head (or None). Columns: pair, query, query_token, key, key_token, prob (gold
    α-entmax probability), gold (edge), predicted, antecedent (key is the pair's antecedent).
    """
    probs = record.layers[layer].probs()[head]
    frames = []
    n = record.n_tokens
    for index, pair in enumerate(pairs):
        antecedent = np.zeros(n, dtype=bool)
        antecedent[pair.antecedent] = True
        for row in pair.pronoun:
            values = probs[int(row)].float().numpy()
            frames.append(pd.DataFrame({
                "pair": index,
                "query": int(row),
                "query_token": record.tokens[int(row)],
                "key": np.arange(n),
                "key_token": record.tokens,
                "prob": values,
                "gold": values > 0,
                "predicted": (pred[int(row)].numpy() if pred is not None
                              else np.zeros(n, dtype=bool)),
                "antecedent": antecedent,
            }))
    return pd.concat(frames, ignore_index=True)
