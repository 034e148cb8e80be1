"""Time travel: pick a turn and every panel shows the session as it was then; follow the latest again."""

from __future__ import annotations

import re

from contextlab.dashboard import fragments
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, SessionMessage, SummaryVersion, Turn
from tests.conversations import answer, tool_turn
from tests.e2e.browser import BrowserTestCase

SMALL = {"max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400}


def _number(text: str) -> int:
    return int(re.sub(r"[^\d]", "", text))


class TimeTravelTests(BrowserTestCase):
    def _session(self, turns: int) -> AgentSession:
        profile = services.profile_create(owner=self.alice, name="small", knobs=SMALL)
        session = services.session_create(owner=self.alice, system_prompt="You are a careful coding agent.",
                                          profile=profile, title="Travel")
        for i in range(1, turns + 1):
            services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                *tool_turn(i, output_bytes=2_000)])
            services.session_prepare(session=session)
        session.refresh_from_db()
        return session

    def _assert_panels_at(self, session: AgentSession, turn: Turn) -> None:
        page = self.page
        page.wait_for_selector(f'#time-bar[data-turn="{turn.number}"][data-live="0"]')
        expected = fragments.gauge_context(session, turn, now=False)["gauge"]["total"]
        assert page.get_attribute("#gauge-pinned .gauge-used", "data-total") == str(expected)
        assert page.get_attribute("#flow-pinned", "data-turn") == str(turn.number)
        assert f"Turn {turn.number}" in page.text_content("#llm-pinned .llm-head")
        # The messages it had seen, each where it was then.
        seen = page.eval_on_selector_all("#fate-page tbody tr[data-seq]", "rows => rows.map(r => Number(r.dataset.seq))")
        last_id = turn.trace["payload"]["last_message_id"]
        last_seq = SessionMessage.objects.get(session=session, message_id=last_id).seq
        assert max(seen) == last_seq
        for seq in seen:
            message = SessionMessage.objects.get(session=session, seq=seq)
            compacted_then = message.compacted_turn is not None and message.compacted_turn <= turn.number
            status = page.text_content(f'#fate-page tr[data-seq="{seq}"] .fate .chip')
            assert status == ("archived" if compacted_then else "live"), seq
        version = SummaryVersion.objects.filter(session=session, turn__lte=turn.number).order_by("-version").first()
        assert page.get_attribute("#summary-pinned", "data-version") == (str(version.version) if version else "")

    def test_a_click_on_a_turn_shows_every_panel_at_that_turn_and_follow_the_latest_returns(self) -> None:
        # Two compactions on the small profile (outputs of 2,000 bytes: CoPaw's own estimate fires twice).
        turns = 20
        session = self._session(turns=turns)
        compacted = Turn.objects.filter(session=session, outcome="compacted").order_by("number")
        first, last = compacted.first(), compacted.last()
        assert first is not None and last is not None and first.number < last.number
        page = self.page
        self.open_live(session.get_absolute_url())
        page.evaluate("window.__sameDocument = true")

        # In the list.
        page.click(f'#turns-live tr[data-turn="{first.number}"]')
        self._assert_panels_at(session, first)
        assert "is-selected" in (page.get_attribute(f'#turns-live tr[data-turn="{first.number}"]', "class") or "")
        # Before that first compaction's summary, the turn before it ran with none.
        page.click('#time-bar [aria-label="previous turn"]')
        self._assert_panels_at(session, Turn.objects.get(session=session, number=first.number - 1))
        assert page.get_attribute("#summary-pinned", "data-version") == ""

        # The scrubber.
        page.eval_on_selector("#scrubber", f"(el) => {{ el.value = '{last.number}'; "
                                           "el.dispatchEvent(new Event('change', {bubbles: true})); }")
        self._assert_panels_at(session, last)

        # On the chart.
        page.click('.tabs [data-tab="messages"]')
        self.wait_until("document.getElementById('chart-canvas')._plot", timeout=5)
        page.locator("#chart-canvas").scroll_into_view_if_needed()
        box = page.locator("#chart-canvas .u-over").bounding_box()
        x = page.evaluate("document.getElementById('chart-canvas')._plot.valToPos(3, 'x')")
        page.mouse.click(box["x"] + x, box["y"] + box["height"] / 2)
        self._assert_panels_at(session, Turn.objects.get(session=session, number=3))
        assert page.is_visible("#fate-page")

        # Pinned panels are left alone by live pushes; the live ones still move.
        self.api("POST", f"sessions/{session.pk}/messages", {"messages": [answer(turns), *tool_turn(turns + 1, output_bytes=900)]})
        self.api("POST", f"sessions/{session.pk}/prepare")
        self.wait_until(f"document.getElementById('stats').dataset.turns === '{turns + 1}'", timeout=10)
        assert page.get_attribute("#time-bar", "data-turn") == "3"
        assert page.get_attribute("#flow-pinned", "data-turn") == "3"

        # Follow the latest: the live panels are back, and pushes reach them again.
        page.click("#follow-latest")
        page.wait_for_selector(f'#time-bar[data-live="1"][data-turn="{turns + 1}"]')
        session.refresh_from_db()
        assert page.locator("#gauge-pinned").count() == 0
        assert page.get_attribute("#flow-live", "data-turn") == str(turns + 1)
        assert page.locator("#fate-live").count() == 1 and page.locator("#current-summary").count() == 1
        self.api("POST", f"sessions/{session.pk}/messages", {"messages": [answer(turns + 1), *tool_turn(turns + 2, output_bytes=900)]})
        self.api("POST", f"sessions/{session.pk}/prepare")
        page.wait_for_selector(f'#time-bar[data-live="1"][data-turn="{turns + 2}"]', timeout=10_000)
        self.wait_until(f"document.querySelector('#flow-live').dataset.turn === '{turns + 2}'", timeout=10)
        assert page.evaluate("window.__sameDocument") is True
        assert not self.page_errors

    def test_it_puts_the_turn_in_the_address_and_says_when_a_new_turn_arrives(self) -> None:
        turns = 8
        session = self._session(turns=turns)
        page = self.page
        base = session.get_absolute_url()
        # A shared address opens the page at that turn.
        self.open(f"{base}?turn=5#tab-messages")
        page.wait_for_selector('#live-state[data-state="live"]', timeout=10_000)
        self._assert_panels_at(session, Turn.objects.get(session=session, number=5))
        assert page.is_visible("#fate-page")
        # Travelling moves the address with it (the tab stays), following the latest drops it.
        page.click('.tabs [data-tab="flow"]')
        page.click('#turns-live tr[data-turn="3"]')
        page.wait_for_selector('#time-bar[data-turn="3"][data-live="0"]')
        self.wait_until("location.search === '?turn=3'", timeout=5)
        assert page.evaluate("location.hash") == "#tab-flow"
        assert page.text_content("#time-bar [data-turn-count]") == str(turns)
        assert page.is_hidden("#time-bar-news")

        # A turn arrives while turn 3 is shown: the bar counts it and says so.
        self.api("POST", f"sessions/{session.pk}/messages", {"messages": [answer(turns), *tool_turn(turns + 1, output_bytes=900)]})
        self.api("POST", f"sessions/{session.pk}/prepare")
        self.wait_until(f"document.getElementById('stats').dataset.turns === '{turns + 1}'", timeout=10)
        page.wait_for_selector("#time-bar-news:not([hidden])", timeout=5_000)
        assert page.text_content("#time-bar [data-turn-count]") == str(turns + 1)
        assert f"turn {turns + 1} arrived while you look at turn 3" in page.text_content("#time-bar-news")
        assert page.get_attribute("#scrubber", "max") == str(turns + 1)
        assert page.get_attribute("#flow-pinned", "data-turn") == "3"

        page.click("#follow-latest")
        page.wait_for_selector(f'#time-bar[data-live="1"][data-turn="{turns + 1}"]')
        self.wait_until("location.search === ''", timeout=5)
        assert not self.page_errors
