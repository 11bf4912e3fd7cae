"""One lock for a fresh server's first heavy imports.

Why: Streamlit runs each session's script in its own thread, and ``app/serve.py`` warms the
first screen in another. When two of them import pandas, Plotly, PyTorch or the library at
the same moment, Python's import-deadlock avoidance can hand one thread a module that is
still being initialised (``partially initialized module 'pandas' has no attribute 'Series'``,
seen when two browser tabs opened a cold server together). Taking this lock around those
imports makes them happen one thread at a time; once done they are cached in
``sys.modules`` and the lock costs nothing.

This module imports nothing heavy itself, so importing it cannot take part in such a race.
"""

from __future__ import annotations

import threading

#: Held while a thread runs the app's heavy imports (re-entrant: a holder may import more).
HEAVY_IMPORTS = threading.RLock()
