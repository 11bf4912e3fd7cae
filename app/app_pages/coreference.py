"""Coreference: which heads send pronouns to their antecedents, and does k-means keep those
edges? (paper §6, Fig. 5: a RoBERTa head with recall ≈ 0.80 at sparsity ≈ 0.75).

Probes come from ``assets/coref_probes.json``; each probe text is extracted through the shell's
cached extraction (like the main text). The head ranking is over the chosen probe, or over all
probes on request (cached).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import streamlit as st

from app import shell
from sparsefinder.analysis import coref, coref_pairs
from sparsefinder.explore import coref as excoref
from sparsefinder.explore import live, tables
from sparsefinder.explore import prepared as prep
from sparsefinder.explore import state as urlstate
from sparsefinder.figures import common as common_figures
from sparsefinder.figures import coref as coref_figures

st.title("Coreference")


@st.cache_resource(show_spinner=False)
def _probes() -> list[coref.Probe]:
    return coref.load_probes()


def _prepared_probe(ctx: shell.AppContext, probe: coref.Probe) -> prep.PreparedText:
    name, alpha, proj_key = ctx.cache_key.model_key
    projections = ctx.prepared.projections if proj_key != "none" else None
    return shell.cached_prepared(name, alpha, probe.text, proj_key, projections)


ANCHOR_KEY = "_coref_pairs_for"  # the text (hash) the chosen pairs are word indices of


@st.cache_data(max_entries=4, show_spinner=False)
def _words(text: str) -> tuple[list[coref_pairs.Word], list[coref.CorefPair]]:
    """spaCy's words of ``text`` and the automatic guesses (cached: drawn on every run)."""
    tokens = coref_pairs.words(text)
    return tokens, coref_pairs.propose_pairs(text, tokens=tokens)


def _fit_link(ctx: shell.AppContext) -> None:
    """Fit the page's own link fields (probe, pairs, B, k, head) to this text and model; what
    was fixed joins the link's one warning. Pairs of another text (the sidebar's changed) are
    forgotten: they are word indices of the text they were chosen on; so is the head shown
    on it (it was one of that text's ranking)."""
    state = shell.view_state()
    anchor, now = st.session_state.get(ANCHOR_KEY), ctx.cache_key.text_hash
    st.session_state[ANCHOR_KEY] = now
    if anchor is not None and anchor != now:
        forget = {"coref_pairs": None} if state.coref_pairs is not None else {}
        if state.coref_text == "own" and state.coref_head is not None:
            forget["coref_head"] = None
        if forget:
            state = shell.update_view(**forget)
    try:
        ids = [p.id for p in _probes()]
    except coref.ProbeFileError:
        ids = []  # the page says so
    n_words = None
    if state.coref_pairs:
        with contextlib.suppress(ImportError):  # the page says so when the text is chosen
            n_words = len(_words(ctx.prepared.record.text)[0])
    shape = (ctx.prepared.num_layers, ctx.prepared.num_heads)
    changes, fixes = excoref.fit_link(state if ids else state.with_(coref_probe=None), ids,
                                      n_words, ctx.prepared.cluster_choices, shape)
    if changes:
        shell.update_view(**changes)
    shell.add_fixes(ctx, fixes)


def _kmeans_controls(prepared: prep.PreparedText) -> tuple[int, int]:
    """B and k for this page: its own (kept in the link as coref_B/coref_k), so the demo opens
    on a setting where it works whatever the sidebar's method."""
    choices = prepared.cluster_choices
    default_b, _ = excoref.demo_setting(choices)
    clusters, top_k = excoref.kmeans_setting(shell.view_state(), choices)
    left, right = st.columns(2)
    clusters = left.select_slider("B (clusters)", options=choices, **shell.bind(
        "w_coref_B", "coref_B", to_widget=lambda _: clusters,
        from_widget=lambda b: None if b == default_b else int(b)))
    top = min(urlstate.MAX_TOP_K, int(clusters))
    default_k = excoref.demo_setting([clusters])[1]
    top_k = right.slider("k (nearest centroids)", 1, max(top, 2), disabled=top < 2,
                         **shell.bind("w_coref_k", "coref_k", to_widget=lambda _: top_k,
                                      from_widget=lambda k: None if k == default_k else int(k)))
    return int(clusters), int(top_k)


