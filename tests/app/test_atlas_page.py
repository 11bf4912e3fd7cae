"""Atlas page through AppTest: computed once then from the disk cache, grid by any
statistic, filters and head choice in the link, head card with an Explorer link."""

from __future__ import annotations

import re
import time
import urllib.parse

import pytest
from apptest_helpers import assert_clean, figures, new_app


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSEFINDER_CACHE_DIR", str(tmp_path))
    return tmp_path / "atlas"


def _open(**params):
    at = new_app(**params).run()
    at.switch_page("app_pages/atlas.py").run()
    assert_clean(at)
    return at


def _grid(at) -> dict:
    grids = [f for f in figures(at) if f["data"] and f["data"][0].get("mode") == "markers+text"
             and f["layout"].get("yaxis", {}).get("title", {}).get("text") == "layer"]
    assert grids, "no layer × head grid"
    return grids[0]


def test_atlas_page_computes_caches_and_follows_the_link(cache):
    at = _open(apass="8", layer="2", head="5", acolor="entropy", afilter="pred_recall<0.8")
    assert not at.error and not at.warning
    assert len(list(cache.glob("*.json"))) == 1  # computed once, kept on disk
    caption = at.caption[0].value
    assert "8 validation texts" in caption and "from the cache" not in caption
    grid = _grid(at)
    assert len(grid["data"][0]["x"]) == 72
    assert grid["layout"]["xaxis"]["title"]["text"] == "head"
    assert grid["data"][0]["marker"]["colorbar"]["title"]["text"] == "entropy per row (nats)"
    assert any("**S** first-token/sink" in c.value for c in at.caption)  # the symbols' key
    rows = [m.value for m in at.markdown if m.value.startswith("- query `")]
    assert rows and all(re.search(r"` \(\d+\) 0\.\d+", r) for r in rows)  # positions
    assert any(h.value.startswith("L2H5 · ") for h in at.subheader)
    labels = [m.label for m in at.metric]
    assert "Predictor recall" in labels and "Gold sparsity" in labels
    assert any(m.value.startswith("**") and "pred_recall<0.8" in m.value for m in at.markdown)
    # the Explorer link: this head, at its typical row of its typical text
    link = next(b for b in at.get("link_button"))
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(link.proto.url).query))
    assert (query["layer"], query["head"]) == ("2", "5")
    assert "query" in query and "textid" in query
    # the colour, the filter and the head are in the link
    at.selectbox(key="w_at_color").set_value("pred_mass_recall").run()
    assert at.query_params["acolor"] == "pred_mass_recall"
    assert at.query_params["afilter"] == "pred_recall<0.8"
    at.text_input(key="w_at_filter").set_value("recall<<").run()
    assert any("STATISTIC<VALUE" in w.value for w in at.warning)
    # a second session opens from the disk cache, without running the atlas again
    start = time.perf_counter()
    again = _open(apass="8")
    opened = time.perf_counter() - start
    assert "from the cache" in again.caption[0].value
    print(f"atlas page from the disk cache: {opened:.2f} s (incl. the app's first run)")


def test_unknown_url_values_fall_back(cache):
    at = _open(apass="7", acolor="nonsense")
    assert at.selectbox(key="w_at_color").value == "pred_recall"
    assert at.selectbox(key="w_at_pass").value == 0  # 7 is not offered: all passages
