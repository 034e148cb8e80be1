"""Every page, at a desktop and a phone width: no sideways scroll, WCAG AA, no CSP violation.

The walk opens each page of the dashboard (the live session page with each of
its tabs, a turn it travelled back to, and a turn that arrives over the
websocket while it is open) at 1280 and 390 px and checks, on each:

- the page itself never scrolls sideways (wide tables scroll inside their own box);
- axe-core finds no violation of serious or critical impact (contrast included);
- the browser reported no Content-Security-Policy violation.

A screenshot of each page at each width goes to ``test-results/pages/`` (not
committed) for a reader; ``CONTEXTLAB_SCREENSHOT_DIR`` moves them elsewhere.
axe-core comes from npm (``scripts/install_axe.sh``, run by the test command).
"""

from __future__ import annotations

import os
from pathlib import Path

from playwright.sync_api import Page

from contextlab.dashboard import demo_story
from contextlab.dashboard.management.commands.loaddemo import DEMO_CONVERSATION, DEMO_PROFILE
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, SessionMessage, SummaryVersion, Turn
from tests.conversations import answer, tool_turn
from tests.corpus import REPO
from tests.dashboard.conftest import defer_a_turn, work
from tests.e2e.browser import CSP_LISTENER, BrowserTestCase

AXE = REPO / "var" / "npm" / "node_modules" / "axe-core" / "axe.min.js"
WIDTHS = (1280, 390)
SMALL = {"max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400}
AXE_RUN = """async () => {
  const result = await axe.run(document, {resultTypes: ['violations']});
  return result.violations.filter(v => v.impact === 'serious' || v.impact === 'critical').map(v => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 5).map(n => n.target.join(' ') + ' :: ' + n.failureSummary.replace(/\\s+/g, ' ').slice(0, 200)),
    count: v.nodes.length,
  }));
}"""


def screenshot_dir() -> Path:
    folder = Path(os.environ.get("CONTEXTLAB_SCREENSHOT_DIR") or REPO / "test-results" / "pages")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class PageWalkTests(BrowserTestCase):
    def setUp(self) -> None:
        super().setUp()
        if not AXE.is_file():
            raise AssertionError(f"axe-core is missing at {AXE}: run `bash scripts/install_axe.sh`")
        self.axe_source = AXE.read_text()
        self.problems: list[str] = []

    def check(self, name: str, width: int, page: Page | None = None) -> None:
        """The three checks on the page as it is now; problems are collected, reported at the end."""
        page = page or self.page
        page.wait_for_load_state("networkidle")
        where = f"{name} @ {width}px"
        widths = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        if widths[0] > widths[1]:
            wide = page.evaluate("""() => [...document.querySelectorAll('body *')]
                .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
                .filter(e => !e.parentElement.closest('*') || e.parentElement.getBoundingClientRect().right <= window.innerWidth + 1)
                .slice(0, 5).map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + '.' + [...e.classList].join('.')
                  + ' right=' + Math.round(e.getBoundingClientRect().right))""")
            self.problems.append(f"{where}: page is {widths[0]} px wide in a {widths[1]} px window; {wide}")
        page.screenshot(path=str(screenshot_dir() / f"{name}-{width}.png"), full_page=True)
        page.screenshot(path=str(screenshot_dir() / f"{name}-{width}-top.png"))
        if not page.evaluate("typeof window.axe !== 'undefined'"):
            # Evaluated through the DevTools protocol, which a page's CSP does not govern.
            page.evaluate(self.axe_source)
        for violation in page.evaluate(AXE_RUN):
            self.problems.append(f"{where}: axe {violation['impact']} {violation['id']} ({violation['help']}) "
                                 f"on {violation['count']} node(s): {violation['nodes']}")
        for text in page.evaluate("window.__cspViolations || []"):
            self.problems.append(f"{where}: CSP violation {text}")
        for text in self.csp_console:
            self.problems.append(f"{where}: console: {text}")
        self.csp_console.clear()

    def demo_session(self) -> AgentSession:
        profile = services.profile_create(owner=self.alice, name="demo", knobs=DEMO_PROFILE)
        session = services.transcript_import(owner=self.alice, path=DEMO_CONVERSATION, profile=profile,
                                             title="Demo: a walk through every page")
        demo_story.record(session)  # as the demo loader does: the landing page shows its first-visit card
        return session

    def test_it_fits_every_page_in_a_phone_and_passes_axe_and_the_csp_on_each(self) -> None:
        self.alice.is_staff = self.alice.is_superuser = True
        self.alice.save()
        session = self.demo_session()
        profile = session.profile
        assert profile is not None
        tools = services.session_create(owner=self.alice, system_prompt="You are a careful coding agent.",
                                        profile=profile, title="Nightly build with a rather long title that wraps")
        for i in range(1, 13):
            services.messages_append(session=tools, messages=[*([answer(i - 1)] if i > 1 else []),
                                                              *tool_turn(i, output_bytes=1_500)])
            services.session_prepare(session=tools)
        # A session whose latest turn held a compaction back: the gauge's "deferred" state.
        deferred = services.session_create(owner=self.alice, system_prompt="You are a careful coding agent.",
                                           profile=services.profile_create(owner=self.alice, name="small", knobs=SMALL),
                                           title="Deferred")
        work(deferred, 20)
        held = defer_a_turn(deferred)
        base = session.get_absolute_url()
        compacted = Turn.objects.filter(session=session, outcome="compacted").order_by("number").first()
        assert compacted is not None
        archived = session.messages.filter(status="archived").order_by("seq").first()
        assert archived is not None
        version = SummaryVersion.objects.filter(session=session).order_by("version").first()
        assert version is not None
        needle = archived.message_id
        tools_base = tools.get_absolute_url()
        tool_row = SessionMessage.objects.filter(session=tools, role="tool", status="archived").order_by("seq").first()
        assert tool_row is not None
        pages = [
            ("sessions", "/"),
            ("turn", f"{base}turns/{compacted.number}/"),
            ("message", f"{base}messages/{archived.seq}/"),
            ("tool-message", f"{tools_base}messages/{tool_row.seq}/"),
            ("summaries", f"{base}summaries/"),
            ("summaries-first", f"{base}summaries/?v={version.version}"),
            ("search", f"{base}search?q={needle}"),
            ("search-tools", f"{tools_base}search?q=step"),
            ("memory", f"/sessions/{session.pk}/insights/memory/"),
            ("operations", f"/sessions/{session.pk}/insights/operations/"),
            ("stale", f"/sessions/{session.pk}/insights/stale/"),
            ("compare", f"/sessions/{session.pk}/insights/compare/"),
            ("recall", f"/sessions/{session.pk}/insights/recall?q=flight"),
            ("profiles", "/profiles/"),
            ("profile-new", "/profiles/new/"),
            ("profile-form", f"/profiles/{profile.pk}/"),
            ("profile-version", f"/profiles/{profile.pk}/versions/1/"),
            ("profile-memory", f"/profiles/{profile.pk}/memory/"),
            ("import", "/import/"),
            ("import-progress", f"/import/{session.pk}/"),
            ("api-docs", "/api/docs"),
            ("not-found", "/no-such-page/"),
            ("admin", "/admin/"),
            ("admin-profiles", "/admin/contextlab_sessions/agentprofile/"),
        ]
        page = self.page
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 900})
            for name, path in pages:
                response = page.goto(f"{self.live_server_url}{path}")
                assert response is not None
                csp = response.headers.get("content-security-policy", "")
                if "script-src 'self'" not in csp:
                    self.problems.append(f"{name} @ {width}px: no script-src 'self' in its CSP header {csp!r}")
                self.check(name, width)
            self.open_live(f"{deferred.get_absolute_url()}#tab-flow")
            assert f"deferred at turn {held.number}" in (page.text_content("#gauge") or "")
            self.check("session-deferred", width)
            self.walk_session_page(session, compacted, width)
            self.walk_session_page(tools, None, width, name="session-tools")
            self.check_login_page(width)
        assert not self.page_errors, self.page_errors
        assert not self.problems, "\n".join(self.problems)

    def walk_session_page(self, session: AgentSession, travel_to: Turn | None, width: int,
                          name: str = "session") -> None:
        page = self.page
        self.open_live(session.get_absolute_url())
        self.check(name, width)
        for tab in page.eval_on_selector_all(".tabs [data-tab]", "tabs => tabs.map(t => t.dataset.tab)"):
            page.click(f'.tabs [data-tab="{tab}"]')
            self.check(f"{name}-tab-{tab}", width)
        if travel_to is None:
            # The pin button's handler lives in static/js/app.js now (no hx-on): it still works under the CSP.
            page.click('.tabs [data-tab="messages"]')
            button = page.locator("#fate-live .pin-button:not([disabled])").first
            seq = button.get_attribute("data-pin-seq")
            button.click()
            page.wait_for_selector(f'#fate-live .pin-button[data-pin-seq="{seq}"][disabled]', timeout=10_000)
            self.check(f"{name}-pinned", width)
            return
        page.click('.tabs [data-tab="flow"]')
        page.click(f'#turns-panel tr[data-turn="{travel_to.number}"]')
        page.wait_for_selector(f'#time-bar[data-turn="{travel_to.number}"][data-live="0"]')
        self.check(f"{name}-travelled", width)
        # A turn arrives over the websocket while the page is open.
        page.click("#follow-latest")
        page.wait_for_selector('#time-bar[data-live="1"]')
        turns = session.turns_count
        self.api("POST", f"sessions/{session.pk}/messages",
                 {"messages": [{"role": "user", "content": f"One more question at {width} px."}]})
        self.api("POST", f"sessions/{session.pk}/prepare")
        self.wait_until(f"document.querySelector('#flow-live').dataset.turn === '{turns + 1}'")
        self.check(f"{name}-after-live-turn", width)
        session.refresh_from_db()

    def check_login_page(self, width: int) -> None:
        context = self.browser.new_context(viewport={"width": width, "height": 900})
        context.add_init_script(CSP_LISTENER)
        try:
            page = context.new_page()
            self.watch_csp(page)
            page.goto(f"{self.live_server_url}/accounts/login/")
            self.check("login", width, page)
        finally:
            context.close()