def _bind_ranking(key: str, field_name: str, to_widget: Any = None,
                  from_widget: Any = None) -> dict:
    """:func:`shell.bind` for a widget that changes what the heads are ranked on (text,
    probe, scope, pairs): the head shown goes back to the best of the new ranking, never one
    carried over from the view before."""
    bound = shell.bind(key, field_name, to_widget, from_widget)

    def change() -> None:
        value = st.session_state[key]
        shell.user_change(**{field_name: from_widget(value) if from_widget else value},
                          coref_head=None)
    return {**bound, "on_change": change, "args": ()}


def _add_pair(options: list[excoref.PairChoice], chosen: tuple[tuple[int, int], ...]) -> None:
    pair = (st.session_state["w_coref_pronoun"], st.session_state["w_coref_antecedent"])
    if pair[0] != pair[1] and pair not in chosen:
        shell.user_change(coref_pairs=(*chosen, pair), coref_head=None)


def _no_guesses(tokens: list[coref_pairs.Word]) -> None:
    """Why a text has no automatic guesses, and what to do instead."""
    if coref_pairs.looks_english(tokens) is False:
        why = ("they read English only (spaCy's English tags and English word lists), and "
               "this text does not look English")
    else:
        why = ("they pair English third-person pronouns (he, she, it, they, …) with an "
               "agreeing noun before them, and this text has none")
    st.info(f"No automatic guesses: {why}. Name pronoun → antecedent pairs under \"Name a "
            "pair by hand\" below: the heads are then ranked on them.", icon=":material/info:")


def _own_text_probe(ctx: shell.AppContext) -> coref.Probe | None:
    """Pairs on the text loaded in the sidebar: automatic guesses (the best one of every
    pronoun chosen) and pairs named by hand, as removable chips named by their words; the
    chosen ones are kept in the link as word indices. None (the text and the next step
    shown) while no pair is chosen."""
    text = ctx.prepared.record.text
    try:
        tokens, proposals = _words(text)
    except ImportError as error:
        st.error(str(error), icon=":material/error:")
        return None
    linked = shell.view_state().coref_pairs
    options = excoref.pair_choices(text, tokens, proposals, linked or ())
    default = excoref.default_pairs(options)
    chosen = linked if linked is not None else default
    by_label = {o.label: o for o in options}
    by_index = {o.index: o for o in options}

    def to_indices(labels: list[str]) -> tuple[tuple[int, int], ...] | None:
        picked = tuple(by_label[label].index for label in labels)
        return None if picked == default else picked

    if not proposals:
        _no_guesses(tokens)
    if options:
        st.multiselect(
            "Pronoun → antecedent pairs (the best automatic guess of each pronoun is chosen, "
            "other candidates are in the list; pairs you name are marked \"added by you\")"
            if proposals else "Pronoun → antecedent pairs (named by you)",
            list(by_label), placeholder="no pair chosen: pick a guess or name a pair below",
            help="Guessed from spaCy's tags, morphology and names plus a small English word "
                 "list (he/she → people, it → things, they → plurals); remove the wrong ones "
                 "(×), add missing ones below. A word the text has more than once is named "
                 "with its place: \"he (2nd)\" is the second \"he\". The chosen pairs are "
                 "kept in the link.",
            **_bind_ranking("w_coref_pairs", "coref_pairs",
                            to_widget=lambda _: [by_index[i].label for i in chosen],
                            from_widget=to_indices))
    with st.expander("Name a pair by hand", expanded=not chosen):
        left, right, add = st.columns([2, 2, 1], vertical_alignment="bottom")
        shell.seed("w_coref_pronoun", 0)
        shell.seed("w_coref_antecedent", 0)
        for column, label, key in ((left, "Pronoun (any word)", "w_coref_pronoun"),
                                   (right, "Antecedent", "w_coref_antecedent")):
            column.selectbox(label, range(len(tokens)), key=key,
                             format_func=lambda i: excoref.word_choice(text, tokens, i))
        add.button("Add pair", key="w_coref_add", on_click=_add_pair, args=(options, chosen),
                   help="Adds the pair to the chips above, marked \"added by you\".")
    pairs = [by_index[i].pair for i in chosen]
    if not pairs:
        st.markdown(tables.highlight_html(text, [], []), unsafe_allow_html=True)
        if proposals:
            st.info("No pair chosen: pick automatic guesses above or name a pair by hand; "
                    "the head ranking and the pronoun rows need at least one pair.",
                    icon=":material/info:")
        return None
    return coref_pairs.text_probe(text, pairs)


