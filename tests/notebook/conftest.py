"""One prepared text of the default model for the notebook tests (the model runs once)."""

from __future__ import annotations

import pytest

TEXT = "The cat sat on the mat because it was tired. Then it slept until the morning came."


@pytest.fixture(scope="module")
def prepared(default_model):
    from sparsefinder.notebook import session

    return session.prepare_text(default_model, TEXT)
