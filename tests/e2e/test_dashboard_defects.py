"""The defects found by trying the dashboard in Chromium as its three kinds of users, each fixed."""

from __future__ import annotations

import re

from contextlab.engine.core.profile import BOUNDS
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, SessionMessage, Turn
from tests.conversations import answer, tool_turn
from tests.e2e.browser import BrowserTestCase

SMALL = {"max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400}
WIDTHS = (1440, 1024)
# Counts htmx's complaint about a pushed fragment with no target on the page.
COUNT_OOB_ERRORS = """() => {
  window.__oobErrors = 0;
  document.body.addEventListener('htmx:oobErrorNoTarget', () => { window.__oobErrors += 1; });
}"""


def _number(text: str) -> int:
    return int(re.sub(r"[^\d]", "", text))


class DefectTests(BrowserTestCase):
    def _session(self, turns: int) -> AgentSession:
        profile = services.profile_create(owner=self.alice, name="small", knobs=SMALL)
        session = services.session_create(owner=self.alice, system_prompt="You are a careful coding agent.",
                                          profile=profile, title="Defects")
        for i in range(1, turns + 1):
            services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                *tool_turn(i, output_bytes=1_500)])
            services.session_prepare(session=session)
        session.refresh_from_db()
        return session

    def test_the_admin_shows_an_invalid_profile_value_as_a_form_error(self) -> None:
        self.alice.is_staff = self.alice.is_superuser = True
        self.alice.save()
        profile = services.profile_create(owner=self.alice, name="tight", knobs={})
        page = self.page
        self.open(f"/admin/contextlab_sessions/agentprofile/{profile.pk}/change/")
        # The admin's number inputs carry the engine's bounds too.
        assert page.get_attribute("#id_compact_ratio", "min") == "0.1"
        assert page.get_attribute("#id_compact_ratio", "max") == "0.95"
        # Each value in bounds, together invalid: the reserve would be over the threshold.
        page.fill("#id_compact_ratio", "0.4")
        page.fill("#id_reserve_ratio", "0.45")
        with page.expect_response(lambda r: r.request.method == "POST") as posted:
            page.click("input[name=_save]")
        assert posted.value.status == 200
        assert "must be smaller than the compaction threshold" in page.text_content(".errorlist")
        # The read-only derived numbers are computed from what was typed.
        window = profile.max_input_length
        assert f"{int(window * 0.45):,}" in page.text_content(".field-derived_reserve")
        assert f"{int(window * 0.4):,}" in page.text_content(".field-derived_threshold")
        assert not self.page_errors

    def test_every_number_input_of_the_profile_form_has_the_engines_bounds(self) -> None:
        self.open("/profiles/new/")
        page = self.page
        checked = 0
        for name, bound in BOUNDS.items():
            field = page.locator(f"#id_{name}")
            if not field.count() or field.get_attribute("type") != "number":
                continue
            assert float(field.get_attribute("min") or "nan") == bound.low, name
            assert float(field.get_attribute("max") or "nan") == bound.high, name
            checked += 1
        assert checked >= 12
        # A value inside the engine's bounds is valid to the browser, whatever its decimals.
        page.fill("#id_compact_ratio", "0.333")
        assert page.evaluate("document.getElementById('id_compact_ratio').checkValidity()") is True
        # The arrow key moves a ratio by a hundredth, never to 0.
        page.fill("#id_compact_ratio", "0.75")
        page.focus("#id_compact_ratio")
        page.keyboard.press("ArrowDown")
        assert float(page.input_value("#id_compact_ratio")) == 0.74
        for _ in range(80):
            page.keyboard.press("ArrowDown")
        assert float(page.input_value("#id_compact_ratio")) == 0.1
        assert not self.page_errors

    def test_the_turn_list_stays_beside_the_flow_and_the_chart_ticks_are_whole_turns(self) -> None:
        session = self._session(turns=9)
        services.messages_append(session=session, messages=[answer(9), *tool_turn(10, output_bytes=1_500)])
        services.compaction_run(session=session)
        for width in WIDTHS:
            self.page.set_viewport_size({"width": width, "height": 900})
            self.open_live(session.get_absolute_url())
            boxes = self.page.evaluate("""() => {
              const r = (s) => document.querySelector(s).getBoundingClientRect();
              const list = document.querySelector('#turns-live');
              return {list: r('.inspector-turns'), flow: r('.inspector-flow'), table: r('.turns-table'),
                      scroll: list.scrollWidth, client: list.clientWidth};
            }""")
            assert boxes["list"]["right"] <= boxes["flow"]["left"], width
            assert boxes["table"]["right"] <= boxes["list"]["right"] + 0.5, width
            assert boxes["scroll"] <= boxes["client"], width
            self.wait_until("document.getElementById('chart-canvas')._plot", timeout=5)
            ticks = self.page.evaluate("document.getElementById('chart-canvas')._plot.axes[0]._splits")
            assert ticks and all(float(t).is_integer() for t in ticks), (width, ticks)
        assert not self.page_errors

    def test_search_keeps_the_spaces_around_the_match_and_a_true_history(self) -> None:
        session = self._session(turns=2)
        services.messages_append(session=session, messages=[
            answer(2), {"role": "user", "content": "Please add a .dialyzerignore file to the repo root."}])
        services.compaction_run(session=session)
        message = SessionMessage.objects.get(session=session, current_content__icontains="dialyzerignore")
        entered = next(e["before_turn"] for e in message.fate if e.get("event") == "ingested")
        self.open(f"{session.get_absolute_url()}search?q=.dialyzerignore")
        snippet = self.page.text_content(".hit .snippet")
        assert "add a .dialyzerignore file to" in snippet
        history = self.page.text_content(".hit .timeline")
        if message.compacted_turn is not None and message.compacted_turn <= entered:
            assert "never sent before its compaction" in history
        assert not re.search(rf"until turn {entered - 1}\b", history)
        assert not self.page_errors

    def test_compact_now_is_disabled_with_the_reason_when_nothing_can_be_compacted(self) -> None:
        session = self._session(turns=3)
        services.messages_append(session=session, messages=[answer(3), *tool_turn(4, output_bytes=300)])
        services.compaction_run(session=session)
        turns = Turn.objects.filter(session=session).count()
        self.open_live(f"{session.get_absolute_url()}#tab-compaction")
        page = self.page
        assert page.is_disabled("#compact-button")
        assert "nothing to compact" in page.text_content("#compact-blocker")
        # The server refuses too, and no empty turn is added.
        status = page.evaluate("""async () => {
          const form = document.getElementById('compaction-form');
          const r = await fetch(form.action, {method: 'POST', body: new FormData(form), headers: {'HX-Request': 'true'}});
          return r.status;
        }""")
        assert status == 409
        assert Turn.objects.filter(session=session).count() == turns
        # A new request makes the older messages compactable: the button comes back, pushed.
        self.api("POST", f"sessions/{session.pk}/messages", {"messages": [answer(4), *tool_turn(5, output_bytes=300)]})
        self.wait_until("!document.getElementById('compact-button').disabled", timeout=10)
        assert page.locator("#compact-blocker").count() == 0
        assert not self.page_errors

    def test_a_saved_profile_reaches_the_open_session_page_and_a_pinned_turn_gets_no_stray_push(self) -> None:
        session = self._session(turns=4)
        page = self.page
        self.open_live(session.get_absolute_url())
        page.evaluate(COUNT_OOB_ERRORS)
        page.evaluate("window.__sameDocument = true")
        page.click('#turns-panel tr[data-turn="2"]')
        page.wait_for_selector('#flow-pinned[data-turn="2"]')
        # The operator saves the profile in another tab.
        editor = self.context.new_page()
        editor.goto(f"{self.live_server_url}/profiles/{session.profile_id}/")
        editor.fill("#id_compact_ratio", "0.6")
        editor.click("text=Save")
        editor.wait_for_url(f"{self.live_server_url}/profiles/")
        self.wait_until("document.getElementById('session-profile').dataset.threshold === '2400'",
                               timeout=10)
        assert "2,400" in page.text_content("#session-profile")
        # Agent traffic while turn 2 stays pinned: pushes leave the pinned panels alone, with no error.
        self.api("POST", f"sessions/{session.pk}/messages", {"messages": [answer(4), *tool_turn(5, output_bytes=900)]})
        self.api("POST", f"sessions/{session.pk}/prepare")
        self.wait_until("document.getElementById('stats').dataset.turns === '5'", timeout=10)
        # The lists come in the second message of a push, where the flow and the LLM view would be too
        # (one message is swapped in one go).
        page.wait_for_selector('#turns-live tr[data-turn="5"]', timeout=10_000)
        assert page.get_attribute("#flow-pinned", "data-turn") == "2"
        assert page.evaluate("window.__oobErrors") == 0
        assert page.evaluate("window.__sameDocument") is True
        assert not self.page_errors

    def test_the_session_page_is_tabbed_and_shows_the_providers_usage(self) -> None:
        session = self._session(turns=6)
        self.api("POST", f"sessions/{session.pk}/usage", {"turn": 6, "usage": {
            "prompt_tokens": 2_345, "completion_tokens": 120}})
        page = self.page
        page.set_viewport_size({"width": 1440, "height": 900})
        self.open_live(session.get_absolute_url())
        height = page.evaluate("document.documentElement.scrollHeight")
        assert height < 2_600, height
        assert page.is_visible("#inspector") and not page.is_visible("#ledger-card")
        page.click('.tabs [data-tab="ledger"]')
        assert page.is_visible("#ledger-card") and not page.is_visible("#inspector")
        assert page.url.endswith("#tab-ledger")
        page.click('.tabs [data-tab="llm"]')
        usage = page.text_content("#llm-live .usage")
        assert "2,345" in usage and "completion_tokens 120" in usage
        turn = Turn.objects.get(session=session, number=6)
        assert f"{turn.payload_tokens:,}" in usage
        # A link to a card opens its tab.
        self.open(f"{session.get_absolute_url()}#compaction-card")
        assert page.is_visible("#compaction-card")
        assert not self.page_errors
