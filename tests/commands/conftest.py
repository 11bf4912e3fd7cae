"""Fixtures shared by the CLI command tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparsefinder.commands.clusters import DEFAULT_PROJECTIONS


@pytest.fixture(scope="session")
def projections_file() -> Path:
    """The bundled projections for the default model (reproduced by `make assets`)."""
    assert DEFAULT_PROJECTIONS.is_file(), f"{DEFAULT_PROJECTIONS} is missing; run `make assets`"
    return DEFAULT_PROJECTIONS
