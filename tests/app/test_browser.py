"""The real app in a real browser: `streamlit run` + Debian's chromium through Playwright.

Marked ``browser``; skipped (with the reason) only when /usr/bin/chromium is missing —
`make test` installs it, so CI runs these. Screenshots go to artifacts/ (gitignored).
"""

from __future__ import annotations

import time

import pytest
from browser_helpers import ARTIFACTS, CHROMIUM, PLOTS_JS, SKIP_REASON, wait_until_idle

METRIC_JS = """(label) => {
  for (const m of document.querySelectorAll('[data-testid="stMetric"]')) {
    const l = m.querySelector('[data-testid="stMetricLabel"]');
    if (l && l.textContent.trim() === label) {
      return m.querySelector('[data-testid="stMetricValue"]').textContent.trim();
    }
  }
  return null;
}"""

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=SKIP_REASON),
]


@pytest.fixture(scope="module")
def page(browser):
    page = browser.new_page(viewport={"width": 1600, "height": 1800})
    yield page
    page.close()


def _wait_for_explorer(page) -> None:
    """The six headline metrics (recall, sparsity at three scopes) and two figures."""
    page.wait_for_function(
        "document.querySelectorAll('[data-testid=\"stMetricValue\"]').length >= 6 && "
        f"{PLOTS_JS}.length >= 2", timeout=240_000)


def test_deep_link_to_a_page_works_on_first_load(server, page):
    """First request of a fresh server (regression: a pages/ folder made it legacy MPA)."""
    page.goto(f"{server}/tokens?method=fixed&window=3&global=first,last&query=5",
              timeout=240_000)
    # Wait for this page's own metric as well as a figure: a drawn figure does not prove the
    # metrics have arrived (CI once read the metric a moment too early).
    page.wait_for_function(f"{PLOTS_JS}.length >= 1 && "
                           f"({METRIC_JS})('Predicted keys per head') !== null",
                           timeout=240_000)
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.evaluate(METRIC_JS, "Predicted keys per head") == "5.0"  # window + globals
    page.screenshot(path=str(ARTIFACTS / "browser_tokens.png"))


def test_slider_move_updates_metrics_in_the_browser(server, page):
    page.goto(f"{server}/?method=fixed&window=3&global=none&layer=0&head=0",
              timeout=240_000)
    _wait_for_explorer(page)
    assert page.locator("[data-testid='stException']").count() == 0
    before = page.evaluate(METRIC_JS, "Model recall")
    sparsity_before = float(page.evaluate(METRIC_JS, "Model sparsity"))
    thumb = (page.locator("[data-testid='stSlider']").filter(has_text="Window size")
             .get_by_role("slider"))
    thumb.focus()
    thumb.press("ArrowRight")  # window 3 -> 5
    page.wait_for_function(f"(b) => ({METRIC_JS})('Model recall') !== b", arg=before,
                           timeout=60_000)
    after = page.evaluate(METRIC_JS, "Model recall")
    assert float(after) > float(before)  # a wider window never lowers recall
    assert float(page.evaluate(METRIC_JS, "Model sparsity")) < sparsity_before
    assert "window=5" in page.url  # the URL reproduces the view
    time.sleep(1.5)  # let the figures finish drawing
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser_explorer.png"))
    assert page.locator("[data-testid='stException']").count() == 0


def test_clicking_the_overview_grid_opens_that_head(server, page):
    page.goto(f"{server}/?method=fixed&window=3&layer=0&head=0", timeout=240_000)
    _wait_for_explorer(page)
    wait_until_idle(page)  # a click during a run (busy machine) may be lost to that rerun
    grid = page.locator(".js-plotly-plot").nth(1)
    cell = grid.locator("path.point").nth(1 * 12 + 3).bounding_box()  # layer 1, head 3
    x, y = cell["x"] + cell["width"] / 2, cell["y"] + cell["height"] / 2
    page.mouse.move(x, y)
    time.sleep(0.5)  # plotly selects the hovered point on click
    page.mouse.down()
    page.mouse.up()
    page.wait_for_function("() => location.search.includes('layer=1') && "
                           "location.search.includes('head=3')", timeout=60_000)
    page.wait_for_function("() => [...document.querySelectorAll('.annotation-text')]"
                           ".some(e => e.textContent.includes('L1H3'))", timeout=60_000)


