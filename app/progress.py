"""The app's progress bar: one ``st.progress`` for a long computation, with the time left.

Why one class: every long run (validation corpus, atlas, accuracy axis, the sweeps of a text)
shows the same thing — what is being done, how far, and about how long is left
(:mod:`sparsefinder.explore.time_left`) — and a run in stages (gold graphs, then sweeps)
maps each stage onto its share of one bar, so the estimate covers the whole wait.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import streamlit as st

from sparsefinder.explore.time_left import with_time_left

ProgressFn = Callable[[float, str], None]


class ProgressBar:
    """An ``st.progress`` bar labelled ``label``; :meth:`stage` gives the callbacks."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._bar = st.progress(0.0, text=f"{label}: waiting for the model…")
        self._report = with_time_left(self._draw)

    def _draw(self, fraction: float, message: str) -> None:
        self._bar.progress(min(max(fraction, 0.0), 1.0), text=f"{self.label}: {message}")

    def stage(self, low: float = 0.0, high: float = 1.0) -> ProgressFn:
        """A callback whose fractions [0, 1] fill the bar from ``low`` to ``high``."""
        return lambda fraction, message: self._report(low + (high - low) * fraction, message)

    def empty(self) -> None:
        self._bar.empty()


@contextmanager
def progress_bar(label: str) -> Iterator[ProgressBar]:
    """A :class:`ProgressBar` that disappears when the block ends, however it ends."""
    bar = ProgressBar(label)
    try:
        yield bar
    finally:
        bar.empty()
