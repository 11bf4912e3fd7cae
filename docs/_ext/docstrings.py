"""Griffe extension for the docs build: docstrings made readable as Markdown user docs.

- The library's docstrings cross-reference with reST roles (:class:`AttentionRecord`,
  :func:`~sparsefinder.data.records.extract`); Markdown would show the role name literally.
  This keeps the name (the last dotted part for ``~`` targets) as inline code.
- A few docstrings point to the project's issue tracker ("(issue 13)"), which means nothing
  to a reader of the API reference; those parentheses are dropped from the rendered page.

Only the rendered site changes, never the code. Used by mkdocs.yml.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|data|attr|mod|obj|exc|const):`(~?)([^`]+)`")
ISSUE = re.compile(r" ?\((?:see )?issues? #?\d+(?:(?:,| and) #?\d+)*\)", re.IGNORECASE)


def _replace(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2).strip()
    if short:
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def readable(docstring: str) -> str:
    """A docstring with reST roles as inline code and issue-tracker parentheses dropped."""
    return ISSUE.sub("", ROLE.sub(_replace, docstring))


class ReadableDocstrings(griffe.Extension):
    """Rewrite every loaded docstring with :func:`readable`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = readable(obj.docstring.value)
