"""Issue 15 feature 5 and feature 1's re-inject action, in Chromium: what-if, history, turn versions, re-inject."""

from __future__ import annotations

import os

from contextlab.lib.blocks import first_text
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, SessionMessage
from tests.conversations import answer, tool_turn
from tests.corpus import REPO
from tests.e2e.browser import BrowserTestCase

SMALL = {"max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400}
SHOTS = REPO / "docs" / "screenshots"


class ProfileWhatIfTests(BrowserTestCase):
    def _session(self, turns: int) -> AgentSession:
        profile = services.profile_create(owner=self.alice, name="small", knobs=SMALL)
        session = services.session_create(owner=self.alice, system_prompt="You are a careful coding agent.",
                                          profile=profile, title="Fix the nightly build")
        for i in range(1, turns + 1):
            services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                *tool_turn(i, output_bytes=1_500)])
            services.session_prepare(session=session)
        session.refresh_from_db()
        return session

    def shoot(self, name: str, selector: str) -> None:
        """At 1440 and 1024 px, into docs/screenshots (only with CONTEXTLAB_SCREENSHOTS=1)."""
        if os.environ.get("CONTEXTLAB_SCREENSHOTS") != "1":
            return
        for width in (1440, 1024):
            self.page.set_viewport_size({"width": width, "height": 1000})
            self.page.wait_for_timeout(150)
            self.page.locator(selector).first.screenshot(path=str(SHOTS / f"{name}-{width}.png"))
        self.page.set_viewport_size({"width": 1400, "height": 1000})

    def test_a_smaller_window_in_the_form_shows_more_compactions_beside_what_happened(self) -> None:
        session = self._session(turns=12)
        page = self.page
        self.open(f"/profiles/{session.profile_id}/")
        page.fill("#id_max_input_length", "2000")
        page.select_option("#what-if-session", str(session.id))
        page.click("#what-if-run")
        page.wait_for_selector('#what-if-result[data-status="done"]', timeout=60_000)
        actual = int(page.text_content('[data-k="actual-compactions"]') or "0")
        what_if = int(page.text_content('[data-k="what-if-compactions"]') or "0")
        assert actual == session.compactions_count
        assert what_if > actual
        assert "extractive compactor" in (page.text_content("#what-if-result") or "")
        assert page.locator(".what-if-chart polyline").count() == 2
        self.shoot("profile-what-if", "#what-if")
        # Nothing was saved: the profile and the session are as they were.
        session.profile.refresh_from_db()
        assert session.profile.max_input_length == 4_000 and session.profile.version == 1
        assert not self.page_errors

    def test_a_saved_change_is_listed_in_the_history_and_the_next_turn_shows_its_version(self) -> None:
        session = self._session(turns=2)
        page = self.page
        self.open(f"/profiles/{session.profile_id}/")
        page.fill("#id_recent_n", "4")
        page.click(".form-actions button[type=submit]")
        page.wait_for_url("**/profiles/")
        self.open(f"/profiles/{session.profile_id}/")
        row = page.locator('#profile-history tr[data-version="2"]')
        assert "recent_n: 2 → 4" in " ".join((row.text_content() or "").split())
        assert "alice" in (row.text_content() or "") and "via form" in (row.text_content() or "")
        self.shoot("profile-history", "#profile-history")
        row.locator("a", has_text="v2").click()
        page.wait_for_selector("h1:has-text('Version 2')")
        assert page.locator(".version-values tr.is-changed").count() == 1

        services.messages_append(session=session, messages=[answer(2), *tool_turn(3, output_bytes=1_500)])
        services.session_prepare(session=session)
        self.open(session.get_absolute_url())
        page.wait_for_selector('#turns-panel tr[data-turn="3"] [data-profile-version="2"]')
        assert page.locator('#turns-panel tr[data-turn="2"] [data-profile-version="1"]').count() == 1
        page.locator('#turns-panel tr[data-turn="3"] [data-profile-version="2"]').click()
        page.wait_for_selector("h1:has-text('Version 2')")
        self.open(f"{session.get_absolute_url()}turns/3/")
        assert page.locator('h1 [data-profile-version="2"]').count() == 1
        turn = self.api("GET", f"sessions/{session.id}/turns/3")
        assert turn["profile_version"] == 2
        assert not self.page_errors

    def test_search_then_reinject_puts_the_original_into_the_next_payload(self) -> None:
        session = self._session(turns=12)
        row = (SessionMessage.objects.filter(session=session, status="archived", truncated_stage__isnull=False)
               .order_by("seq").first())
        assert row is not None
        original = first_text(row.content)
        current = first_text(row.current_content)
        line = next(line for line in original.splitlines() if len(line) > 20 and line not in current)
        page = self.page
        self.open(f"{session.get_absolute_url()}search?q={line.strip()[:60]}")
        page.wait_for_selector("#reinject-button")
        assert f"message #{row.seq}" in (page.text_content("#reinject") or "")
        page.click("#reinject-button")
        page.wait_for_selector("#reinject .reinject-done")
        self.shoot("reinject", "#why")
        payload = self.api("POST", f"sessions/{session.id}/prepare", {})
        sent = "\n".join(str(m.get("content")) for m in payload["messages"])
        assert line in sent and "Re-injected: the original text of message" in sent
        assert payload["trace"]["payload"]["reinjected"][0]["source_id"] == row.message_id
        # The source's story now says where its original went, with a link.
        self.open(f"{session.get_absolute_url()}messages/{row.seq}/")
        assert page.locator(".timeline-item--reinjected a").count() == 1
        assert not self.page_errors
