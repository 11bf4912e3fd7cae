"""Atlas: every head of the model across the validation corpus — its pattern type, how sparse
it is, which heads look alike and where the predictor loses edges.

The atlas is computed once per model, α and number of passages (progress bar), then read
from the user cache (``sparsefinder.explore.atlas.cache_dir``). Page settings live in the
link: ``acolor`` (the grid's statistic), ``afilter`` (e.g. ``pred_recall<0.7``), ``apass``
(passages; absent = all), plus the shared ``layer``/``head``.
"""

from __future__ import annotations

import urllib.parse

import streamlit as st

from app import shell
from app.progress import progress_bar
from sparsefinder.analysis.atlas import AtlasInputError, HeadAtlas
from sparsefinder.analysis.atlas_io import atlas_to_dict
from sparsefinder.explore import atlas as exatlas
from sparsefinder.explore import tables
from sparsefinder.figures import atlas as atlas_figures
from sparsefinder.figures import common as common_figures

st.title("Atlas")

PASSAGE_CHOICES = (0, 8, 16, 32)  # 0 = every validation passage
_PARAMS = {"w_at_color": ("acolor", "pred_recall"), "w_at_filter": ("afilter", ""),
           "w_at_pass": ("apass", 0)}


def _seed_from_url() -> None:
    for key, (param, default) in _PARAMS.items():
        if key in st.session_state:
            continue
        raw = st.query_params.get(param)
        value = default
        if raw is not None:
            if key == "w_at_pass":
                value = int(raw) if raw.isdigit() and int(raw) in PASSAGE_CHOICES else default
            elif key == "w_at_color":
                value = raw if raw in exatlas.STATISTICS else default
            else:
                value = raw
        st.session_state[key] = value


def _to_url(key: str) -> None:
    param, default = _PARAMS[key]
    value = st.session_state.get(key, default)
    if value == default:
        if param in st.query_params:
            del st.query_params[param]
    elif st.query_params.get(param) != str(value):
        st.query_params[param] = str(value)


def _atlas(ctx: shell.AppContext, passages: int) -> tuple[HeadAtlas | None, bool]:
    request = exatlas.AtlasRequest(ctx.loaded.model_id, float(ctx.state.alpha),
                                   max_passages=passages or None)
    try:
        with progress_bar("Atlas") as bar:
            return shell.atlas(ctx.state.model, request, on_progress=bar.stage())
    except (AtlasInputError, ValueError) as error:
        st.error(f"No atlas for this model and corpus: {error}", icon=":material/error:")
        return None, False


def _pick_from_grid() -> None:
    points = (st.session_state.get("w_at_grid") or {}).get("selection", {}).get("points", [])
    if points:
        shell.update_view(layer=int(points[0]["y"]), head=int(points[0]["x"]))


def _pick_from_map() -> None:
    points = (st.session_state.get("w_at_map") or {}).get("selection", {}).get("points", [])
    if points and points[0].get("customdata") is not None:
        layer, head = points[0]["customdata"][:2]
        shell.update_view(layer=int(layer), head=int(head))


def _explorer_url(atlas: HeadAtlas, ctx: shell.AppContext, layer: int, head: int) -> str:
    params = exatlas.explorer_params(atlas, layer, head, ctx.state.model, ctx.state.alpha)
    if "textid" in params:  # a long text travels by name: the server must know it
        shell.text_store().put(atlas.texts[params["textid"]])
    return "./?" + urllib.parse.urlencode(params)


def _head_card(atlas: HeadAtlas, ctx: shell.AppContext, layer: int, head: int) -> None:
    row = atlas.head_row(layer, head)
    left, right = st.columns([3, 1], vertical_alignment="center")
    left.subheader(f"L{layer}H{head} · {row['type_label']}")
    right.link_button("Open in the Explorer", _explorer_url(atlas, ctx, layer, head),
                      help="This head on the text where it is most typical, at that row.")
    cols = st.columns(6)
    cols[0].metric("Gold sparsity", f"{row['gold_sparsity']:.3f}",
                   help=f"10th–90th percentile over texts: {row['gold_sparsity_q10']:.3f}–"
                        f"{row['gold_sparsity_q90']:.3f}; change per 100 tokens: "
                        f"{row['sparsity_per_100_tokens']:+.3f}")
    cols[1].metric("Keys per row", f"{row['support']:.1f}",
                   help=f"median {row['support_q50']:.0f}, 90th percentile "
                        f"{row['support_q90']:.0f}")
    cols[2].metric("Entropy (nats)", f"{row['entropy']:.2f}")
    cols[3].metric("Distance (tokens)", f"{row['distance']:.1f}",
                   help="Mean attended distance |i − j|, weighted by probability")
    cols[4].metric("Contiguous rows", f"{row['contiguous']:.0%}")
    recall = row.get("pred_recall")
    cols[5].metric("Predictor recall", "—" if recall is None or recall != recall
                   else f"{recall:.3f}",
                   help=f"mass recall {row.get('pred_mass_recall', float('nan')):.3f}, exact "
                        f"rows {row.get('pred_exact_fraction', float('nan')):.3f}")
    st.caption("Mass on: " + " · ".join(
        f"{name} {row[name]:.0%}" for name in ("diagonal", "previous", "next", "first", "last",
                                               "punctuation")))
    st.plotly_chart(atlas_figures.distributions_figure(atlas, layer, head),
                    config=common_figures.chart_config(f"atlas_L{layer}H{head}"),
                    key="w_at_dist")
    examples = atlas.examples.get(f"{layer}.{head}") or []
    st.markdown("**Typical rows** (nearest to the head's mean behaviour; positions in "
                "brackets, then each key's probability)")
    for example in examples:
        keys = ", ".join(f"`{tok}` ({j}) {p:.2f}" for j, tok, p in example["keys"])
        st.markdown(f"- query `{example['token']}` ({example['query']}) of a "
                    f"{example['n_tokens']}-token text → {keys}")


