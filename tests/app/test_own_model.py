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


def _available(at) -> list[str]:
    from app.context import CONTEXT_KEY
    from sparsefinder.explore.availability import available_methods

    return available_methods(at.session_state[CONTEXT_KEY].prepared)


def test_own_model_prepare_in_the_background_then_its_learned_methods(
        tiny_model_dirs, tmp_path, monkeypatch):
    """A tiny local model without a bundle: the button starts `sparsefinder prepare` as a
    separate process; the sidebar shows its stage and time left while the page keeps
    working; when it ends the page lists the model as prepared and offers its learned
    methods (calibrated and raw distance, HashAttention)."""
    import time

    from sparsefinder.bundle import MANIFEST
    from sparsefinder.prepare_jobs import PROGRESS

    monkeypatch.setenv("SPARSEFINDER_CACHE_DIR", str(tmp_path))  # the job inherits it
    monkeypatch.setenv("SPARSEFINDER_PREPARE_MAX_PASSAGES", "12")
    name = str(tiny_model_dirs["bert"])
    at = _own(name).run()
    assert_clean(at)
    before = _available(at)
    assert "distance" not in before and not any(":budget" in m for m in before)
    assert any("“Prepare predictors for this model” in the sidebar" in i.value for i in at.info)
    at.button(key="w_prepare").click().run()
    assert_clean(at)
    bars = [p.proto.text for p in at.get("progress")]
    assert any(t.startswith("Preparing predictors: stage") for t in bars), bars
    assert at.button(key="w_prepare").disabled if "w_prepare" in [
        b.key for b in at.button] else True  # no second job while one runs
    folder = next((tmp_path / "bundles").glob("*/.prepare.log")).parent
    deadline = time.monotonic() + 300
    seen = set()
    while time.monotonic() < deadline and not (folder / MANIFEST).is_file():
        time.sleep(2)
        at.run()  # a rerun (another session, a slider) while it runs: no error, bar kept
        assert_clean(at)
        seen |= {p.proto.text.split(" · ")[0] for p in at.get("progress")}
    assert (folder / MANIFEST).is_file(), (folder / ".prepare.log").read_text()
    assert len(seen) >= 2, seen  # the bar moved through the stages
    assert (folder / PROGRESS).is_file()
    time.sleep(POLL_WAIT)
    at.run()
    assert_clean(at)
    methods = _available(at)
    assert {"distance-floor:budget", "distance:budget", "distance",
            "hashattention"} <= set(methods), methods
    assert not at.get("progress")
    assert any(name in c.value for c in at.caption if "Prepared" in c.value)


POLL_WAIT = 0.5  # the job has exited once its bundle is written


def test_own_model_prepare_refused_when_exposed_and_not_allowlisted(tiny_model_dirs,
                                                                   monkeypatch):
    from app import own_model
    from sparsefinder.serving import ServingPolicy

    name = str(tiny_model_dirs["bert"])
    policy = ServingPolicy(exposed=True, allowlist=(name,))
    assert policy.may_prepare(name) and not ServingPolicy(exposed=True).may_prepare(name)
    monkeypatch.setattr(own_model, "serving_policy", lambda: ServingPolicy(exposed=True,
                                                                            allowlist=()))
    at = _own(name).run()
    assert_clean(at)
    assert "w_prepare" not in [b.key for b in at.button]
    assert any("only for the models on this server's allowlist" in c.value for c in at.caption)
