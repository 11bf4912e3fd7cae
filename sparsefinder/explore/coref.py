"""View-model of the Coreference page: a head's pronoun rows as a tidy table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from torch import Tensor

from sparsefinder.data.records import AttentionRecord

#: Columns of :func:`pronoun_rows_frame` (also those of its empty result).
COLUMNS = ("pairs", "query", "query_token", "key", "key_token", "prob", "gold", "predicted",
           "antecedent", "antecedent_of")


def pronoun_rows_frame(record: AttentionRecord, layer: int, head: int,
                       pairs: Sequence[Any], pred: Tensor | None = None) -> pd.DataFrame:
    """Only the pronoun rows of one head, tidy: one row per (pronoun token, key token).

    ``pairs`` are :class:`sparsefinder.analysis.coref.PairTokens`; ``pred`` the predicted
    (n, m) mask of the head (or None). A pronoun may have several antecedents (several pairs
    share its tokens, e.g. spaCy's candidates "he → handle", "he → hallway"): its token is still
    ONE attention row — one distribution over the keys, in which the candidates compete — so it
    appears once, with every antecedent of every pair it belongs to marked. Query tokens come
    in reading order.

    Columns: pairs (tuple of the indices of the pairs whose pronoun covers the query token),
    query, query_token, key, key_token, prob (gold α-entmax probability), gold (edge),
    predicted, antecedent (the key is an antecedent token of one of those pairs: the edges
    :func:`sparsefinder.analysis.coref.pronoun_edges` counts), antecedent_of (tuple of the
    indices of those pairs whose antecedent covers the key; empty elsewhere).
    """
    n = record.n_tokens
    of_query: dict[int, list[int]] = {}
    for index, pair in enumerate(pairs):
        for row in np.unique(np.asarray(pair.pronoun, dtype=np.int64)):
            of_query.setdefault(int(row), []).append(index)
    if not of_query:
        return pd.DataFrame({c: [] for c in COLUMNS})
    probs = record.layers[layer].probs()[head]
    keys = np.arange(n)
    frames = []
    for row in sorted(of_query):
        owners = tuple(of_query[row])
        antecedent_of: list[tuple[int, ...]] = [() for _ in range(n)]
        for index in owners:
            for col in np.unique(np.asarray(pairs[index].antecedent, dtype=np.int64)):
                antecedent_of[int(col)] += (index,)
        values = probs[row].float().numpy()
        frames.append(pd.DataFrame({
            "pairs": [owners] * n,
            "query": row,
            "query_token": record.tokens[row],
            "key": keys,
            "key_token": record.tokens,
            "prob": values,
            "gold": values > 0,
            "predicted": (pred[row].numpy().astype(bool) if pred is not None
                          else np.zeros(n, dtype=bool)),
            "antecedent": np.array([bool(a) for a in antecedent_of]),
            "antecedent_of": antecedent_of,
        }))
    return pd.concat(frames, ignore_index=True)[list(COLUMNS)]
