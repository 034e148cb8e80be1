"""Manual compaction as a review, in Chromium: pins, dry run, draft, accept / discard, cancel, search's pin."""

from __future__ import annotations

import os
import time

from django.test import override_settings

from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, CompactionRun, SessionMessage, Turn
from tests.conversations import answer, tool_turn
from tests.corpus import REPO
from tests.e2e.browser import BrowserTestCase
from tests.fakellm import FakeLLM, Gate, Reply
from tests.jobs.test_compaction_job import SUMMARY

SMALL = {"max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400}
SCREENSHOTS = REPO / "docs" / "screenshots"
FACT = "must keep: the DB is /srv/db.sqlite"


def _work(session: AgentSession, turns: int) -> AgentSession:
    for i in range(1, turns + 1):
        services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                            *tool_turn(i, output_bytes=1_500)])
        services.session_prepare(session=session)
    # A new request: everything before it can be compacted by hand.
    services.messages_append(session=session, messages=[answer(turns), *tool_turn(turns + 1, output_bytes=300)])
    session.refresh_from_db()
    return session


class CompactionReviewTests(BrowserTestCase):
    def _session(self, turns: int = 6) -> AgentSession:
        profile = services.profile_create(owner=self.alice, name="small", knobs=SMALL)
        session = services.session_create(owner=self.alice, system_prompt="You are a careful coding agent.",
                                          profile=profile, title="Review")
        return _work(session, turns)

    def _shoot(self, name: str, selector: str) -> None:
        """At 1440 and 1024 px, when asked for (CONTEXTLAB_SCREENSHOTS=1): pictures are for reading."""
        if os.environ.get("CONTEXTLAB_SCREENSHOTS") != "1":
            return
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        for width in (1440, 1024):
            self.page.set_viewport_size({"width": width, "height": 1000})
            self.page.wait_for_timeout(150)
            self.page.locator(selector).first.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"))
        self.page.set_viewport_size({"width": 1400, "height": 1000})

    def test_pin_a_message_and_a_fact_dry_run_then_accept_commits_that_exact_summary(self) -> None:
        session = self._session()
        page = self.page
        self.open_live(f"{session.get_absolute_url()}#tab-messages")
        # Pin an older request from the message list (its first page shows the newest messages).
        oldest_live = (SessionMessage.objects.filter(session=session, status="live", role="user",
                                                     seq__gt=session.messages_count - 20).order_by("seq").first())
        assert oldest_live is not None
        page.click(f'#fate-live .pin-button[data-pin-seq="{oldest_live.seq}"]')
        page.wait_for_selector(f'#fate-live .pin-button[data-pin-seq="{oldest_live.seq}"]:disabled')
        page.click('.tabs [data-tab="compaction"]')
        page.wait_for_selector(f'#pins [data-pinned="{oldest_live.message_id}"]')
        page.fill("#pin-fact-input", FACT)
        page.click("#pin-fact-button")
        page.wait_for_selector(f'#pins [data-fact="{FACT}"]')
        self._shoot("pins", "#compaction-card")
        turns_before = Turn.objects.filter(session=session).count()

        page.fill("#compaction-instruction", "keep every path")
        page.click("#dry-run-button")
        page.wait_for_selector('#draft[data-status="draft"]', timeout=20_000)
        run = CompactionRun.objects.get(session=session, kind="dry_run")
        assert run.draft is not None
        draft = run.draft["draft"]
        # Nothing committed by the dry run; the draft says what goes, what stays (pinned), and its loss.
        assert Turn.objects.filter(session=session).count() == turns_before
        assert page.locator(f'#draft-stays li[data-id="{oldest_live.message_id}"] .chip').text_content() == "pinned"
        assert page.locator("#draft-goes li").count() >= 1
        assert FACT in page.text_content("#draft-summary")
        assert page.locator("#draft-summary ins").count() >= 1
        loss = page.get_attribute("#draft-loss", "data-count")
        assert loss == str(run.draft["lost_count"])
        self._shoot("compaction-review", "#compaction-card")

        page.click("#accept-draft-button")
        page.wait_for_selector(f'tr[data-run="{run.pk}"][data-status="accepted"]', timeout=10_000)
        assert page.locator("#draft").count() == 0
        session.refresh_from_db()
        run.refresh_from_db()
        assert session.summary == draft["summary"]
        turn = Turn.objects.get(session=session, number=run.turn_number)
        check = next(s for s in turn.trace["steps"] if s["step"] == "context_check")
        assert check["details"]["pins"]["kept_live"] == [oldest_live.message_id]
        assert check["details"]["pins"]["facts"] == [FACT]
        oldest_live.refresh_from_db()
        assert oldest_live.status == "live"
        assert not self.page_errors

    def test_dry_run_then_discard_changes_nothing(self) -> None:
        session = self._session()
        page = self.page
        before = (session.summary, session.summary_version, session.turns_count, session.live_count)
        self.open_live(f"{session.get_absolute_url()}#tab-compaction")
        page.click("#dry-run-button")
        page.wait_for_selector('#draft[data-status="draft"]', timeout=20_000)
        page.click("#discard-draft-button")
        page.wait_for_selector('tr[data-status="discarded"]', timeout=10_000)
        assert page.locator("#draft").count() == 0
        session.refresh_from_db()
        assert (session.summary, session.summary_version, session.turns_count, session.live_count) == before
        assert not self.page_errors

    def test_the_why_answer_pins_the_searched_string_for_the_next_compaction(self) -> None:
        session = self._session()
        page = self.page
        self.open(f"{session.get_absolute_url()}search?q=/srv/app/t1.log")
        page.click("#pin-fact-action")
        page.wait_for_selector("#fact-pinned-mark")
        assert "/srv/app/t1.log" in services.pins_of(AgentSession.objects.get(pk=session.pk)).facts
        # A live message is pinned from its story too.
        self.open(f"{session.get_absolute_url()}search?q=/srv/app/t7.log")
        page.click("#pin-message-button")
        page.wait_for_selector("#pinned-mark")
        pins = services.pins_of(AgentSession.objects.get(pk=session.pk))
        assert len(pins.message_ids) == 1
        assert not self.page_errors


