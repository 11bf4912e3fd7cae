"""The server's warm-up fills exactly the caches the default link's first visit reads."""

from __future__ import annotations

import subprocess
import sys

from apptest_helpers import ROOT, assert_clean, new_app


def test_after_the_warm_up_the_first_visit_runs_no_model_and_predicts_nothing_new(monkeypatch):
    from app import model_runs, warmup
    from app.binding import VIEW_KEY
    from app.context import CONTEXT_KEY
    from sparsefinder.explore import inputs, live

    key = warmup.warm_first_screen()
    assert key is not None, "the bundle's projections are missing: `make assets`"
    extracted, loads, predicted = [], [], []
    extract_one, load_model, predict = inputs.extract_one, model_runs.load_model, live.predict
    monkeypatch.setattr(inputs, "extract_one",
                        lambda *a, **k: extracted.append(1) or extract_one(*a, **k))
    monkeypatch.setattr(model_runs, "load_model",
                        lambda *a, **k: loads.append(1) or load_model(*a, **k))
    monkeypatch.setattr(live, "predict",
                        lambda prepared, spec, *a, **k: predicted.append(spec.key)
                        or predict(prepared, spec, *a, **k))
    at = new_app().run()
    assert_clean(at)
    assert loads == [] and extracted == [], "the first visit ran the model again"
    shown = live.spec_for(at.session_state[VIEW_KEY], at.session_state[CONTEXT_KEY].prepared)
    assert shown.key not in predicted, "the first screen predicted its setting again"


def test_serve_passes_its_options_to_streamlit_run():
    """``python -m app.serve`` is ``streamlit run app/main.py`` with the same options."""
    done = subprocess.run([sys.executable, "-m", "app.serve", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--server.port" in done.stdout  # the options of `streamlit run`
