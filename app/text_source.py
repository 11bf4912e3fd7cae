"""The sidebar's text: a bundled example, a pasted text or an uploaded file, and how the
link names it (a custom text by ``textid`` plus, when short, the text itself). Split from
:mod:`app.shell` so the shell keeps to assembling the context."""

from __future__ import annotations

import streamlit as st

from app.binding import bind, seed, update_view
from app.caches import text_store
from sparsefinder.data.records import TextInputError
from sparsefinder.explore import inputs, texts
from sparsefinder.explore import state as urlstate
from sparsefinder.serving import InputRefused, ServingPolicy

TEXT_PARAM = "text"  # a short custom text itself, compressed (see explore.texts)


def serving_policy() -> ServingPolicy:
    """What this server accepts: exposed (allowlist only) unless bound to a loopback address."""
    return ServingPolicy.from_env(st.get_option("server.address"))


PASTED_KEY = "_pasted_text"  # the last pasted text: survives mode and page switches


def linked_text(state: urlstate.ViewState) -> tuple[str | None, str | None]:
    """The custom text a link names (``textid`` + ``text``), or (None, why not)."""
    payload = st.query_params.get(TEXT_PARAM)
    try:
        return texts.resolve_text(state.text_id, payload, text_store()), None
    except texts.TextLinkError as error:
        return None, f"This link's text: {error}"


def text_controls(state: urlstate.ViewState) -> tuple[str | None, str | None]:
    """The text to analyse, or (None, error message). Pasted text is kept in the session
    (``PASTED_KEY``), the server's text store and the link, so switching modes or pages,
    or reloading, never loses it."""
    if PASTED_KEY not in st.session_state and state.text_id is not None:
        linked, problem = linked_text(state)
        if linked is None:
            return None, problem
        st.session_state[PASTED_KEY] = linked
        seed("w_source", "paste")
    seed("w_source", "example")
    source = st.sidebar.radio(
        "Text", ["example", "paste", "upload"], key="w_source", horizontal=True,
        format_func={"example": "Example", "paste": "Paste", "upload": "Upload"}.get,
    )
    if source == "example":
        example = st.sidebar.selectbox("Example text", inputs.list_examples(),
                                       **bind("w_example", "example"))
        return inputs.read_example(example), None
    if source == "paste":
        seed("w_paste", st.session_state.get(PASTED_KEY) or inputs.read_example(state.example))
        text = st.sidebar.text_area("Paste a text", key="w_paste", height=180)
        st.session_state[PASTED_KEY] = text
        if not text.strip():
            return None, "The text is empty: paste or type some text (one word or more)."
        try:
            return serving_policy().check_text(text), None
        except InputRefused as error:
            return None, str(error)
    upload = st.sidebar.file_uploader("Upload a .txt file (UTF-8)", type=["txt"],
                                      key="w_text_upload")
    if upload is None:
        return None, "No file uploaded yet: choose a .txt file, or pick an example."
    try:
        serving_policy().check_text_bytes(upload.size, upload.name)
        text = serving_policy().check_text(inputs.decode_upload(upload.getvalue(), upload.name))
    except (TextInputError, InputRefused) as error:
        return None, str(error)
    if not text.strip():
        return None, f"{upload.name} is empty: upload a file with some text."
    return text, None


def link_text(text: str | None, custom: bool) -> None:
    """Name the analysed text in the view state and the link: a bundled example by its name
    (already bound), a custom text by ``textid`` plus, when short, the text itself."""
    if not custom or text is None:
        update_view(text_id=None)
        if TEXT_PARAM in st.query_params:
            del st.query_params[TEXT_PARAM]
        return
    key = text_store().put(text)
    update_view(text_id=key)
    payload = texts.encode_text(text)
    if payload is None:
        if TEXT_PARAM in st.query_params:
            del st.query_params[TEXT_PARAM]
    elif st.query_params.get(TEXT_PARAM) != payload:
        st.query_params[TEXT_PARAM] = payload
