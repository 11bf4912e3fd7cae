"""sparsefinder.explore: the Coreference page view-model (no Streamlit)."""

from __future__ import annotations

import numpy as np
import torch

from sparsefinder.explore import coref as excoref


def test_pronoun_rows_frame(record):
    from sparsefinder.analysis.coref import PairTokens

    pairs = [PairTokens(np.array([8]), np.array([7])), PairTokens(np.array([9, 10]),
                                                                  np.array([2]))]
    pred = torch.zeros(record.n_tokens, record.n_tokens, dtype=torch.bool)
    pred[8, 7] = True
    frame = excoref.pronoun_rows_frame(record, 0, 1, pairs, pred)
    assert len(frame) == 3 * record.n_tokens
    assert frame.groupby("query")["prob"].sum().round(4).eq(1.0).all()
    assert frame["predicted"].sum() == 1 and frame["antecedent"].sum() == 3
    gold = record.layers[0].gold[1]
    assert frame.loc[frame["query"] == 9, "gold"].tolist() == gold[9].tolist()
    assert not excoref.pronoun_rows_frame(record, 0, 1, pairs)["predicted"].any()
