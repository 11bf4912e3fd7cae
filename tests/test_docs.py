"""The documentation site builds cleanly, speaks to users, and its examples run as written.

- ``mkdocs build --strict`` (what ``make docs`` runs) into a temporary folder: any warning
  (a broken link or anchor, a page missing from the nav, a docstring the API reference
  cannot render, a module path that no longer exists) fails the build, and any WARNING line
  fails this test even if a future mkdocs stopped turning it into an error;
- no page of the site (its Markdown, and the built pages, where docstrings render into the
  API reference) and not the README points to our issue tracker ("issue 13", "#12"): they
  are user documentation, not a development log;
- the examples of ``docs/library.md`` run in order, in one namespace, as a reader would paste
  them (the model run restricted to a predicted graph and the calibrated predictor included).
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
LIBRARY = DOCS / "library.md"

#: References to issues or pull requests of a tracker: "issue 13", "issues 4 and 5",
#: "#12", "PR 7", "GH-3". A heading ("## Library") or a colour ("#1f77b4") is not one.
ISSUE_REFERENCE = re.compile(
    r"\bissues? #?\d+|(?<![\w&#/])#\d+\b|\bPR #?\d+\b|\bGH-\d+\b", re.IGNORECASE)


def _mkdocs() -> list[str]:
    exe = Path(sys.executable).with_name("mkdocs")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "mkdocs"]


def _visible_text(page: str) -> str:
    """The text of an HTML page as a reader sees it (no scripts, styles or tags)."""
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def _user_pages() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_site_builds_strict_without_warnings(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [*_mkdocs(), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    assert not [line for line in log.splitlines() if "WARNING" in line], log
    assert (tmp_path / "site" / "index.html").is_file()
    # The API reference really rendered the package (not an empty page).
    reference = (tmp_path / "site" / "reference" / "methods" / "index.html").read_text(
        encoding="utf-8")
    assert "PredictorSpec" in reference and "predict_record" in reference
    # What a reader sees, API reference included (docstrings render into it), names no issue.
    for page in (tmp_path / "site").rglob("*.html"):
        found = ISSUE_REFERENCE.findall(_visible_text(page.read_text(encoding="utf-8")))
        assert not found, f"{page.relative_to(tmp_path / 'site')} shows {found}"


def test_pattern_tells_issue_references_from_markdown():
    for text in ("see issue 13", "Issues 4", "(#12)", "fixed in PR 7", "GH-3"):
        assert ISSUE_REFERENCE.search(text), text
    for text in ("## Library", "colour #1f77b4", "`&#8203;`", "issues are welcome",
                 "L3H1", "R@0.90", "https://example.org/a#b2"):
        assert not ISSUE_REFERENCE.search(text), text


@pytest.mark.parametrize("page", _user_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_issue_numbers_in_user_docs(page):
    text = page.read_text(encoding="utf-8")
    found = [m.group(0) for m in ISSUE_REFERENCE.finditer(text)]
    assert not found, f"{page.relative_to(REPO)} mentions {found}"


def test_every_page_is_in_the_nav():
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    for page in DOCS.rglob("*.md"):
        assert page.relative_to(DOCS).as_posix() in config, f"{page} is not in mkdocs.yml nav"


def test_readme_screenshot_is_small_enough():
    image = DOCS / "images" / "explorer.png"
    assert "docs/images/explorer.png" in (REPO / "README.md").read_text(encoding="utf-8")
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert image.stat().st_size < 300_000


@pytest.mark.slow
def test_library_examples_run(capsys):
    """The four examples of docs/library.md, in order, in one namespace."""
    import torch

    blocks = re.findall(r"```python\n(.*?)```", LIBRARY.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 4
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for block in blocks:
            exec(compile(block, str(LIBRARY), "exec"), namespace)  # noqa: S102 - our own docs
    printed = capsys.readouterr().out

    # 1. From a text to scores.
    record, scores = namespace["record"], namespace["scores"]
    assert record.num_layers == 6 and scores.recall.shape == (6, 12)
    assert "kmeans n_clusters=8 top_k=2 ∪ window 3" in printed
    # 2. The model on a predicted graph: a padded batch of two, and the comparison printed.
    assert namespace["out"].last_hidden_state.shape[0] == 2
    assert "'output_cosine': " in printed and "'retrieval_top1': " in printed
    # 3. A calibrated predictor: one layer's bool mask over the text's tokens.
    mask, n = namespace["mask"], record.n_tokens
    assert mask.dtype == torch.bool and tuple(mask.shape) == (12, n, n)
    assert 0 < 1 - mask.float().mean().item() < 1
    # 4. The bundled files, through their manifest.
    assert namespace["best"].name == "projections-r8-lowrank-mass.pt"
    assert namespace["problems"] == [] and "block_projections-b32.pt" in printed