PASTED = "The pilot thanked the mechanic because he had fixed the engine overnight."


def _textarea_value(page) -> str | None:
    return page.evaluate("() => { const t = document.querySelector("
                         "'[data-testid=\"stSidebar\"] textarea'); return t ? t.value : null; }")


def test_pasted_text_survives_mode_switches_and_a_reload(server, page):
    page.goto(f"{server}/?method=fixed&window=3", timeout=240_000)
    _wait_for_explorer(page)
    sidebar = page.locator("[data-testid='stSidebar']")
    sidebar.get_by_text("Paste", exact=True).click()
    area = sidebar.locator("textarea")
    area.wait_for(timeout=60_000)
    area.fill(PASTED)
    area.press("Control+Enter")  # a text area commits on Ctrl+Enter (or blur)
    page.wait_for_function("() => location.search.includes('textid=')", timeout=120_000)
    wait_until_idle(page)  # a click during a run (busy machine) may be lost to that rerun
    sidebar.get_by_text("Example", exact=True).click()
    page.wait_for_function("() => !location.search.includes('textid=')", timeout=60_000)
    wait_until_idle(page)
    sidebar.get_by_text("Paste", exact=True).click()
    page.wait_for_function(f"() => {{ const t = document.querySelector("
                           f"'[data-testid=\"stSidebar\"] textarea'); "
                           f"return t && t.value === {PASTED!r}; }}", timeout=60_000)
    page.wait_for_function("() => location.search.includes('textid=')", timeout=60_000)
    page.reload(timeout=240_000)
    _wait_for_explorer(page)
    wait_until_idle(page)  # the sidebar's text area is drawn by the run after the reload
    page.wait_for_function(f"() => {{ const t = document.querySelector("
                           f"'[data-testid=\"stSidebar\"] textarea'); "
                           f"return t && t.value === {PASTED!r}; }}", timeout=60_000)
    assert _textarea_value(page) == PASTED
    assert "textid=" in page.url
    assert page.locator("[data-testid='stException']").count() == 0