class CancelTests(BrowserTestCase):
    """A compaction whose summary call is held open by the test, so it can be cancelled while it runs."""

    @classmethod
    def setUpClass(cls) -> None:
        # Before the server process is forked: it must know the fake provider.
        cls.gate = Gate(Reply(SUMMARY))
        cls.llm = FakeLLM([cls.gate])
        cls.llm.__enter__()
        cls._providers = override_settings(CONTEXTLAB_PROVIDERS=cls.llm.provider)
        cls._providers.enable()
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.gate.opened.set()
        super().tearDownClass()
        cls._providers.disable()
        cls.llm.__exit__(None, None, None)

    def test_start_then_cancel_shows_cancelled_and_commits_nothing(self) -> None:
        profile = services.profile_create(owner=self.alice, name="llm", knobs={
            **SMALL, "compactor": "openai", "compaction_provider": "fake", "compaction_model": "fake-model",
            "compaction_timeout": 30, "compaction_retries": 0})
        session = _work(services.session_create(owner=self.alice, system_prompt="You are careful.",
                                                profile=profile, title="Cancel"), 3)
        before = (session.summary, session.summary_version, session.turns_count)
        page = self.page
        self.open_live(f"{session.get_absolute_url()}#tab-compaction")
        page.click("#compact-button")
        assert self.gate.arrived.wait(20), "the summary call started"
        page.wait_for_selector("#cancel-run-button", timeout=10_000)
        page.click("#cancel-run-button")
        run = CompactionRun.objects.get(session=session)
        page.wait_for_selector(f'tr[data-run="{run.pk}"][data-status="cancelled"]', timeout=10_000)
        assert page.locator("#cancel-run-button").count() == 0
        self.gate.opened.set()  # the summary arrives now, and is thrown away
        deadline = time.monotonic() + 10
        session.refresh_from_db()
        while session.summary_call_until is not None and time.monotonic() < deadline:
            time.sleep(0.1)
            session.refresh_from_db()
        run.refresh_from_db()
        assert run.status == "cancelled" and run.turn_number is None
        assert (session.summary, session.summary_version, session.turns_count) == before
        assert not self.page_errors
