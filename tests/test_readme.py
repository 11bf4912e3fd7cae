"""The README's library example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_library_example_runs(capsys):
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Library"):text.index("## CLI")]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - our own README
    scores, masks, record = namespace["scores"], namespace["masks"], namespace["record"]
    assert len(masks) == record.num_layers == 6
    assert scores.recall.shape == (6, 12) and 0 < float(scores.sparsity.mean()) < 1
    assert "kmeans n_clusters=8 top_k=2 ∪ window 3" in capsys.readouterr().out
