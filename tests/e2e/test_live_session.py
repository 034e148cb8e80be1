"""The session page in a real browser, updated over the websocket with no reload."""

from __future__ import annotations

import re

from contextlab.dashboard import fragments
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, CompactionRun, SummaryVersion, Turn
from tests.conversations import answer, tool_turn
from tests.e2e.browser import BrowserTestCase

SMALL = {"max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400}


def _number(text: str) -> int:
    return int(re.sub(r"[^\d]", "", text))


class LiveSessionTests(BrowserTestCase):
    def _session(self, turns: int = 0) -> AgentSession:
        profile = services.profile_create(owner=self.alice, name="small", knobs=SMALL)
        session = services.session_create(owner=self.alice, system_prompt="You are a careful coding agent.",
                                          profile=profile, title="Live")
        for i in range(1, turns + 1):
            services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                *tool_turn(i, output_bytes=1_500)])
            services.session_prepare(session=session)
        session.refresh_from_db()
        return session

    def test_it_moves_the_gauge_when_messages_are_posted_through_the_api(self) -> None:
        session = self._session(turns=1)
        self.open_live(session.get_absolute_url())
        page = self.page
        # Marks this document: a reload would lose it.
        page.evaluate("window.__sameDocument = true")
        before = _number(page.text_content("#gauge .gauge-used"))
        self.api("POST", f"sessions/{session.pk}/messages", {"messages": [answer(1), *tool_turn(2, output_bytes=900)]})
        session.refresh_from_db()
        expected = fragments.gauge_context(session, fragments.latest_turn(session))["gauge"]["total"]
        assert expected > before
        self.wait_until(
            f"document.querySelector('#gauge .gauge-used').dataset.total === '{expected}'", timeout=10)
        assert page.evaluate("window.__sameDocument") is True
        assert "4 messages appended since" in page.text_content("#gauge")
        # The other fragments follow the gauge (rendered once every viewer has its gauge).
        self.wait_until(
            f"document.querySelector('#stats').dataset.messages === '{session.messages_count}'", timeout=10)
        # The newest message heads the fate list, pushed too.
        self.wait_until(
            f"document.querySelector('#fate-live tbody tr').dataset.seq === '{session.messages_count}'",
            timeout=10)
        # A turn moves the chart and the flow as well.
        self.api("POST", f"sessions/{session.pk}/prepare")
        self.wait_until("document.querySelector('#flow-live').dataset.turn === '2'", timeout=10)
        assert page.evaluate("JSON.parse(document.getElementById('chart-data').dataset.chart).turns") == [1, 2]
        assert not self.page_errors

    def test_it_shows_the_numbers_of_a_compacting_turn_in_its_decision_flow(self) -> None:
        session = self._session(turns=12)
        turn = Turn.objects.filter(session=session, outcome="compacted").order_by("number").first()
        assert turn is not None
        self.open_live(session.get_absolute_url())
        page = self.page
        page.click(f'#turns-panel tr[data-turn="{turn.number}"]')
        page.wait_for_selector(f'#flow-pinned[data-turn="{turn.number}"]')
        steps = {s["step"]: s for s in turn.trace["steps"]}

        def shown(node: str, label: str) -> int:
            return _number(page.text_content(f'#flow-pinned [data-node="{node}"] dd[data-k="{label}"]'))

        gate = steps["gate"]["numbers"]
        assert shown("gate", "threshold") == gate["threshold"]
        assert shown("gate", "used") == gate["used"]
        assert shown("gate", "left") == gate["left"]
        split = steps["context_check"]["numbers"]
        assert shown("context_check", "to compact") == split["compact_count"]
        assert shown("context_check", "compact tokens") == split["compact_tokens"]
        assert shown("context_check", "kept tokens") == split["kept_tokens"]
        assert shown("mark_compressed", "archived") == steps["mark_compressed"]["numbers"]["archived"]
        assert shown("result", "payload tokens") == turn.payload_tokens
        assert page.get_attribute('#flow-pinned [data-node="skip"]', "data-state") == "skipped"
        assert page.get_attribute('#flow-pinned [data-node="initial"]', "data-state") == "fired"
        # The LLM view beside it shows the same turn.
        assert f"Turn {turn.number}" in page.text_content("#llm-pinned .llm-head")
        assert "is-selected" in (page.get_attribute(f'#turns-panel tr[data-turn="{turn.number}"]', "class") or "")
        assert not self.page_errors

    def test_it_streams_a_manual_compaction_started_by_a_click(self) -> None:
        session = self._session(turns=3)
        services.messages_append(session=session, messages=[answer(3), *tool_turn(4, output_bytes=300)])
        turns_before = Turn.objects.filter(session=session).count()
        self.open_live(session.get_absolute_url())
        page = self.page
        page.click('.tabs [data-tab="compaction"]')
        page.fill("#compaction-instruction", "keep every log path")
        page.click("text=Preview the split")
        page.wait_for_selector("#compaction-preview .split")
        page.click("#compact-button")
        page.wait_for_selector('#compaction tr[data-status="done"]', timeout=15_000)
        run = CompactionRun.objects.get(session=session)
        assert run.status == "done" and run.instruction == "keep every log path"
        assert run.turn_number == turns_before + 1
        panel = page.text_content("#compaction")
        assert f"turn {run.turn_number}" in panel and run.outcome in panel
        # Everything before the newest request is summarised: nothing is left to compact, and it says so.
        assert page.is_disabled("#compact-button")
        assert "nothing to compact" in page.text_content("#compact-blocker")
        # The result streams into the rest of the page too: the new turn and its flow.
        self.wait_until(f"document.querySelector('#flow-live').dataset.turn === '{run.turn_number}'",
                               timeout=10)
        self.wait_until(f"document.querySelector('#stats').dataset.turns === '{run.turn_number}'",
                               timeout=10)
        assert not self.page_errors

    def test_it_shows_a_script_in_tool_output_as_text_and_never_runs_it(self) -> None:
        session = self._session()
        evil = '<script>window.__pwned = true</script><img src=x onerror="window.__pwned = true">'
        self.open_live(session.get_absolute_url())
        page = self.page
        # Arrives over the websocket, as an out-of-band fragment.
        self.api("POST", f"sessions/{session.pk}/messages", {"messages": [
            {"role": "user", "content": "fetch the page"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "fetch", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": evil}]})
        page.click('.tabs [data-tab="messages"]')
        page.wait_for_selector("#fate-live tr[data-seq='3']")
        self.api("POST", f"sessions/{session.pk}/prepare")
        page.click('.tabs [data-tab="llm"]')
        page.wait_for_selector("#llm-live [data-layer='tool_results']")
        assert "<script>window.__pwned = true</script>" in page.text_content("#llm-live [data-layer='tool_results']")
        assert page.evaluate("window.__pwned") is None
        # And on a fresh load of every page that shows it.
        for path in (session.get_absolute_url(), f"{session.get_absolute_url()}messages/3/"):
            self.open(path)
            page.wait_for_load_state("networkidle")
            assert page.evaluate("window.__pwned") is None
            assert "<script>window.__pwned = true</script>" in page.text_content("main")
        assert not self.page_errors


class SummaryAndProfileTests(BrowserTestCase):
    def test_the_diff_viewer_flags_a_removed_path(self) -> None:
        session = services.session_create(owner=self.alice, system_prompt="", title="Diffs")
        old = "## Goal\n- ship it\n\n## Critical Context\n- config at /srv/app/config/settings.yaml\n"
        new = "## Goal\n- ship it\n\n## Critical Context\n- config read\n"
        SummaryVersion.objects.create(session=session, version=1, text=old, turn=1, compactor="extractive")
        SummaryVersion.objects.create(session=session, version=2, text=new, turn=2, compactor="extractive")
        self.open(f"{session.get_absolute_url()}summaries/")
        lost = self.page.text_content("#lost")
        assert "/srv/app/config/settings.yaml" in lost
        assert self.page.locator(".section-diff del", has_text="/srv/app/config/settings.yaml").count() == 1
        assert not self.page_errors

    def test_the_profile_form_rejects_a_reserve_over_the_threshold(self) -> None:
        self.open("/profiles/new/")
        page = self.page
        page.fill("#id_name", "tight")
        page.fill("#id_max_input_length", "10000")
        page.fill("#id_compact_ratio", "0.3")
        page.fill("#id_reserve_ratio", "0.35")
        # The live preview says it on the field before anything is submitted.
        self.wait_until(
            "document.getElementById('err-reserve_ratio').textContent.includes('must be smaller than the compaction threshold')",
            timeout=10)
        assert _number(page.text_content('#preview dd[data-k="threshold"]')) == 3_000
        assert _number(page.text_content('#preview dd[data-k="reserve"]')) == 3_500
        page.click("text=Create the profile")
        page.wait_for_load_state("networkidle")
        assert page.url.endswith("/profiles/new/")
        assert "must be smaller than the compaction threshold" in page.text_content(
            '[data-field="reserve_ratio"] .field-errors')
        page.fill("#id_reserve_ratio", "0.1")
        page.click("text=Create the profile")
        page.wait_for_url(f"{self.live_server_url}/profiles/")
        assert "tight" in page.text_content("main")
        assert not self.page_errors
