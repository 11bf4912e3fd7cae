"""Griffe extension for the docs build: Sphinx roles in docstrings become inline code.

The library's docstrings cross-reference with reST roles (:class:`AttentionRecord`,
:func:`~sparsefinder.graphs.extract`); Markdown would show the role name literally. This keeps
the name (the last dotted part for ``~`` targets) as inline code. Used only by mkdocs.yml.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|data|attr|mod|obj|exc|const):`(~?)([^`]+)`")


def _replace(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2).strip()
    if short:
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


class SphinxRoles(griffe.Extension):
    """Rewrite reST cross-reference roles of every loaded docstring."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_replace, obj.docstring.value)
