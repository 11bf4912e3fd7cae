"""No request of a page load leaves the machine (the app works offline, and tells no third
party who opened it): every request the browser makes goes to the app's own server.

Marked ``browser``; skipped (with the reason) only when /usr/bin/chromium is missing.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from browser_helpers import CHROMIUM, PLOTS_JS, SKIP_REASON, wait_until_idle

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=SKIP_REASON),
]

LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}
LOCAL_SCHEMES = {"data", "blob", "about"}


def _outside(urls: list[str]) -> list[str]:
    return [url for url in urls
            if urlsplit(url).scheme not in LOCAL_SCHEMES
            and urlsplit(url).hostname not in LOCAL_HOSTS]


@pytest.mark.parametrize("path", ["/", "/clusters?method=kmeans"])
def test_a_page_load_makes_no_request_outside_the_machine(server, browser, path):
    context = browser.new_context(viewport={"width": 1400, "height": 1200})
    urls: list[str] = []
    context.on("request", lambda request: urls.append(request.url))
    # Requests elsewhere are refused at once (offline, they would hang or fail) and recorded.
    context.route(lambda url: urlsplit(url).hostname not in LOCAL_HOSTS,
                  lambda route: route.abort())
    page = context.new_page()
    try:
        page.goto(f"{server}{path}", timeout=240_000)
        page.wait_for_function(f"{PLOTS_JS}.length >= 1",
                               timeout=240_000)
        wait_until_idle(page)
        icons = page.evaluate("[...document.querySelectorAll('link[rel~=\"icon\"]')]"
                              ".map(l => l.href)")
    finally:
        context.close()
    assert urls, "no request recorded"
    assert any(urlsplit(u).path.startswith("/_stcore") for u in urls)
    assert icons and not _outside(icons), icons  # the favicon is served by the app
    assert not _outside(urls), _outside(urls)


def test_the_toolbar_has_no_deploy_button(server, browser):
    page = browser.new_page()
    try:
        page.goto(server, timeout=240_000)
        wait_until_idle(page)
        assert page.locator("[data-testid='stAppDeployButton']").count() == 0
        assert page.get_by_text("Deploy", exact=True).count() == 0
    finally:
        page.close()
