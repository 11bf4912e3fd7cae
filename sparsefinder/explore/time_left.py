"""An estimate of the time left, added to a progress message.

Why: a corpus run takes minutes on a CPU, and a bar alone does not say whether to wait or to
come back later. The estimate is the plain rate so far, ``elapsed · (1 − f) / f`` after a
fraction ``f`` of the work: work items of one run cost about the same (texts of one corpus,
grid points of one curve), and a cruder guess that is shown beats a better one that is not.
Nothing is estimated before ``MIN_FRACTION`` of the work or ``MIN_SECONDS`` have passed (the
first item's cost includes warm-ups that do not repeat).
"""

from __future__ import annotations

import time
from collections.abc import Callable

ProgressFn = Callable[[float, str], None]

#: No estimate before this fraction of the work is done…
MIN_FRACTION = 0.05
#: …or before this many seconds have passed.
MIN_SECONDS = 1.0


def format_duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``: the units a wait is read in."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def estimate(elapsed: float, fraction: float) -> float | None:
    """Seconds left after ``fraction`` of the work took ``elapsed`` seconds; None while too
    little is done to tell (see the module docstring)."""
    if fraction >= 1.0:
        return 0.0
    if fraction < MIN_FRACTION or elapsed < MIN_SECONDS:
        return None
    return elapsed * (1.0 - fraction) / fraction


def with_time_left(report: ProgressFn, clock: Callable[[], float] = time.monotonic
                   ) -> ProgressFn:
    """``report`` with "— about … left" appended to each message once an estimate exists;
    the clock starts now."""
    start = clock()

    def wrapped(fraction: float, message: str) -> None:
        left = estimate(clock() - start, fraction)
        suffix = f" — about {format_duration(left)} left" if left else ""
        report(fraction, f"{message}{suffix}")
    return wrapped
