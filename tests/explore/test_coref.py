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


def test_a_pronoun_with_several_antecedents_is_one_row_with_all_of_them(record):
    """spaCy proposes two candidates per pronoun, and the page pre-selects them all: pairs 0
    and 1 share pronoun token 8, pairs 2 and 3 share piece 10 of a two-piece pronoun."""
    from sparsefinder.analysis.coref import PairTokens, pronoun_edges

    pairs = [PairTokens(np.array([8]), np.array([7])),
             PairTokens(np.array([8]), np.array([2, 3])),
             PairTokens(np.array([9, 10]), np.array([5])),
             PairTokens(np.array([10]), np.array([2]))]
    pred = torch.zeros(record.n_tokens, record.n_tokens, dtype=torch.bool)
    pred[8, 3] = True
    frame = excoref.pronoun_rows_frame(record, 0, 1, pairs, pred)
    n = record.n_tokens
    assert len(frame) == 3 * n  # tokens 8, 9, 10: each ONE attention row
    assert frame["query"].unique().tolist() == [8, 9, 10]  # reading order
    owners = frame.drop_duplicates("query").set_index("query")["pairs"].to_dict()
    assert owners == {8: (0, 1), 9: (2,), 10: (2, 3)}
    marked = frame[frame["antecedent"]]
    assert {q: sorted(g["key"]) for q, g in marked.groupby("query")} == {
        8: [2, 3, 7], 9: [5], 10: [2, 5]}
    row8 = frame[frame["query"] == 8].set_index("key")["antecedent_of"]
    assert (row8[7], row8[2], row8[3], row8[0]) == ((0,), (1,), (1,), ())
    assert frame.loc[frame["query"] == 10].set_index("key")["antecedent_of"][5] == (2,)
    # exactly the pronoun→antecedent edges that pronoun-edge recall counts, each once
    edges = pronoun_edges(pairs, n, n).numpy()
    assert sorted(zip(marked["query"], marked["key"], strict=True)) == sorted(
        zip(*np.nonzero(edges), strict=True))
    assert frame.groupby("query")["prob"].sum().round(4).eq(1.0).all()
    assert frame["predicted"].sum() == 1
    assert frame.loc[frame["predicted"], ["query", "key"]].values.tolist() == [[8, 3]]


def test_a_pronoun_named_twice_for_the_same_antecedent_is_still_one_row(record):
    from sparsefinder.analysis.coref import PairTokens

    pairs = [PairTokens(np.array([8]), np.array([7]))] * 2
    frame = excoref.pronoun_rows_frame(record, 0, 0, pairs)
    assert len(frame) == record.n_tokens and frame["antecedent"].sum() == 1
    assert frame.set_index("key")["antecedent_of"][7] == (0, 1)


def test_no_pairs_is_an_empty_frame_with_the_columns(record):
    frame = excoref.pronoun_rows_frame(record, 0, 0, [])
    assert frame.empty and list(frame.columns) == list(excoref.COLUMNS)
