"""tools/news_corpus.py reads the Reuters articles of R's tm package without R."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sparsefinder.data.corpus import load_texts

TOOL = Path(__file__).resolve().parents[2] / "tools" / "news_corpus.py"
spec = importlib.util.spec_from_file_location("news_corpus", TOOL)
news = importlib.util.module_from_spec(spec)
spec.loader.exec_module(news)

ARTICLE = """<?xml version="1.0"?>
<REUTERS TOPICS="YES" NEWID="{id}">
 <TEXT>
  <TITLE>HEADLINE IN CAPITALS</TITLE>
  <DATELINE>NEW YORK, Feb 26 -</DATELINE>
  <BODY>{body}</BODY>
 </TEXT>
</REUTERS>
"""


def _texts(tmp_path: Path, acq: list[str], crude: list[str]) -> Path:
    for folder, bodies in (("acq", acq), ("crude", crude)):
        (tmp_path / folder).mkdir(parents=True)
        for i, body in enumerate(bodies):
            (tmp_path / folder / f"reut-{i:05d}.xml").write_text(ARTICLE.format(id=i, body=body))
    return tmp_path


def test_writes_each_article_body_on_one_line_without_headline_or_signature(tmp_path):
    texts = _texts(tmp_path / "texts",
                   ["Oil prices rose\n    on Monday, &quot;sharply&quot; said\nanalysts.\n Reuter",
                    "Too short."],
                   ["Crude output fell\nagain in March, the ministry said.\n Reuter"])
    out = tmp_path / "news.txt"
    assert news.main([str(texts), "--out", str(out), "--min-words", "4"]) == 0
    assert load_texts(out) == ['Oil prices rose on Monday, "sharply" said analysts.',
                               "Crude output fell again in March, the ministry said."]


def test_a_folder_without_articles_is_refused_with_the_reason(tmp_path):
    (tmp_path / "acq").mkdir()
    with pytest.raises(SystemExit, match="is this the r-cran-tm package"):
        news.main([str(tmp_path), "--out", str(tmp_path / "news.txt")])