def test_model_view_hover_names_a_head_and_a_click_opens_it(server, page):
    page.goto(f"{server}/?method=fixed&window=3&layer=0&head=0", timeout=240_000)
    _wait_for_explorer(page)
    page.get_by_text("Model view: every head's pattern", exact=False).click()
    mosaic = page.locator(".st-key-w_model_view .js-plotly-plot")
    mosaic.wait_for(timeout=120_000)
    point = mosaic.locator("path.point").nth(2 * 12 + 5)  # layer 2, head 5
    point.scroll_into_view_if_needed()
    time.sleep(0.5)
    tile = point.bounding_box()
    x, y = tile["x"] + tile["width"] / 2, tile["y"] + tile["height"] / 2
    page.mouse.move(x, y)
    page.wait_for_function("() => [...document.querySelectorAll('.hoverlayer text')]"
                           ".some(t => t.textContent.includes('layer 2 · head 5'))",
                           timeout=30_000)
    page.mouse.down()
    page.mouse.up()
    page.wait_for_function("() => location.search.includes('layer=2') && "
                           "location.search.includes('head=5')", timeout=60_000)
    page.wait_for_function("() => [...document.querySelectorAll('.annotation-text')]"
                           ".some(e => e.textContent.includes('L2H5'))", timeout=60_000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser_model_view.png"), full_page=True)
    assert page.locator("[data-testid='stException']").count() == 0


def test_explorer_shows_the_output_accuracy_of_the_setting(server, page):
    page.goto(f"{server}/?method=fixed&window=5&layer=0&head=0", timeout=240_000)
    _wait_for_explorer(page)
    page.get_by_text("Output accuracy: run the model restricted", exact=False).click()
    page.wait_for_function(f"() => ({METRIC_JS})('Output cosine') !== null", timeout=120_000)
    cosine = float(page.evaluate(METRIC_JS, "Output cosine"))
    assert -1.0 <= cosine <= 1.0
    # drawn after the metrics in the same run: it may arrive in a later websocket message
    page.locator("text=Accuracy of this setting").wait_for(timeout=30_000)
    assert page.locator("text=Accuracy of this setting").count() == 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser_accuracy.png"))
    assert page.locator("[data-testid='stException']").count() == 0


def test_head_view_draws_the_selected_token_and_a_click_selects_another(server, page):
    """bertviz-style head view: the selected query 5 is drawn on load; with a window of 3
    and no global tokens every head predicts exactly keys 4..6, so 12 heads give 36 kept
    lines (TP + FP); unticking a head removes its lines; a click on key 8 selects it for the
    page and the link (its column)."""
    page.goto(f"{server}/tokens?method=fixed&window=3&global=none&query=5&layer=0",
              timeout=240_000)
    page.wait_for_function(f"{PLOTS_JS}.length >= 1",
                           timeout=240_000)
    view = page.locator(".st-key-w_head_lines")
    view.locator("text[data-side='query'][data-index='5']").wait_for(timeout=60_000)
    kept = view.locator("#lines line[data-status='TP'], #lines line[data-status='FP']")
    kept.first.wait_for(timeout=30_000)  # no hover needed: the selection is drawn
    assert kept.count() == 36
    assert view.locator("text.active[data-side='query'][data-index='5']").count() == 1
    title = view.locator("#lines line title").first.text_content()
    assert " → " in title and "gold p=" in title
    view.locator("input[data-head='3']").click()
    assert view.locator("#lines line[data-head='3']").count() == 0
    assert kept.count() == 33
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser_head_view.png"), full_page=True)
    view.locator("text[data-side='key'][data-index='8']").click()
    page.wait_for_function("() => location.search.includes('query=8')", timeout=60_000)
    page.get_by_text("attended by (column)").wait_for(timeout=30_000)
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
                           ".some(e => e.textContent.includes('key 8'))", timeout=60_000)
    active = view.locator("text.active[data-side='key'][data-index='8']")
    active.wait_for(timeout=30_000)
    assert page.locator("[data-testid='stException']").count() == 0


def test_after_a_click_the_picked_tokens_lines_stay_under_a_still_pointer(server, page):
    """A click re-centres the window on the picked token, so another token lands under the
    pointer: a small jitter of the pointer (what a hand does) must not preview it; the lines
    drawn stay the picked key's, and only it is highlighted. (Token texts carry their index
    in the window; their tooltip starts with the position in the text.)"""
    page.goto(f"{server}/tokens?method=fixed&window=3&global=none&query=60&layer=0",
              timeout=240_000)
    view = page.locator(".st-key-w_head_lines")
    view.locator("text.active[data-side='query']").wait_for(timeout=240_000)
    wait_until_idle(page)

    def key_at(position: int):
        return view.locator("text[data-side='key']").filter(
            has=page.locator(f"xpath=./*[local-name()='title'][starts-with(., '{position} ·')]"))

    box = key_at(72).bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.click(x, y)
    page.wait_for_function("() => location.search.includes('query=72')", timeout=60_000)
    wait_until_idle(page)
    picked = key_at(72)
    view.locator("text.active[data-side='key']").filter(  # the view may sit in a frame:
        has=page.locator("xpath=./*[local-name()='title'][starts-with(., '72 ·')]")  # ask it
    ).wait_for(timeout=30_000)
    for dx in (1, 2, 3):  # a still hand: a few pixels
        page.mouse.move(x + dx, y)
    time.sleep(0.3)
    assert view.locator("text.active").count() == 1  # the picked key only, nothing previewed
    # every line drawn ends at the picked key (its column), none at the token under the pointer
    ends = set(view.locator("#lines line").evaluate_all("ls => ls.map(l => l.getAttribute('y2'))"))
    assert ends == {picked.get_attribute("y")}
    assert page.locator("[data-testid='stException']").count() == 0


