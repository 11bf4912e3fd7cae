"""The user's own model in the app: its prepared bundle, or preparing one in the background.

A model with a bundle from ``sparsefinder prepare`` (found by its weight fingerprint) gets its
learned methods: the bundle's projections here, its calibration table, key codebooks and hash
codes through the library's lookups. A model without one gets a "Prepare predictors for this
model" button. It starts ``python -m sparsefinder prepare`` as a separate process
(:mod:`sparsefinder.prepare_jobs`): not a model run of this server, which keeps its lock and
stays usable, and the job outlives a page rerun. Its progress bar rereads the job's progress
file every two seconds; when the job ends the page reruns and the learned methods appear.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import streamlit as st

from app.model_runs import cached_fingerprint
from app.text_source import serving_policy
from sparsefinder import prepare_jobs
from sparsefinder.bundle import MANIFEST, BundleError
from sparsefinder.model_bundles import bundle_folder, bundles_root, open_bundle

#: A cap on the passages of each split a browser-started prepare reads (a demo server or a
#: test); unset: the whole default corpus, as the command does.
ENV_MAX_PASSAGES = "SPARSEFINDER_PREPARE_MAX_PASSAGES"
BUTTON = "Prepare predictors for this model"
POLL_SECONDS = 2.0


@st.cache_resource(show_spinner=False)
def jobs() -> dict[str, subprocess.Popen]:
    """The prepare jobs this server started, by fingerprint: shared by sessions (one job per
    model, whoever asked) and kept over reruns."""
    return {}


def bundle_projections(name: str) -> Path | None:
    """The projections of the prepared bundle of ``name``'s weights (None: not prepared)."""
    folder = bundle_folder(cached_fingerprint(name))
    if not (folder / MANIFEST).is_file():
        return None
    try:
        path = open_bundle(folder, verify=False).best("projections")
    except BundleError:
        return None
    return path if path.is_file() else None


def own_projections(name: str, note: str | None) -> tuple[Path | None, str | None]:
    """The projections file and the note for a model named without one: its prepared
    bundle's (learned methods on), else none and the prepare action in the sidebar."""
    path = bundle_projections(name)
    if path is not None:
        st.sidebar.caption(f"Learned methods from this model's prepared bundle: `{path.parent}`")
        return path, None
    prepare_panel(name)
    if note and serving_policy().may_prepare(name):
        note += f" To fit them for this model: “{BUTTON}” in the sidebar."
    return None, note


def _extra_arguments() -> list[str]:
    value = os.environ.get(ENV_MAX_PASSAGES, "").strip()
    return ["--max-passages", value] if value.isdigit() and int(value) > 0 else []


def prepare_panel(name: str) -> None:
    """The sidebar's prepare action of a model without a bundle, or its job's progress."""
    fingerprint = cached_fingerprint(name)
    folder = bundle_folder(fingerprint)
    state = prepare_jobs.status(folder, jobs().get(fingerprint))
    with st.sidebar:
        if state.state == "running":
            _progress(fingerprint)
            return
        if state.state == "failed":
            st.error(f"Preparing predictors failed: {state.message}", icon=":material/error:")
        if not serving_policy().may_prepare(name):
            st.caption("Preparing predictors from the browser is only for the models on this "
                       "server's allowlist; its operator can run `sparsefinder prepare --model "
                       f"{name}` on the server.")
            return
        busy = [key for key, job in jobs().items() if job.poll() is None]
        if st.button(BUTTON, key="w_prepare", disabled=bool(busy),
                     help="Runs `sparsefinder prepare` in the background (minutes on a CPU): "
                          "projections, calibration, key codebooks, hash codes and the atlas "
                          "of this model. The app stays usable meanwhile."):
            jobs()[fingerprint] = prepare_jobs.start(name, bundles_root(), folder,
                                                     _extra_arguments())
            st.rerun()
        if busy:
            st.caption("Another model is being prepared on this server; one at a time.")


@st.fragment(run_every=POLL_SECONDS)
def _progress(fingerprint: str) -> None:
    """The running job's bar (stage, time left), reread every two seconds; the whole page
    reruns once the job has ended, so its learned methods (or its error) show."""
    state = prepare_jobs.status(bundle_folder(fingerprint), jobs().get(fingerprint))
    if state.state != "running":
        st.rerun(scope="app")
    st.progress(min(max(state.fraction, 0.0), 1.0),
                text=f"Preparing predictors: {state.label()}")
