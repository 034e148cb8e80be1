"""Loss at compaction time, flagged where people look: the turn list, the chart, the sessions list, the diff."""

from __future__ import annotations

from contextlab.sessions import services
from contextlab.sessions.models import SessionMessage, SummaryVersion
from tests.conversations import answer, lose_the_index, many_codes, tool_turn
from tests.e2e.browser import BrowserTestCase

SMALL = {"max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400}


class CompactionLossTests(BrowserTestCase):
    def test_a_compaction_that_lost_identifiers_is_flagged_in_every_view(self) -> None:
        profile = services.profile_create(owner=self.alice, name="small", knobs=SMALL)
        session = services.session_create(owner=self.alice, system_prompt="You are a careful coding agent.",
                                          profile=profile, title="Losses")
        for i in range(1, 12):
            services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                *tool_turn(i, output_bytes=1_500)])
            if i == 2:
                services.messages_append(session=session, messages=[many_codes()])
            services.session_prepare(session=session)
        lose_the_index(session)
        version = SummaryVersion.objects.filter(session=session, lost_count__gt=0).order_by("version").first()
        assert version is not None
        total = sum(SummaryVersion.objects.filter(session=session).values_list("lost_count", flat=True))
        page = self.page

        # The sessions list: a column.
        self.open("/")
        assert page.get_attribute("td.lost-cell", "data-lost") == str(total)

        # The turn list: a count on the turn that wrote the version.
        self.open_live(session.get_absolute_url())
        chip = page.locator(f'#turns-live tr[data-turn="{version.turn}"] .lost-count')
        assert chip.get_attribute("data-lost") == str(version.lost_count)

        # The chart: a marker at that compaction, read out under the cursor.
        self.wait_until("document.getElementById('chart-canvas')._plot", timeout=5)
        lost = page.evaluate(f"""JSON.parse(document.getElementById('chart-data').dataset.chart)
                                 .compactions.find(c => c.turn === {version.turn}).lost""")
        assert lost == version.lost_count
        box = page.locator("#chart-canvas .u-over").bounding_box()
        x = page.evaluate(f"document.getElementById('chart-canvas')._plot.valToPos({version.turn}, 'x')")
        page.mouse.move(box["x"] + x, box["y"] + box["height"] / 2)
        self.wait_until(f"document.getElementById('chart-readout').textContent.startsWith('turn {version.turn} ')")
        assert f"{version.lost_count} identifier" in page.text_content("#chart-readout")

        # The summary diff: a section, each identifier linked to its message and to the search.
        chip.click()
        page.wait_for_url(f"**/summaries/?v={version.version}#lost-at-compaction")
        section = page.locator("#lost-at-compaction")
        flags = version.lost_at_compaction
        assert section.locator("li.ident").count() == len(flags)
        first = flags[0]
        seq = SessionMessage.objects.get(session=session, message_id=first["message_id"]).seq
        item = section.locator("li.ident").first
        assert first["value"] in item.text_content()
        assert item.locator(f'a[href$="/messages/{seq}/"]').count() == 1
        item.locator("text=where did it go?").click()
        page.wait_for_selector(".search-summary")
        assert first["value"] in page.text_content(".search-summary h2")
        assert not self.page_errors

    def test_the_issues_code_in_prose_is_kept_and_the_page_says_what_it_did_not_check(self) -> None:
        # The issue's walk: a code and a path in a user's sentence, then a manual compaction.
        session = services.session_create(owner=self.alice, system_prompt="You are a careful coding agent.",
                                          profile=services.profile_create(owner=self.alice, name="small",
                                                                          knobs=SMALL), title="Reservation")
        for i in range(1, 12):
            services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                *tool_turn(i, output_bytes=200)])
            if i == 3:
                services.messages_append(session=session, messages=[
                    {"role": "user", "content": "please also check reservation ZZ9PLZ and the file /srv/ux/audit.log"}])
        services.compaction_run(session=session)
        version = SummaryVersion.objects.get(session=session, version=1)
        page = self.page
        self.open(f"{session.get_absolute_url()}summaries/?v={version.version}")
        section = page.locator("#lost-at-compaction")
        # Never the green "nothing lost" while tool outputs went unsearched; what was not checked is named.
        assert section.get_attribute("data-verdict") == "unsure"
        assert page.locator("#lost-at-compaction .ok-note").count() == 0
        assert "tool output" in page.text_content("#loss-unchecked")
        assert section.locator("li.ident").count() == 0
        # The search agrees: the code was compacted into v1, which kept it.
        self.open(f"{session.get_absolute_url()}search?q=ZZ9PLZ")
        assert "did not keep it" not in page.text_content("main")
        assert not self.page_errors
