"""The view state's home: session state mirrored to the link, and widgets bound to it.

The view state (method, hyperparameters, layer, head, …) lives in ``st.session_state`` under
``VIEW_KEY`` and is mirrored to ``st.query_params`` so a URL reproduces a view. Widgets get
their value from it (:func:`seed`, :func:`bind`) instead of ``value=``, so their values
survive page switches (Streamlit forgets the state of widgets a page did not draw).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import streamlit as st

from app.context import context
from sparsefinder.explore import state as urlstate

VIEW_KEY = "_view"
PRED_CACHE_KEY = "_predictions"
CLUSTER_KEY = "_cluster"  # the k-means cluster picked on the Clusters page (None: none)
CLUSTER_ANCHOR_KEY = "_cluster_for"  # (model, text hash, layer, head) it was picked on
CLUSTER_PARAM = "cluster"
PAIR_KEY = "_pair"  # (layer, head, query, key) picked on Learned space; the Explorer rings it
#: The settings of a link that were fixed, and the (view state, cache key) they were fixed
#: for: one warning, shown until the user changes something.
FIXES_KEY = "_fixes"
FIXES_CLEARED_KEY = "_fixes_cleared"  # a fragment's widget cleared them: rerun the page


def view_state() -> urlstate.ViewState:
    """The current view state: session first, else the URL (first visit / shared link)."""
    if VIEW_KEY not in st.session_state:
        state, problems = urlstate.parse_view_state(st.query_params.to_dict())
        st.session_state[VIEW_KEY] = state
        st.session_state["_url_problems"] = problems
    return st.session_state[VIEW_KEY]


def set_view_state(state: urlstate.ViewState) -> None:
    """Store the state and mirror it into the URL (only changed parameters are written)."""
    st.session_state[VIEW_KEY] = state
    params = urlstate.view_state_to_params(state)
    current = st.query_params.to_dict()
    changed = {k: v for k, v in params.items() if current.get(k) != v}
    if changed:
        st.query_params.update(changed)
    for key in set(urlstate.PARAM_NAMES.values()) - set(params):
        if key in current:  # e.g. textid after switching back to an example
            del st.query_params[key]


def update_view(**changes: Any) -> urlstate.ViewState:
    state = replace(view_state(), **changes)
    set_view_state(state)
    return state


def _cluster_anchor() -> tuple | None:
    """What a picked cluster belongs to: (model, text, layer, head) of the current view; None
    while no text is ready."""
    key = context().cache_key
    state = view_state()
    return None if key is None else (key.model, key.text_hash, state.layer, state.head)


def selected_cluster() -> int | None:
    """The k-means cluster picked on the Clusters page (shared by pages): session first, else
    the URL's ``cluster``; the URL is kept in step (a page switch may drop it). A cluster is
    one head's on one text: it is forgotten once the text, model, layer or head changes."""
    if CLUSTER_KEY not in st.session_state:
        st.session_state[CLUSTER_KEY] = urlstate.parse_cluster(st.query_params.get(CLUSTER_PARAM))
        st.session_state[CLUSTER_ANCHOR_KEY] = _cluster_anchor()
    cluster = st.session_state[CLUSTER_KEY]
    if cluster is None:
        return None
    anchor, now = st.session_state.get(CLUSTER_ANCHOR_KEY), _cluster_anchor()
    if anchor is None:  # picked (or linked) before the text was ready: it is this view's
        st.session_state[CLUSTER_ANCHOR_KEY] = anchor = now
    if now is not None and anchor != now:
        set_cluster(None)
        return None
    if st.query_params.get(CLUSTER_PARAM) != str(cluster):
        st.query_params[CLUSTER_PARAM] = str(cluster)
    return cluster


def set_cluster(cluster: int | None) -> None:
    """Select (or with None clear) the shared cluster, mirrored into the URL; a selection
    belongs to the current model, text, layer and head."""
    st.session_state[CLUSTER_KEY] = None if cluster is None else int(cluster)
    st.session_state[CLUSTER_ANCHOR_KEY] = None if cluster is None else _cluster_anchor()
    if cluster is None:
        if CLUSTER_PARAM in st.query_params:
            del st.query_params[CLUSTER_PARAM]
    elif st.query_params.get(CLUSTER_PARAM) != str(int(cluster)):
        st.query_params[CLUSTER_PARAM] = str(int(cluster))


def seed(key: str, value: Any) -> None:
    """Give a widget that is drawn on every run (sidebar) its starting value once, without
    ``value=`` (avoids the double-set warning and keeps what the user chose)."""
    if key not in st.session_state:
        st.session_state[key] = value


def bind(key: str, field_name: str, to_widget: Any = None, from_widget: Any = None) -> dict:
    """Two-way bind a page widget to a ViewState field: returns ``key``/``on_change`` kwargs.

    The widget value is set from the view state before every draw, and a change writes back
    through ``on_change`` (callbacks run before the script). Page widgets need this rather
    than :func:`seed`: Streamlit drops a widget's state on a page switch, the view state and
    URL keep it.
    """
    if st.session_state.pop(FIXES_CLEARED_KEY, False):
        # A widget of a fragment cleared the link's warning, drawn above the fragment: the
        # whole page is drawn again without it (a full run pops the flag first, see
        # build_context, and so never gets here).
        st.rerun(scope="app")
    value = getattr(view_state(), field_name)
    st.session_state[key] = to_widget(value) if to_widget else value
    return {"key": key, "on_change": _sync, "args": (key, field_name, from_widget)}


def _sync(key: str, field_name: str, from_widget: Any) -> None:
    value = st.session_state[key]
    user_change(**{field_name: from_widget(value) if from_widget else value})


def user_change(**changes: Any) -> None:
    """A change the user made (a widget callback): update the view and clear the link's
    warning (the user changed something)."""
    if st.session_state.pop(FIXES_KEY, None) is not None:
        st.session_state[FIXES_CLEARED_KEY] = True
    update_view(**changes)


