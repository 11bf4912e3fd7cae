"""The README's restricted-attention example runs as written (after the library example)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _code(text: str, start: str, end: str) -> str:
    (code,) = re.findall(r"```python\n(.*?)```", text[text.index(start):text.index(end)],
                         flags=re.S)
    return code


@pytest.mark.slow
def test_restricted_example_runs(capsys):
    text = README.read_text(encoding="utf-8")
    code = (_code(text, "## Library", "## CLI")
            + _code(text, "## Sparsity–accuracy", "## Projections and calibrated"))
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - our own README
    assert namespace["out"].last_hidden_state.shape[0] == 2
    printed = capsys.readouterr().out
    assert "'output_cosine': " in printed and "'retrieval_top1': " in printed
