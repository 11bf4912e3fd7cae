"""Ten users on one server (issue 12): sessions on the same link share the model run, the
predictions and the scores; only what differs is computed, once."""

from __future__ import annotations

from collections import Counter

import pytest
from apptest_helpers import assert_clean, metric, new_app

LINK = {"method": "kmeans", "B": "8", "k": "2", "window": "3"}
WORK = ("extract_one", "predict", "score")


@pytest.fixture
def calls(monkeypatch) -> Counter:
    """How often the model ran (extract_one) and a setting was predicted and scored."""
    from sparsefinder.explore import inputs, live

    counted: Counter = Counter()
    for module, name in ((inputs, "extract_one"), (live, "predict"), (live, "score")):
        original = getattr(module, name)

        def wrapper(*args, _name=name, _original=original, **kwargs):
            counted[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)
    return counted


def _work(calls: Counter) -> dict[str, int]:
    return {name: calls[name] for name in WORK}


def test_a_second_session_on_the_same_link_recomputes_nothing(with_projections, calls):
    first = new_app(**LINK).run()
    assert_clean(first)
    assert _work(calls) == {"extract_one": 1, "predict": 1, "score": 1}
    second = new_app(**LINK).run()  # another browser session, same link
    assert_clean(second)
    assert _work(calls) == {"extract_one": 1, "predict": 1, "score": 1}
    assert metric(second, "Model recall") == metric(first, "Model recall")


def test_a_slider_setting_is_computed_once_for_all_sessions(with_projections, calls):
    users = [new_app(**LINK).run() for _ in range(3)]
    for at in users:  # every user moves the window slider to the same value
        at.select_slider(key="w_window").set_value(5).run()
        assert_clean(at)
    assert _work(calls) == {"extract_one": 1, "predict": 2, "score": 2}
    users[0].select_slider(key="w_window").set_value(3).run()  # back: cached, not recomputed
    assert _work(calls) == {"extract_one": 1, "predict": 2, "score": 2}
    assert len({metric(at, "Model recall") for at in users[1:]}) == 1
