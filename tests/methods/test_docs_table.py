"""The families' tables in docs/methods.md are the ones the registry generates."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparsefinder.methods.docs_table import families_table, render
from sparsefinder.methods.registry import METHODS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "methods.md"


def test_docs_tables_are_generated_from_the_registry() -> None:
    page = PAGE.read_text()
    assert render(page) == page, ("docs/methods.md's family tables are stale: run "
                                  "`python -m sparsefinder.methods.docs_table docs/methods.md`")


def test_every_family_and_curve_is_in_the_table() -> None:
    table = families_table()
    for name, method in METHODS.items():
        assert f"| `{name}` |" in table
        assert all(f"`{grid.name}`" in table for grid in method.curves)


def test_a_page_without_the_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="families:start"):
        render("# no tables here\n")