@st.fragment
def atlas_view() -> None:
    ctx = shell.context()
    if ctx.loaded is None:
        shell.show_messages(ctx)
        return
    _seed_from_url()
    top = st.columns([2, 3, 1], vertical_alignment="bottom")
    top[0].selectbox("Colour by", list(exatlas.STATISTICS), key="w_at_color",
                     format_func=exatlas.STATISTICS.get, on_change=_to_url, args=("w_at_color",))
    top[1].text_input("Filter heads", key="w_at_filter", placeholder="e.g. gold_sparsity>0.95",
                      on_change=_to_url, args=("w_at_filter",),
                      help="COLUMN<VALUE (or >, <=, >=), COLUMN a column of the heads.csv "
                           "download: " + ", ".join(f"{c} ({w})" for c, w in
                                                   exatlas.STATISTICS.items()))
    top[2].selectbox("Passages", PASSAGE_CHOICES, key="w_at_pass", on_change=_to_url,
                     args=("w_at_pass",), format_func=lambda p: "all" if p == 0 else str(p))
    atlas, cached = _atlas(ctx, int(st.session_state["w_at_pass"]))
    if atlas is None:
        return
    meta = atlas.meta
    st.caption(f"{meta.get('model')} · α = {meta.get('alpha')} · {meta.get('n_texts')} "
               f"{meta.get('split')} texts, {meta.get('n_rows')} rows · predictor: "
               f"{exatlas.predictor_words(meta.get('predictor'))}"
               + (" · from the cache" if cached else ""))
    state = shell.view_state()
    layer = min(state.layer, atlas.num_layers - 1)
    head = min(state.head, atlas.num_heads - 1)
    column = st.session_state["w_at_color"]
    try:
        rule = exatlas.parse_filter(st.session_state["w_at_filter"], list(exatlas.STATISTICS))
    except ValueError as error:
        st.warning(str(error), icon=":material/warning:")
        rule = None
    keep = exatlas.filter_mask(atlas.heads, rule)
    grid_col, types_col = st.columns([1, 1])
    with grid_col:
        st.markdown(f"**Layers × heads** · {exatlas.STATISTICS[column]}; click a head")
        st.plotly_chart(atlas_figures.grid_figure(atlas, column, exatlas.STATISTICS[column],
                                                  (layer, head), keep.to_numpy()),
                        config=common_figures.chart_config(f"atlas_{column}"), key="w_at_grid",
                        on_select=_pick_from_grid, selection_mode="points")
        st.caption("Symbols: " + atlas_figures.symbol_key())
    with types_col:
        st.markdown("**Pattern types per layer**")
        types = exatlas.type_table(atlas)
        st.dataframe(types, height=36 * (len(types) + 1) + 4)
    if rule is not None:
        shown = atlas.heads.loc[keep, ["layer", "head", "type", rule[0], "gold_sparsity"]]
        st.markdown(f"**{len(shown)} heads with {st.session_state['w_at_filter'].strip()}**")
        st.dataframe(shown.rename(columns={**exatlas.STATISTICS, "type": "pattern type"}),
                     hide_index=True)
    _head_card(atlas, ctx, layer, head)
    sim_col, map_col = st.columns(2)
    with sim_col:
        st.markdown("**Head similarity** · mean Jensen–Shannon divergence, clustered")
        st.plotly_chart(atlas_figures.similarity_figure(atlas),
                        config=common_figures.chart_config("atlas_similarity"), key="w_at_sim")
    with map_col:
        st.markdown("**Map of heads** · MDS of the divergences; click a head")
        st.plotly_chart(atlas_figures.map_figure(atlas, (layer, head)),
                        config=common_figures.chart_config("atlas_map"), key="w_at_map",
                        on_select=_pick_from_map, selection_mode="points")
    left, right = st.columns(2)
    left.download_button("heads.csv", lambda: tables.to_csv(atlas.heads),
                         file_name="heads.csv", mime="text/csv", on_click="ignore",
                         key="w_at_csv")
    right.download_button("atlas.json", lambda: tables.to_json(atlas_to_dict(atlas)),
                          file_name="atlas.json", mime="application/json", on_click="ignore",
                          key="w_at_json")


atlas_view()
