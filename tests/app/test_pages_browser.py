"""Every page with bundled example texts, in a real browser at two laptop sizes.

The Explorer (the first screen) is checked on every example; each other page on the examples
its layout depends on (``COVER``), so every page meets at least one text and every text at least
two pages without the full pages × texts product (which cost more than a third of the suite's
time: six Pareto sweeps, six identical Atlas pages).

One `streamlit run` server and one chromium for the module. Pages are opened by URL (the path
picks the page, ``example=`` the text: see ``app/shell.py`` and
``sparsefinder/explore/state.py``), text by text, so each text is extracted once (the server
keeps four texts); the Pareto sweeps, most of the CPU time, run ahead in tabs of their own (see
``Tabs``). Each page is loaded at 1280×800 and checked again after a resize to 1440×900 (the
layout is the browser's: nothing on the server depends on the width). A page fails on any
exception or error box, and on any metric whose label, value or delta is cut off (wider than
its box, or ending with "…"). The Coreference page is checked on its bundled probes (its
default) and then on the text loaded in the sidebar (spaCy's candidate pairs, all pre-selected:
two antecedents per pronoun). Screenshots go to ``artifacts/pages/`` (gitignored).
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

from sparsefinder.explore.inputs import list_examples, read_example

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=SKIP_REASON),
]

#: Laptop screens (CSS pixels): the common 1280×800 and 1440×900, and a small 1024×768.
VIEWPORTS = ((1280, 800), (1440, 900), (1024, 768))
#: Page name → URL path, one entry per page of app/main.py. Pareto comes last: its sweep of
#: every method on the text (most of this module's CPU time, on one core: the app runs torch
#: on one thread) starts in a tab of its own ahead of time and runs while the main tab checks
#: other pages.
PAGES = {"explorer": "", "learned_space": "learned_space", "tokens": "tokens",
         "clusters": "clusters", "coreference": "coreference", "atlas": "atlas",
         "pareto": "pareto"}
SLOW = "pareto"
#: Title and number of metrics each page draws: a check that ran on an empty or half-drawn
#: page would pass on nothing.
DRAWN = {"explorer": ("Explorer", 6), "learned_space": ("Learned space", 4),
         "tokens": ("Token view", 3), "clusters": ("Clusters", 0),
         "coreference": ("Coreference", 6), "atlas": ("Atlas", 6), "pareto": ("Pareto", 0)}
DRAWN_JS = """() => [
  document.querySelector('[data-testid="stMain"] h1')?.innerText.trim() ?? null,
  [...document.querySelectorAll('[data-testid="stMetric"]')]
    .filter(m => m.getBoundingClientRect().width > 0).length]"""
#: The texts, the longest last (the bundled order otherwise).
LONGEST = max(list_examples(), key=lambda e: len(read_example(e)))
EXAMPLES = sorted(list_examples(), key=lambda e: e == LONGEST)
SHOTS = ARTIFACTS / "pages"


class Tabs:
    """The main tab, and tabs that open the slow page of a text ahead of time: at a text's
    first page, its own and the next text's that has one (``COVER``). At most three texts are
    in flight besides the Coreference probe: the server keeps four (``cached_prepared``;
    an evicted text is extracted again, in seconds, while its sweep stays cached)."""

    def __init__(self, browser, server: str) -> None:
        width, height = VIEWPORTS[0]
        self.server = server
        self.main, *self.ahead = [browser.new_page(viewport={"width": width, "height": height})
                                  for _ in range(4)]
        self.opened: dict[str, object] = {}  # example → the tab its slow page was opened in

    def open_ahead(self, example: str) -> None:
        if example in self.opened:
            return
        tab = next(t for t in self.ahead if t not in self.opened.values())
        tab.goto(_url(self.server, SLOW, example), wait_until="domcontentloaded",
                 timeout=240_000)
        self.opened[example] = tab

    def close(self) -> None:
        for tab in (self.main, *self.ahead):
            tab.close()


@pytest.fixture(scope="module")
def tabs(browser, server):
    opened = Tabs(browser, server)
    yield opened
    opened.close()


def test_the_pages_cover_the_navigation():
    files = {p.stem for p in (ROOT / "app" / "app_pages").glob("*.py")}
    assert files == {path or "explorer" for path in PAGES.values()}


#: Extra link parameters per page. The Atlas page is checked on 8 passages: its layout is
#: what this test checks, and an atlas over every validation passage (computed on the first
#: visit, ~1.5 min on a busy 2-core machine) adds nothing to that (tests/app/test_atlas_page.py
#: checks the computation, the cache and the link).
QUERY = {"atlas": "&apass=8"}


def _url(server: str, name: str, example: str) -> str:
    return f"{server}/{PAGES[name]}?example={example}{QUERY.get(name, '')}"


def _check_sizes(page, name: str, shot: str) -> list[str]:
    """Problems at each viewport (the page is loaded at the first one), with screenshots."""
    problems = []
    title, metrics = page.evaluate(DRAWN_JS)
    if title != DRAWN[name][0] or metrics < DRAWN[name][1]:
        problems.append(f"{shot} not drawn: title {title!r}, {metrics} metrics "
                        f"(expected {DRAWN[name][0]!r}, {DRAWN[name][1]} or more)")
    for index, (width, height) in enumerate(VIEWPORTS):
        if index:
            page.set_viewport_size({"width": width, "height": height})
            page.evaluate("() => new Promise(r => requestAnimationFrame(() => "
                          "requestAnimationFrame(r)))")  # reflowed and painted
            time.sleep(0.1)  # the charts redraw at their new width (for the screenshot)
        page.screenshot(path=str(SHOTS / f"{shot}-{width}x{height}.png"))
        problems += [f"{width}×{height}: {problem}" for problem in page_problems(page)]
    return problems


#: Page → the examples it is checked on (the Explorer: all of them). Chosen for what each
#: page's layout depends on: the longest text (512 tokens: the most labels and points) on the
#: pages that draw every token, non-ASCII tokens on the token view and spaCy's candidate
#: pairs, the story on the page it was written for; the Atlas is computed on validation
#: passages, not the sidebar's text, so one text shows its layout; the Pareto page's layout
#: does not change with the text, so two sweeps (of the six) check it.
COVER = {
    "explorer": EXAMPLES,
    "learned_space": [LONGEST, "short_dialogue"],
    "tokens": [LONGEST, "multilingual_travel_notes"],
    "clusters": ["recipe_with_numbers", "science_news"],
    "coreference": ["coreference_story", "multilingual_travel_notes"],
    "atlas": ["short_dialogue"],
    "pareto": ["short_dialogue", "coreference_story"],
}
#: (example, page) in example order, pages in PAGES order: each text is extracted once.
CASES = [(example, name) for example in EXAMPLES for name in PAGES if example in COVER[name]]


def test_every_page_and_every_example_is_checked():
    assert set(COVER) == set(PAGES) and all(COVER.values())
    assert {e for e, _ in CASES} == set(EXAMPLES) and set(COVER["explorer"]) == set(EXAMPLES)
    assert all(set(names) <= set(EXAMPLES) for names in COVER.values())


@pytest.mark.parametrize(("example", "name"), CASES)
def test_page_with_example_has_no_error_and_no_cut_metric(server, tabs, example, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    if name == next(iter(PAGES)):  # a text's first page: its slow page and the next ahead
        later = EXAMPLES[EXAMPLES.index(example):]
        for ahead in [e for e in later if e in COVER[SLOW]][:2]:
            tabs.open_ahead(ahead)
    if name == SLOW:
        tabs.open_ahead(example)  # (at once when this test runs alone)
        page = tabs.opened.pop(example)
    else:
        page = tabs.main
    width, height = VIEWPORTS[0]
    page.set_viewport_size({"width": width, "height": height})
    if name != SLOW:
        page.goto(_url(server, name, example), timeout=240_000)
    wait_until_idle(page)
    problems = _check_sizes(page, name, f"{name}-{example}")
    if name == "coreference":
        page.set_viewport_size({"width": width, "height": height})
        page.get_by_text("the text loaded in the sidebar", exact=True).click()
        page.locator(".st-key-w_coref_pairs").wait_for(timeout=120_000)
        wait_until_idle(page)
        problems += [f"on the sidebar's text: {problem}"
                     for problem in _check_sizes(page, name, f"{name}-own-{example}")]
    assert not problems, "\n".join(problems)