def test_a_click_on_a_pareto_point_loads_its_setting(server, page):
    """Clicking a frontier point of `distance` sets the sliders and the link to that
    threshold (raw distance, no window, no global tokens: the sweep's own setting)."""
    page.goto(f"{server}/pareto?method=fixed&window=3", timeout=240_000)
    page.wait_for_function(f"{PLOTS_JS}.length >= 1",
                           timeout=240_000)
    wait_until_idle(page)
    index = page.evaluate("() => document.querySelector('.js-plotly-plot').data"
                          ".findIndex(t => t.meta === 'distance')")
    point = page.locator(".js-plotly-plot").first.locator(".scatterlayer .trace").nth(
        index).locator("path.point").nth(2)  # t well below the window's points
    point.scroll_into_view_if_needed()
    box = point.bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function("() => location.search.includes('method=distance') && "
                           "location.search.includes('calibration=none') && "
                           "location.search.includes('global=none')", timeout=60_000)
    page.get_by_text("Loaded from the Distance", exact=False).first.wait_for(timeout=30_000)
    assert page.locator("[data-testid='stException']").count() == 0


def test_a_bad_links_warning_clears_after_a_change_in_a_fragment(server, page):
    """The Explorer's head picker reruns only its fragment: the link's warning, drawn above
    it, still goes (the page is drawn again)."""
    page.goto(f"{server}/?method=fixed&layer=40&beta=99", timeout=240_000)
    _wait_for_explorer(page)
    wait_until_idle(page)
    warnings = page.locator("[data-testid='stAlert']", has_text="This link had")
    assert warnings.count() == 1
    page.locator("[data-testid='stSelectbox']").filter(
        has=page.get_by_text("Head", exact=True)).first.click()
    page.locator("[role='option']", has_text="3").first.click()
    time.sleep(0.5)
    wait_until_idle(page)
    assert warnings.count() == 0
    assert page.locator("[data-testid='stException']").count() == 0


def test_a_click_on_the_block_overview_strip_moves_the_window(server, page, tmp_path_factory):
    """A long text on a long-context model: the block overview is a heatmap (no point comes
    back from a click on it), so its strip of query-block markers moves the window."""
    from sparsefinder.data.long_context import long_texts
    from sparsefinder.models.decoders import save_tiny_decoder
    from sparsefinder.models.loading import load_model

    model = save_tiny_decoder("qwen2", tmp_path_factory.mktemp("long") / "qwen2",
                              max_positions=4096)
    text = long_texts(load_model(str(model), device="cpu").tokenizer, 1100, 1, "train")[0]
    page.goto(f"{server}/?model={model}&method=fixed&window=3&layer=0&head=0",
              timeout=240_000)
    wait_until_idle(page, timeout=240_000)
    sidebar = page.locator("[data-testid='stSidebar']")
    sidebar.get_by_text("Paste", exact=True).click()
    area = sidebar.locator("textarea")
    area.wait_for(timeout=60_000)
    wait_until_idle(page)
    area.fill(text)
    area.press("Control+Enter")
    overview = page.locator(".js-plotly-plot", has_text="key block")
    overview.wait_for(timeout=240_000)
    wait_until_idle(page, timeout=240_000)
    assert page.locator("[data-testid='stException']").count() == 0
    assert overview.locator("g.heatmaplayer").count() == 1  # the cells: one heatmap layer
    marker = overview.locator("path.point").nth(20)  # query block 20: tokens 640-671
    box = marker.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    time.sleep(0.5)  # plotly selects the hovered point on click
    page.mouse.down()
    page.mouse.up()
    page.wait_for_function("() => [...document.querySelectorAll('.annotation-text')]"
                           ".some(e => e.textContent.includes('tokens 512–767'))",
                           timeout=60_000)
    assert page.locator("[data-testid='stException']").count() == 0
