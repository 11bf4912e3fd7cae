"""The README's library example runs as written (``docs/library.md`` has the longer ones)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Library"):text.index("## CLI")]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return code


def test_library_example_is_short():
    """The README shows the shortest path; the docs carry the rest."""
    assert len(_example().strip().splitlines()) <= 12


@pytest.mark.slow
def test_library_example_runs(capsys):
    code = _example()
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - our own README
    scores, masks, record = namespace["scores"], namespace["masks"], namespace["record"]
    assert len(masks) == record.num_layers == 6
    assert all(tuple(m.shape) == (12, record.n_tokens, record.n_tokens) for m in masks)
    assert scores.recall.shape == scores.sparsity.shape == (6, 12)
    assert 0 < float(scores.recall.mean()) <= 1 and 0 < float(scores.sparsity.mean()) < 1
    label, recall, sparsity = capsys.readouterr().out.strip().rsplit(" ", 2)
    assert label == "kmeans n_clusters=8 top_k=2 ∪ window 3"
    assert float(recall) == pytest.approx(float(scores.recall.mean()))
    assert float(sparsity) == pytest.approx(float(scores.sparsity.mean()))
