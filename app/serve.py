"""``python -m app.serve [streamlit options]``: ``streamlit run app/main.py``, warming the
first screen as the server starts (what ``make run`` and the Dockerfile run).

Why: a fresh server imported PyTorch and loaded the model only once a browser had connected,
so the first visit waited for all of it. Here a thread starts that work
(:func:`app.warmup.warm_first_screen`) while the server comes up and the browser loads the
page. A failed warm-up costs nothing but the head start: the session computes as before.
"""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

MAIN = Path(__file__).with_name("main.py")


def _warm() -> None:
    # cached functions called outside a session log "missing ScriptRunContext": expected here
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").setLevel(
        logging.ERROR)
    try:
        from app.import_lock import HEAVY_IMPORTS

        with HEAVY_IMPORTS:  # not at once with a first session's imports (import_lock says why)
            from app import warmup
        warmup.warm_first_screen()
    except Exception as error:  # only the head start is lost; the first session says why
        print(f"Sparsefinder: first screen not warmed ({type(error).__name__}: {error})",
              file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    """Start the warm-up thread, then Streamlit's own ``run`` command on ``app/main.py``."""
    from streamlit.web import cli

    threading.Thread(target=_warm, name="sparsefinder-warmup", daemon=True).start()
    sys.argv = ["streamlit", "run", str(MAIN), *(sys.argv[1:] if argv is None else argv)]
    cli.main()


if __name__ == "__main__":
    main()
