"""The browser tests' CSP watch catches a violation: every browser test runs with the pages'
Content-Security-Policy enforced, and would fail on a refused script, so the watch itself is tested."""

from __future__ import annotations

import pytest
from playwright.sync_api import Route

from contextlab.core.csp import policy
from tests.e2e.browser import BrowserTestCase

PROBE = "/csp-probe/"
INLINE = "<!doctype html><title>probe</title><p id=p>static</p><script>document.getElementById('p').textContent = 'ran'</script>"


class CspWatchTests(BrowserTestCase):
    def serve_probe(self) -> None:
        # The probe answers with this project's own policy, from the live server's origin.
        def answer(route: Route) -> None:
            route.fulfill(status=200, body=INLINE, headers={"Content-Type": "text/html; charset=utf-8",
                                                            "Content-Security-Policy": policy()})
        self.page.route(f"{self.live_server_url}{PROBE}", answer)

    def test_it_fails_a_test_whose_page_has_a_refused_inline_script(self) -> None:
        self.serve_probe()
        self.open(PROBE)
        self.wait_until("window.__cspViolations.length > 0", timeout=5)
        # The CSP is enforced in every browser test: the script did not run.
        assert self.page.text_content("#p") == "static"
        violations = self.csp_violations()
        assert any("script-src" in v for v in violations), violations
        with pytest.raises(AssertionError, match="Content-Security-Policy refused"):
            self.assert_no_csp_violation()
        # Leave the context clean, so this test's own tear-down (the same watch) passes.
        self.open("/")
        self.csp_console.clear()
        self.assert_no_csp_violation()

    def test_it_passes_a_real_page(self) -> None:
        self.open("/")
        self.page.wait_for_selector("main")
        self.assert_no_csp_violation()
