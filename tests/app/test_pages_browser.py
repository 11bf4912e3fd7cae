"""Every page with every bundled example text, in a real browser at two laptop sizes.

One `streamlit run` server and one chromium for the module. Pages are opened by URL (the path
picks the page, ``example=`` the text: see ``app/shell.py`` and
``sparsefinder/explore/state.py``), text by text, so each text is extracted and swept once
(the server keeps four texts). Each page is loaded at 1280×800 and checked again after a resize
to 1440×900 (the layout is the browser's: nothing on the server depends on the width). A page
fails on any exception or error box, and on any metric whose label, value or delta is cut off
(wider than its box, or ending with "…"). The Coreference page is checked on its bundled probes
(its default) and then on the text loaded in the sidebar (spaCy's candidate pairs, all
pre-selected: two antecedents per pronoun). Screenshots go to ``artifacts/pages/``
(gitignored).
"""

from __future__ import annotations

import time

import pytest
from browser_helpers import (
    ARTIFACTS,
    CHROMIUM,
    ROOT,
    SKIP_REASON,
    page_problems,
    wait_until_idle,
)

from sparsefinder.explore.inputs import list_examples

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=SKIP_REASON),
]

#: Laptop screens (CSS pixels): the common 1280×800 and 1440×900.
VIEWPORTS = ((1280, 800), (1440, 900))
#: Page name → URL path, one entry per page of app/main.py.
PAGES = {"explorer": "", "pareto": "pareto", "tokens": "tokens", "clusters": "clusters",
         "coreference": "coreference"}
SHOTS = ARTIFACTS / "pages"


@pytest.fixture(scope="module")
def page(browser):
    width, height = VIEWPORTS[0]
    page = browser.new_page(viewport={"width": width, "height": height})
    yield page
    page.close()


def test_the_pages_cover_the_navigation():
    files = {p.stem for p in (ROOT / "app" / "app_pages").glob("*.py")}
    assert files == {path or "explorer" for path in PAGES.values()}


def _check_sizes(page, shot: str) -> list[str]:
    """Problems at each viewport (the page is loaded at the first one), with screenshots."""
    problems = []
    for index, (width, height) in enumerate(VIEWPORTS):
        if index:
            page.set_viewport_size({"width": width, "height": height})
            time.sleep(0.3)  # reflow; the charts redraw at their new width
        page.screenshot(path=str(SHOTS / f"{shot}-{width}x{height}.png"))
        problems += [f"{width}×{height}: {problem}" for problem in page_problems(page)]
    return problems


@pytest.mark.parametrize("name", list(PAGES))
@pytest.mark.parametrize("example", list_examples())
def test_page_with_example_has_no_error_and_no_cut_metric(server, page, example, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    width, height = VIEWPORTS[0]
    page.set_viewport_size({"width": width, "height": height})
    page.goto(f"{server}/{PAGES[name]}?example={example}", timeout=240_000)
    wait_until_idle(page)
    problems = _check_sizes(page, f"{name}-{example}")
    if name == "coreference":
        page.set_viewport_size({"width": width, "height": height})
        page.get_by_text("the text loaded in the sidebar", exact=True).click()
        page.locator(".st-key-w_coref_pairs").wait_for(timeout=120_000)
        wait_until_idle(page)
        problems += [f"on the sidebar's text: {problem}"
                     for problem in _check_sizes(page, f"{name}-own-{example}")]
    assert not problems, "\n".join(problems)
