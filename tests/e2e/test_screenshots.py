"""Screenshots of every page, from a real corpus session, into docs/screenshots/.

Only with CONTEXTLAB_SCREENSHOTS=1 (``scripts/screenshots.sh``): the pictures
are for reading, the other browser tests are for checking.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from contextlab.sessions import services
from contextlab.sessions.models import Turn
from tests.corpus import REPO, corpus_path
from tests.e2e.browser import BrowserTestCase

TAU = "tau-bench/gpt-4o-airline.idx52.task2.trial1.json"
OUT = REPO / "docs" / "screenshots"
# A window this small makes compaction fire three times on this 61-message run.
SMALL = {"max_input_length": 6_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 500}


@pytest.mark.skipif(os.environ.get("CONTEXTLAB_SCREENSHOTS") != "1", reason="set CONTEXTLAB_SCREENSHOTS=1")
class ScreenshotTests(BrowserTestCase):
    def shoot(self, name: str, selector: str | None = None, *, full_page: bool = False) -> Path:
        OUT.mkdir(parents=True, exist_ok=True)
        path = OUT / f"{name}.png"
        self.page.wait_for_load_state("networkidle")
        if selector:
            self.page.locator(selector).first.screenshot(path=str(path))
        else:
            self.page.screenshot(path=str(path), full_page=full_page)
        return path

    def test_it_screenshots_every_page(self) -> None:
        profile = services.profile_create(owner=self.alice, name="airline-6k", knobs=SMALL)
        session = services.transcript_import(owner=self.alice, path=corpus_path(TAU), profile=profile,
                                             title="tau-bench airline · task 2")
        services.profile_create(owner=self.alice, name="default-128k", knobs={})
        base = session.get_absolute_url()
        page = self.page

        self.open("/")
        self.shoot("sessions", "main")

        self.open_live(base)
        self.shoot("session")
        self.shoot("session-budget", "#gauge")
        self.shoot("session-chart", "#chart-card")
        turn = Turn.objects.filter(session=session, outcome="compacted").order_by("number").last()
        assert turn is not None
        page.click(f'#turns-panel tr[data-turn="{turn.number}"]')
        page.wait_for_selector(f'#flow-pinned[data-turn="{turn.number}"]')
        self.shoot("session-flow", "#inspector")
        self.shoot("session-llm-view", "#llm-card")
        page.click("text=Preview the split")
        page.wait_for_selector("#compaction-preview .split")
        self.shoot("session-compaction", "#compaction-card")
        self.shoot("session-ledger", "#ledger-card")
        self.shoot("session-messages", "#fate-card")
        self.shoot("session-full", full_page=True)

        self.open(f"{base}turns/{turn.number}/")
        self.shoot("turn", full_page=True)
        archived = session.messages.filter(status="archived", role="tool").order_by("seq").first()
        assert archived is not None
        self.open(f"{base}messages/{archived.seq}/")
        self.shoot("message", "main")

        self.open(f"{base}summaries/")
        self.shoot("summaries", full_page=True)
        self.open(f"{base}search?q=JG7FMM")
        self.shoot("search", full_page=True)

        self.open("/profiles/")
        self.shoot("profiles", "main")
        self.open(f"/profiles/{profile.pk}/")
        page.fill("#id_reserve_ratio", "0.8")
        page.wait_for_function(
            "document.getElementById('err-reserve_ratio').textContent.length > 0", timeout=5_000)
        self.shoot("profile-form", full_page=True)

        self.open("/import/")
        page.set_input_files("#id_file", files=[{"name": "broken.json", "mimeType": "application/json",
                                                 "buffer": b'[\n {"role": "user", "content": "hi"},\n {"role": oops}\n]'}])
        page.click("text=Upload and replay")
        page.wait_for_selector(".form-error")
        self.shoot("import", "main")
        assert not self.page_errors