def _head_picker(column: Any, ranking: Any) -> tuple[int, int]:
    """The head shown: the link's (or the one picked), else the best of the ranking; either
    way written into the link, so the link opens on this very head."""
    best = [(int(r.layer), int(r.head)) for r in ranking.head(5).itertuples()]
    shown = shell.view_state().coref_head or best[0]
    if shell.view_state().coref_head != shown:
        shell.update_view(coref_head=shown)
    options = best if shown in best else [*best, shown]
    return column.selectbox(
        "Head (top 5 of the ranking)", options,
        format_func=lambda lh: f"L{lh[0]}·H{lh[1]}" + ("" if lh in best else
                                                       " (not in the top 5 here)"),
        **shell.bind("w_coref_head", "coref_head", from_widget=tuple))


@st.fragment
def coreference_view() -> None:
    ctx = shell.context()
    if not ctx.ready:
        return
    try:
        probes = _probes()
    except coref.ProbeFileError as error:
        st.error(str(error), icon=":material/error:")
        return
    by_id = {p.id: p for p in probes}
    first = probes[0].id
    source = st.radio("Text", urlstate.COREF_TEXTS, horizontal=True,
                      format_func={"probes": f"bundled probes ({len(probes)})",
                                   "own": "the text loaded in the sidebar"}.get,
                      **_bind_ranking("w_coref_source", "coref_text",
                                      to_widget=lambda v: v or "probes",
                                      from_widget=lambda v: None if v == "probes" else v))
    if source == "own":
        probe = _own_text_probe(ctx)
        if probe is None:
            return
    else:
        probe = by_id[st.selectbox(
            "Probe", list(by_id), format_func=lambda i: f"{i} · {by_id[i].text[:90]}",
            **_bind_ranking("w_probe", "coref_probe", to_widget=lambda v: v or first,
                            from_widget=lambda v: None if v == first else v))]
    spans = [s for pair in probe.pairs for s in (pair.pronoun, pair.antecedent)]
    st.markdown(tables.highlight_html(probe.text, spans, range(len(spans))),
                unsafe_allow_html=True)
    st.caption(" · ".join(
        f"pair {i}: **{probe.text[slice(*p.pronoun)]}** → "
        f"**{probe.text[slice(*p.antecedent)]}**" + (" (cataphora)" if p.cataphora else "")
        for i, p in enumerate(probe.pairs)))
    prepared = ctx.prepared if source == "own" else _prepared_probe(ctx, probe)
    record = prepared.record
    try:
        pairs = coref.pair_tokens(record, probe)
    except ValueError as error:
        st.error(str(error), icon=":material/error:")
        return

    scope = "probe" if source == "own" else st.radio(
        "Rank heads on", urlstate.COREF_SCOPES, horizontal=True,
        format_func={"probe": "this probe",
                     "all": f"all {len(probes)} probes (slower, cached)"}.get,
        **_bind_ranking("w_coref_scope", "coref_scope", to_widget=lambda v: v or "probe",
                        from_widget=lambda v: None if v == "probe" else v))
    everything = None
    if scope == "all":
        everything = shell.all_probes(ctx.cache_key.model_key, prepared.projections)
        ranking = everything[0]
    else:
        ranking = coref.rank_heads([record], [probe])
    left, right = st.columns([2, 3])
    left.markdown(f"**Head ranking** ({'all probes' if everything else probe.id}): mean "
                  "gold mass from a pronoun onto its antecedent")
    left.dataframe(ranking.head(10).round(3), hide_index=True, width="stretch")
    layer, head = _head_picker(right, ranking)
    tag = excoref.head_name((layer, head))

    learned = prepared.has_projections and bool(prepared.cluster_choices)
    pred = None
    with right:
        if learned:
            clusters, top_k = _kmeans_controls(prepared)
            pred = live.kmeans_layer_mask(prepared, layer, clusters, top_k)
        else:
            st.info("Recall of Sparsefinder k-means needs learned projections with centroids, "
                    "which are not loaded for this model; the gold graphs and the ranking "
                    "still work.", icon=":material/info:")
    frame = excoref.pronoun_rows_frame(record, layer, head, pairs,
                                     pred[head] if pred is not None else None)
    st.plotly_chart(coref_figures.pronoun_figure(frame, tag),
                    config=common_figures.chart_config(f"coref_{tag}"), key="w_fig_coref_rows")
    st.caption("Only the pronoun rows of the head: each row is one pronoun piece, shown once "
               "however many antecedents it has; red squares mark the pieces of all its "
               "antecedents (hover one to see its pair), so the row shows which candidate the "
               "head prefers.")
    if pred is None:
        return

    result = coref.evaluate_head([record], [probe], [pred], layer, head)
    ours = [(f"{probe.id}", result["pronoun_recall"], result["sparsity"])]
    cols = st.columns(4)
    cols[0].metric(f"Pronoun-edge recall ({probe.id})", f"{result['pronoun_recall']:.3f}")
    cols[1].metric(f"Head sparsity ({probe.id})", f"{result['sparsity']:.3f}")
    cols[2].metric("Pronoun gold edges", f"{result['pronoun_gold_edges']}")
    cols[3].metric("Head recall (all edges)", f"{result['head_recall']:.3f}")
    if everything is not None:
        preds = [live.kmeans_layer_mask(p, layer, clusters, top_k) for p in everything[1]]
        pooled = coref.evaluate_head([p.record for p in everything[1]], probes, preds,
                                     layer, head)
        ours.append(("all probes", pooled["pronoun_recall"], pooled["sparsity"]))
        a, b = st.columns(2)
        a.metric("Pronoun-edge recall (all probes)", f"{pooled['pronoun_recall']:.3f}")
        b.metric("Head sparsity (all probes)", f"{pooled['sparsity']:.3f}")
    paper, mine = st.columns(2)
    with paper:
        st.markdown("**Paper** (RoBERTa coreference head, k-means)")
        p1, p2 = st.columns(2)
        p1.metric("Paper recall", f"{coref_figures.PAPER_RECALL:.2f}")
        p2.metric("Paper sparsity", f"{coref_figures.PAPER_SPARSITY:.2f}")
    with mine:
        st.plotly_chart(coref_figures.reference_figure(ours),
                        config=common_figures.chart_config("coref_reference"),
                        key="w_fig_coref_reference")
    if np.isnan(result["pronoun_recall"]):
        st.caption("This head has no gold edge from the pronouns to their antecedents on this "
                   "probe, so its recall there is undefined.")


ctx = shell.context()
if ctx.ready:
    _fit_link(ctx)
st.caption("Heads that attend from pronouns to their antecedents, and whether Sparsefinder "
           "k-means keeps those edges (paper §6, Fig. 5).")
if shell.show_messages(ctx):
    coreference_view()
