"""'Why was X lost?': the search answers with one sentence, each part a link."""

from __future__ import annotations

from contextlab.lib.blocks import first_text
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, OffloadedFile, SessionMessage
from tests.conversations import answer, tool_turn
from tests.e2e.browser import BrowserTestCase

SMALL = {"max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400}


class WhyLostTests(BrowserTestCase):
    def _session(self, turns: int) -> AgentSession:
        profile = services.profile_create(owner=self.alice, name="small", knobs=SMALL)
        session = services.session_create(owner=self.alice, system_prompt="You are a careful coding agent.",
                                          profile=profile, title="Why")
        for i in range(1, turns + 1):
            services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                *tool_turn(i, output_bytes=1_500)])
            services.session_prepare(session=session)
        session.refresh_from_db()
        return session

    def test_the_search_tells_the_story_of_a_cut_then_compacted_output_with_links(self) -> None:
        session = self._session(turns=12)
        row = (SessionMessage.objects.filter(session=session, truncated_stage=2, compacted_turn__isnull=False)
               .order_by("seq").first())
        assert row is not None
        original, current = first_text(row.content), first_text(row.current_content)
        line = next(line for line in original.splitlines() if len(line) > 20 and line not in current)
        needle = line.strip()[:60]
        cut = OffloadedFile.objects.filter(session=session, message_id=row.message_id).order_by("pk").last()
        entered = next(e["before_turn"] for e in row.fate if e.get("event") == "ingested")
        page = self.page
        self.open(f"{session.get_absolute_url()}search?q={needle}")
        sentence = page.text_content("#why .why-sentence")
        assert f"entered in turn {entered} (message #{row.seq})" in sentence
        assert f"its tool output was cut to {cut.kept_bytes:,} B in turn {row.truncated_turn}" in sentence
        assert f"(stage 2, full text in {cut.path})" in sentence
        assert f"compacted in turn {row.compacted_turn} into summary v{row.summary_version}" in sentence
        assert f"archived at {row.archive_file}:{row.archive_line}" in sentence
        links = page.locator("#why a")
        assert links.count() >= 6
        # The full text link opens the offloaded output, which holds the string.
        href = page.locator("#why a", has_text=cut.path).get_attribute("href")
        assert needle in page.request.get(f"{self.live_server_url}{href}").text()
        # A turn opens the session page with every panel at that turn.
        page.locator("#why a", has_text=f"turn {row.compacted_turn}").first.click()
        page.wait_for_selector(f'#time-bar[data-turn="{row.compacted_turn}"][data-live="0"]')
        assert page.get_attribute("#flow-pinned", "data-turn") == str(row.compacted_turn)
        page.go_back()
        page.locator("#why a", has_text=f"summary v{row.summary_version}").first.click()
        page.wait_for_url(f"**/summaries/?v={row.summary_version}")
        assert not self.page_errors

    def test_a_string_still_live_says_so(self) -> None:
        session = self._session(turns=2)
        self.open(f"{session.get_absolute_url()}search?q=/srv/app/t2.log")
        assert "and is in the live context now." in self.page.text_content("#why")
        assert not self.page_errors
