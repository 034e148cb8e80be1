"""The base class of the browser tests: a live ASGI server, Chromium, a logged-in page."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from channels.testing import ChannelsLiveServerTestCase
from daphne.testing import DaphneProcess
from django.contrib.auth.models import User
from django.test import override_settings

from contextlab.api.models import ApiToken

if TYPE_CHECKING:
    from playwright.sync_api import ConsoleMessage, Page

# Collected in every document before any of its own scripts run (an init script is added
# through the DevTools protocol, so the CSP does not refuse it).
CSP_LISTENER = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__cspViolations.push(`${e.violatedDirective} blocked ${e.blockedURI || 'inline'} at ${e.sourceFile}:${e.lineNumber}`);
});
"""
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]

needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")


class FreshDaphneProcess(DaphneProcess):
    """Daphne, forked from a test process that may have run async tests already.

    A fork copies thread pools but not their threads: asgiref's executor for
    ``database_sync_to_async`` would take work no thread ever runs, and every
    consumer would hang. The server process starts its own pools and forgets
    the parent's event loop.
    """

    def run(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from asgiref.sync import AsyncToSync, SyncToAsync

        from contextlab.support import jobs, live

        SyncToAsync.single_thread_executor = ThreadPoolExecutor(max_workers=1)
        SyncToAsync.context_to_thread_executor.clear()
        AsyncToSync.loop_thread_executors.clear()
        jobs._executor = None
        live._loop = None
        super().run()


@needs_chromium
@pytest.mark.browser
class BrowserTestCase(ChannelsLiveServerTestCase):
    """Alice, logged in, in a fresh browser page; her API token for agent-side calls."""

    serve_static = True
    ProtocolServerProcess = FreshDaphneProcess
    workspaces: Path
    # Every test runs with the pages' CSP enforced, and a violation fails it (``tearDown``): a
    # page that works only with the policy off is a broken page. Waits poll from Python
    # (``wait_until``): Playwright's wait_for_function compiles its predicate in the page, which
    # the CSP (no eval) refuses.

    @classmethod
    def setUpClass(cls) -> None:
        # The server process is forked in super().setUpClass(): it inherits these
        # settings, so its session workspaces are the ones the test process uses.
        cls.workspaces = Path(tempfile.mkdtemp(prefix="contextlab-e2e-ws-"))
        cls._workspace_settings = override_settings(WORKSPACES_DIR=cls.workspaces)
        cls._workspace_settings.enable()
        super().setUpClass()
        from playwright.sync_api import sync_playwright

        cls._playwright = sync_playwright().start()
        cls.browser = cls._playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.browser.close()
        cls._playwright.stop()
        super().tearDownClass()
        cls._workspace_settings.disable()
        shutil.rmtree(cls.workspaces, ignore_errors=True)

    @pytest.fixture(autouse=True)
    def _same_workspaces(self, _workspaces: Path, settings: Any) -> None:
        # The suite's autouse fixture gives each test its own folder; here the
        # server must see the files the test writes, so both use the class's.
        settings.WORKSPACES_DIR = self.workspaces

    def setUp(self) -> None:
        super().setUp()
        self.alice = User.objects.create_user("alice", "alice@example.org", "alice-password")
        self.token = ApiToken.issue(user=self.alice, name="e2e")[1]
        self.context = self.browser.new_context(viewport={"width": 1400, "height": 1000})
        self.csp_console: list[str] = []
        self.context.add_init_script(CSP_LISTENER)
        self.page = self.context.new_page()
        self.watch_csp(self.page)
        self.page_errors: list[str] = []
        self.page.on("pageerror", lambda error: self.page_errors.append(str(error)))
        self.page.goto(f"{self.live_server_url}/accounts/login/")
        self.page.fill("#id_username", "alice")
        self.page.fill("#id_password", "alice-password")
        self.page.click("button[type=submit]")
        self.page.wait_for_url(f"{self.live_server_url}/")

    def watch_csp(self, page: Page) -> None:
        """Collect the CSP reports the browser prints for ``page`` (every document it loads)."""
        def on_console(message: ConsoleMessage) -> None:
            if "Content Security Policy" in message.text:
                self.csp_console.append(message.text)
        page.on("console", on_console)

    def csp_violations(self, page: Page | None = None) -> list[str]:
        """What the CSP refused so far: the console's reports and the current document's events."""
        page = page or self.page
        seen = list(self.csp_console)
        if not page.is_closed():
            # Evaluated through the DevTools protocol, which the page's CSP does not govern.
            seen += page.evaluate("window.__cspViolations || []")
        return seen

    def assert_no_csp_violation(self) -> None:
        violations = self.csp_violations()
        assert not violations, f"the Content-Security-Policy refused something: {violations}"

    def tearDown(self) -> None:
        try:
            self.assert_no_csp_violation()
        finally:
            self.context.close()
            super().tearDown()

    def wait_until(self, expression: str, timeout: float = 10.0, page: Page | None = None) -> None:
        """Poll a JavaScript expression from the test until it is truthy.

        ``page.evaluate`` goes through the DevTools protocol, which the CSP does not govern;
        ``wait_for_function`` would compile the expression in the page, which it refuses.
        """
        page = page or self.page
        deadline = time.monotonic() + timeout
        while not page.evaluate(f"!!({expression})"):
            if time.monotonic() > deadline:
                raise AssertionError(f"still false after {timeout} s: {expression}")
            time.sleep(0.05)

    def open(self, path: str) -> None:
        self.page.goto(f"{self.live_server_url}{path}")

    def open_live(self, path: str) -> None:
        """Open a session page and wait until its websocket is connected."""
        self.open(path)
        self.page.wait_for_selector('#live-state[data-state="live"]', timeout=10_000)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(
            f"{self.live_server_url}/api/v1/{path}", method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
