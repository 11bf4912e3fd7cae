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


def _words(text: str):
    """Whitespace words as spaCy's would be (the view-model only reads their spans)."""
    from sparsefinder.analysis.coref_pairs import Word

    out, start = [], 0
    for token in text.split():
        start = text.index(token, start)
        out.append(Word(start, start + len(token), token, "X", "X"))
        start += len(token)
    return out


def test_pair_choices_offer_the_guesses_then_the_pairs_named_by_hand():
    from sparsefinder.analysis.coref import CorefPair

    text = "Marta Jones met the engineer and she thanked him"
    words = _words(text)
    marta, she, him, engineer = 0, 6, 8, 4
    guesses = [CorefPair((words[she].start, words[she].end), (words[marta].start,
                                                              words[1].end), source="auto"),
               CorefPair((words[him].start, words[him].end),
                         (words[engineer].start, words[engineer].end), source="auto")]
    options = excoref.pair_choices(text, words, guesses, [(him, engineer), (she, engineer)])
    assert [o.index for o in options] == [(she, marta), (him, engineer), (she, engineer)]
    assert [o.by_hand for o in options] == [False, False, True]
    assert options[0].label == "she → Marta Jones"  # words, not offsets; the whole name
    assert options[2].label == "she → engineer (added by you)"
    assert options[2].pair.source == "hand"
    assert excoref.default_pairs(options) == ((she, marta), (him, engineer))


def test_the_best_guess_of_every_pronoun_is_chosen_and_the_others_offered():
    """One chosen pair per pronoun, for every pronoun however many (the guesses come nearest
    first), never a second candidate beside it; pairs named by hand are never defaults."""
    from sparsefinder.analysis.coref import CorefPair

    text = " ".join(["A B C", *["x y"] * 10])
    words = _words(text)
    nouns = [0, 1, 2]
    pronouns = range(3, len(words))
    guesses = [CorefPair((words[p].start, words[p].end), (words[n].start, words[n].end))
               for p in pronouns for n in reversed(nouns)]  # nearest first, 3 per pronoun
    options = excoref.pair_choices(text, words, guesses, [(5, 0)])
    chosen = excoref.default_pairs(options)
    assert chosen == tuple((p, 2) for p in pronouns)  # 20 pronouns: all, the nearest each
    assert len(options) == 3 * len(pronouns)  # (5, 0) is a guess too: not "added by you"
    hand_only = excoref.pair_choices(text, words, [], [(5, 0)])
    assert excoref.default_pairs(hand_only) == ()


def test_chips_name_words_and_tell_repeated_words_apart():
    from sparsefinder.analysis.coref import CorefPair

    text = "He said the report was late. He read it and its report again."
    words = _words(text)  # He said the report was late. He read it and its report again.
    he2, its = words[6], words[10]
    report1, report2 = words[3], words[11]
    first = CorefPair((its.start, its.end), (report1.start, report1.end))
    second = CorefPair((he2.start, he2.end), (report2.start, report2.end))
    labels = [o.label for o in excoref.pair_choices(text, words, [first, second])]
    assert labels == ["its → report (1st)", "He (2nd) → report (2nd)"]
    assert "@" not in excoref.word_choice(text, words, 10)
    assert excoref.word_choice(text, words, 10) == "10 · its"
    assert excoref.word_choice(text, words, 0) == "0 · He (1st)"
    assert excoref.word_choice(text, words, 8) == "8 · it"  # "its" is another word


def test_fit_link_fixes_each_bad_coreference_field_and_says_how():
    from sparsefinder.explore.state import ViewState

    ids = ["p01", "p02"]
    good = ViewState(coref_probe="p02", coref_pairs=((3, 1),), coref_B=4, coref_k=2)
    assert excoref.fit_link(good, ids, 10, [2, 4, 8]) == ({}, [])
    bad = ViewState(coref_probe="p99", coref_pairs=((3, 1), (12, 2)), coref_B=5, coref_k=8)
    changes, problems = excoref.fit_link(bad, ids, 10, [2, 4, 8])
    assert changes == {"coref_probe": None, "coref_pairs": ((3, 1),), "coref_B": None}
    assert problems == [
        "probe='p99' is not a bundled probe: showing p01 (choose from p01–p02).",
        "pairs 12-2 are beyond this text's 10 words (0–9): left out.",
        "coref_B=5 is not a number of clusters these projections hold (2, 4, 8): showing B=8.",
    ]
    changes, problems = excoref.fit_link(bad.with_(coref_B=4), ids, 3, [2, 4, 8])
    assert changes["coref_pairs"] is None and changes["coref_k"] == 4  # k at most B
    assert problems[1].endswith("showing the automatic guesses instead.")
    assert problems[2] == "coref_k=8 is more than B=4: showing k=4."
    # without projections (no B) or a known text, those fields are left alone
    assert excoref.fit_link(bad.with_(coref_probe=None), ids, None, []) == ({}, [])


def test_the_demo_setting_is_the_nearest_b_to_8_with_k_2():
    from sparsefinder.explore.state import ViewState

    assert excoref.demo_setting([2, 4, 8]) == (8, 2)
    assert excoref.demo_setting([4, 12, 16]) == (4, 2)  # a tie goes to the smaller B
    assert excoref.demo_setting([6, 12, 16]) == (6, 2)
    assert excoref.demo_setting([1]) == (1, 1)
    assert excoref.kmeans_setting(ViewState(), [2, 4, 8]) == (8, 2)
    assert excoref.kmeans_setting(ViewState(coref_B=2, coref_k=None), [2, 4, 8]) == (2, 2)
    assert excoref.kmeans_setting(ViewState(coref_B=4, coref_k=3), [2, 4, 8]) == (4, 3)
