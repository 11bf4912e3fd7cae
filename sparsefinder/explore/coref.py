"""View-model of the Coreference page: a head's pronoun rows as a tidy table, the pairs its
selector offers (automatic guesses and pairs named by hand) and its link fields fitted to the
text and model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from torch import Tensor

from sparsefinder.analysis.coref import CorefPair
from sparsefinder.analysis.coref_pairs import Word, pair_names, span_name
from sparsefinder.data.records import AttentionRecord
from sparsefinder.explore.state import MAX_TOP_K, ViewState

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


#: The page's own k-means setting, chosen on the bundled probes' choose split (never on
#: validation data) by rule R of ``sparsefinder coref``: the sparsest B whose k = 2 keeps at
#: least 0.80 of the best head's pronoun→antecedent gold edges. With the bundled projections
#: that is B = 8 (recall 0.802 at sparsity 0.613 on the 62 choose probes); k = 1 keeps at most
#: 0.14 of them (the head's queries and keys fall in different clusters).
DEMO_CLUSTERS, DEMO_TOP_K = 8, 2


def head_name(head: tuple[int, int]) -> str:
    """``(3, 1)`` → ``"L3H1"``: how the link and the figures name a head."""
    return f"L{head[0]}H{head[1]}"


def demo_setting(choices: Sequence[int]) -> tuple[int, int]:
    """The page's default (B, k): the B nearest :data:`DEMO_CLUSTERS` that the projections
    hold, and k = :data:`DEMO_TOP_K` (at most B)."""
    clusters = min(choices, key=lambda b: (abs(b - DEMO_CLUSTERS), b))
    return clusters, min(DEMO_TOP_K, clusters, MAX_TOP_K)


def kmeans_setting(state: ViewState, choices: Sequence[int]) -> tuple[int, int]:
    """(B, k) the page shows: the state's own, else the demo setting (see :func:`fit_link`)."""
    clusters, top_k = demo_setting(choices)
    clusters = state.coref_B if state.coref_B is not None else clusters
    return clusters, min(state.coref_k if state.coref_k is not None else top_k, clusters)


@dataclass(frozen=True)
class PairChoice:
    """One pair the selector offers: its word indices (what the link keeps), the pair, its
    chip label and whether the user named it (not one of the automatic guesses)."""

    index: tuple[int, int]
    pair: CorefPair
    label: str
    by_hand: bool


def pair_choices(text: str, words: Sequence[Word], proposals: Sequence[CorefPair],
                 chosen: Sequence[tuple[int, int]] = ()) -> list[PairChoice]:
    """The selector's options: every automatic guess, then each chosen pair that is not one
    (named by hand), marked "added by you". A pair is ``(pronoun, antecedent)`` word indices
    into ``words``; a guess keeps its whole antecedent span (a two-word name), a hand pair is
    two words. Labels name the words (:func:`~sparsefinder.analysis.coref_pairs.pair_names`:
    "he (2nd) → Priya"), never character offsets; each names one pair."""
    at = {w.start: i for i, w in enumerate(words)}
    options: dict[tuple[int, int], PairChoice] = {}
    for pair in proposals:
        index = (at[pair.pronoun[0]], at[pair.antecedent[0]])
        options.setdefault(index, PairChoice(index, pair, pair_names(text, words, pair), False))
    for index in chosen:
        if index not in options:
            pronoun, antecedent = (words[i] for i in index)
            pair = CorefPair((pronoun.start, pronoun.end), (antecedent.start, antecedent.end),
                             source="hand")
            options[index] = PairChoice(
                index, pair, f"{pair_names(text, words, pair)} (added by you)", True)
    return list(options.values())


def default_pairs(options: Sequence[PairChoice]) -> tuple[tuple[int, int], ...]:
    """The pairs chosen when the page opens: the best guess of EVERY pronoun, one each (the
    guesses come nearest agreeing mention first, see
    :func:`~sparsefinder.analysis.coref_pairs.propose_pairs`); the other guesses are
    offered."""
    best: dict[int, tuple[int, int]] = {}
    for option in options:
        if not option.by_hand:
            best.setdefault(option.index[0], option.index)
    return tuple(best.values())


def word_choice(text: str, words: Sequence[Word], index: int) -> str:
    """How the hand-pair menus name word ``index``: its number (the link's) and its name."""
    word = words[index]
    return f"{index} · {span_name(text, words, (word.start, word.end))}"


def fit_link(state: ViewState, probe_ids: Sequence[str], n_words: int | None,
             choices: Sequence[int], shape: tuple[int, int] | None = None
             ) -> tuple[dict[str, Any], list[str]]:
    """Fit the page's link fields to this text and model: (changes to the state, one problem
    per change, naming the value and what is shown instead). ``n_words``: spaCy's words in the
    sidebar's text (None: not known, pairs left alone); ``choices``: the B the projections
    hold (none: B and k left alone); ``shape``: the model's (layers, heads) (None: the head
    is left alone)."""
    changes: dict[str, Any] = {}
    problems: list[str] = []
    if state.coref_head is not None and shape is not None:
        layer, head = state.coref_head
        if layer >= shape[0] or head >= shape[1]:
            changes["coref_head"] = None
            problems.append(f"coref_head={head_name(state.coref_head)} is not a head of this "
                            f"model (L0H0–L{shape[0] - 1}H{shape[1] - 1}): showing the best "
                            "head of the ranking.")
    if state.coref_probe is not None and state.coref_probe not in probe_ids:
        changes["coref_probe"] = None
        problems.append(f"probe={state.coref_probe!r} is not a bundled probe: showing "
                        f"{probe_ids[0]} (choose from {probe_ids[0]}–{probe_ids[-1]}).")
    if state.coref_pairs is not None and n_words is not None:
        bad = [p for p in state.coref_pairs if max(p) >= n_words]
        if bad:
            kept = tuple(p for p in state.coref_pairs if p not in bad)
            changes["coref_pairs"] = kept or None
            problems.append(
                f"pairs {','.join(f'{i}-{j}' for i, j in bad)} are beyond this text's "
                f"{n_words} words (0–{n_words - 1}): "
                + ("left out." if kept else "showing the automatic guesses instead."))
    if choices:
        clusters = state.coref_B
        if clusters is not None and clusters not in choices:
            changes["coref_B"] = clusters = None
            problems.append(f"coref_B={state.coref_B} is not a number of clusters these "
                            f"projections hold ({', '.join(map(str, choices))}): showing "
                            f"B={demo_setting(choices)[0]}.")
        clusters = clusters if clusters is not None else demo_setting(choices)[0]
        if state.coref_k is not None and state.coref_k > min(clusters, MAX_TOP_K):
            changes["coref_k"] = min(clusters, MAX_TOP_K)
            problems.append(f"coref_k={state.coref_k} is more than B={clusters}: showing "
                            f"k={changes['coref_k']}.")
    return changes, problems
