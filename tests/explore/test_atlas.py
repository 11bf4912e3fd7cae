"""The Atlas page's view-model: disk cache, filters, Explorer links, the default setting."""

from __future__ import annotations

import sys
import urllib.parse
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "analysis"))
from synthetic_heads import synthetic_record  # noqa: E402

from sparsefinder.analysis import atlas as analysis_atlas  # noqa: E402
from sparsefinder.analysis.atlas import compute_atlas  # noqa: E402
from sparsefinder.analysis.atlas_predictor import default_spec  # noqa: E402
from sparsefinder.explore import atlas as exatlas  # noqa: E402
from sparsefinder.explore import texts  # noqa: E402
from sparsefinder.explore.state import ViewState, parse_view_state, to_spec  # noqa: E402


@pytest.fixture(scope="module")
def atlas():
    records = [synthetic_record(n, seed=s) for s, n in enumerate((12, 16, 20, 24))]
    return compute_atlas(lambda: records)


def test_the_atlas_scores_the_apps_default_setting():
    assert default_spec() == to_spec(ViewState())


def test_text_names_match_the_apps_links():
    assert analysis_atlas.text_id("héllo wörld") == texts.text_id("héllo wörld")


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSEFINDER_CACHE_DIR", str(tmp_path))
    assert exatlas.cache_dir() == tmp_path / "atlas"
    monkeypatch.delenv("SPARSEFINDER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert exatlas.cache_dir() == tmp_path / "xdg" / "sparsefinder" / "atlas"


def test_computed_once_then_read_from_disk(tiny_entmax_bert, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"Passage {i}: the cat sat on the mat, then it ran off."
                                  for i in range(5)), encoding="utf-8")
    request = exatlas.AtlasRequest("tiny", 1.5, corpus=str(corpus), split="all")
    seen = []
    first, cached = exatlas.atlas_for(tiny_entmax_bert, request, root=tmp_path / "cache",
                                      on_progress=lambda f, m: seen.append(f))
    assert not cached and seen[-1] == 1.0 and seen == sorted(seen)
    assert exatlas.cached_atlas(request, root=tmp_path / "cache") is not None

    def boom(*args, **kwargs):
        raise AssertionError("recomputed instead of read from the cache")

    monkeypatch.setattr(exatlas, "corpus_records", boom)
    again, cached = exatlas.atlas_for(tiny_entmax_bert, request, root=tmp_path / "cache")
    assert cached and again.heads.equals(first.heads)
    other = exatlas.AtlasRequest("tiny", 2.0, corpus=str(corpus), split="all")
    assert exatlas.cached_atlas(other, root=tmp_path / "cache") is None


def test_filters(atlas):
    columns = list(exatlas.STATISTICS)
    rule = exatlas.parse_filter("previous >= 0.5", columns)
    assert rule == ("previous", ">=", 0.5)
    assert atlas.heads.loc[exatlas.filter_mask(atlas.heads, rule), "type"].tolist() == [
        "previous"]
    assert exatlas.filter_mask(atlas.heads, None).all()
    assert not exatlas.filter_mask(atlas.heads, ("pred_recall", "<", 0.7)).any()  # NaN: out
    for bad in ("recall<0.7", "pred_recall<<1", "pred_recall<nan", "import os"):
        with pytest.raises(ValueError, match="STATISTIC<VALUE"):
            exatlas.parse_filter(bad, columns)
    assert exatlas.parse_filter("  ", columns) is None


def test_explorer_link_opens_the_head_on_its_typical_row(atlas):
    params = exatlas.explorer_params(atlas, 0, 1, "default", 1.5)
    example = atlas.examples["0.1"][0]
    assert params["layer"] == "0" and params["head"] == "1"
    assert params["query"] == str(example["query"]) and params["textid"] == example["text_id"]
    assert texts.decode_text(params["text"], params["textid"]) == atlas.texts[example["text_id"]]
    url = urllib.parse.urlencode(params)
    state, problems = parse_view_state(dict(urllib.parse.parse_qsl(url)))
    assert not problems
    assert (state.layer, state.head, state.query, state.text_id) == (
        0, 1, example["query"], example["text_id"])


def test_type_table_counts_every_head(atlas):
    table = exatlas.type_table(atlas)
    assert table["all"].sum() == len(atlas.heads)
    assert list(table.columns) == ["L0", "all"]
    assert "first-token/sink" in table.index


def test_predictor_is_named_in_words():
    words = exatlas.predictor_words("distance-floor:budget target_sparsity=0.9")
    assert "distance-floor" not in words and "target_sparsity" not in words
    assert words.endswith("target sparsity 0.9")
    assert exatlas.predictor_words(None) == "none for this model"
