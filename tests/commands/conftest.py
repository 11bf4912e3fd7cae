"""Fixtures shared by the CLI command tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparsefinder.commands.clusters import default_projections


@pytest.fixture(scope="session")
def projections_file() -> Path:
    """The bundled projections with centroids for the default model (`make assets`)."""
    path = default_projections()
    assert path.is_file(), f"{path} is missing; run `make assets`"
    return path
