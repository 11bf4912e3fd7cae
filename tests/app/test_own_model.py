"""The app on the user's own model: a model that reads few tokens, prepared bundles in the
model box, and the background "Prepare predictors for this model" action (AppTest)."""

from __future__ import annotations

from apptest_helpers import assert_clean, new_app


def _own(name: str, **query):
    at = new_app(**query)
    at.session_state["w_model_kind"] = "custom"
    at.session_state["w_model_name"] = name
    return at


def test_own_model_reading_64_tokens_shows_the_default_example_in_parts(tiny_model_dirs):
    """A 64-position model on the default example: parts that fit it, never the chunker's
    "leaves no room for text" error."""
    at = _own(str(tiny_model_dirs["bert"])).run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    notes = " ".join(w.value for w in at.warning)
    assert "the model reads 64 at a time" in notes
    assert "overlap by about 15 tokens" in notes  # a quarter of 62 text tokens, not 64
    assert at.selectbox(key="w_part").options  # the part picker is there
