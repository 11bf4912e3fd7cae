"""sparsefinder.figures.head_lines: the standalone head-view page."""

from __future__ import annotations

import json
import re

from sparsefinder.explore.head_lines import HeadLines
from sparsefinder.figures import head_lines as figure


def _lines(tokens: list[str]) -> HeadLines:
    n = len(tokens)
    return HeadLines(layer=0, start=7, tokens=tokens, heads=[0, 3],
                     edges=[[[0, 0, 0.9, 1], [1, 0, 0.2, 2]], [[1, 1, 0.0, 3]]],
                     out_as_query=[[0] * n, [1] * n], out_as_key=[[2] * n, [0] * n])


def test_page_embeds_the_payload_and_loads_nothing_external():
    page = figure.head_lines_html(_lines(["the", "cat"]))
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>',
                                page, re.S).group(1))
    assert data["tokens"] == ["the", "cat"] and data["heads"] == [0, 3]
    assert data["edges"][1] == [[1, 1, 0.0, 3]] and data["start"] == 7
    assert "src=" not in page and "http://" not in page.replace("http://www.w3.org", "")


def test_hostile_tokens_cannot_break_out_of_the_script():
    evil = "</script><script>alert(1)</script><!--"
    page = figure.head_lines_html(_lines([evil, "x"]))
    assert page.count("</script>") == 2  # the payload's and the code's own closing tags
    payload = re.search(r'type="application/json">(.*?)</script>', page, re.S).group(1)
    assert json.loads(payload)["tokens"][0] == evil
    assert "innerHTML" not in page


def test_height_grows_with_the_window():
    assert figure.page_height(_lines(["a"] * 40)) - figure.page_height(_lines(["a"] * 20)) \
        == 20 * figure.ROW_PX


def test_the_selected_token_is_in_the_data_when_it_lies_in_the_window():
    lines = _lines(["the", "cat"])  # positions 7 and 8
    assert figure.view_data(lines, 8)["selected"] == {"side": "query", "index": 1}
    assert figure.view_data(lines, 7, "key")["selected"] == {"side": "key", "index": 0}
    assert figure.view_data(lines, 3)["selected"] is None
    assert figure.view_data(lines)["selected"] is None
    page = figure.head_lines_html(lines, selected=8)
    assert '"selected": {"side": "query", "index": 1}' in page


def test_the_component_code_draws_with_the_page_code_and_reports_clicks():
    assert figure.COMPONENT_JS.startswith(figure.DRAW_JS)
    assert 'setTriggerValue("token"' in figure.COMPONENT_JS
    assert "export default function" in figure.COMPONENT_JS
    assert "innerHTML" not in figure.COMPONENT_JS
