"""A CoPaw workspace uploaded in the browser, drawn as any session: flow, ledger, summary diff.

With CONTEXTLAB_SCREENSHOTS=1 the pages are also saved to docs/screenshots/.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from contextlab.sessions.models import AgentSession, Turn
from tests.corpus import REPO
from tests.e2e.browser import BrowserTestCase
from tests.observed.copaw import zip_of


def _number(text: str | None) -> int:
    return int(re.sub(r"[^\d]", "", text or ""))


class TestCopawSession(BrowserTestCase):
    @pytest.fixture(autouse=True)
    def _folder(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.shots = REPO / "docs" / "screenshots" if os.environ.get("CONTEXTLAB_SCREENSHOTS") else tmp_path

    def test_it_draws_an_uploaded_copaw_workspace(self) -> None:
        archive = zip_of(self.tmp / "copaw-workspace.zip")
        page = self.page
        self.open("/import/")
        page.set_input_files("#id_file", str(archive))
        page.fill("#id_title", "CoPaw 1.0.2 run")
        page.click(".import-form button[type=submit]")
        page.wait_for_url(re.compile(r".*/sessions/[0-9a-f-]+/$"), timeout=60_000)
        session = AgentSession.objects.get(owner=self.alice, title="CoPaw 1.0.2 run")
        assert session.compactions_count == 4

        # The decision flow of the compaction that split a turn (request 40).
        turn = next(t for t in Turn.objects.filter(session=session, outcome="compacted")
                    if t.trace["observed"]["request"] == 40)
        self.open(turn.get_absolute_url())
        archived = page.text_content('[data-node="mark_compressed"] dd[data-k="archived"]')
        assert _number(archived) == 33
        assert "turn split" in (page.text_content("main") or "")
        page.screenshot(path=str(self.shots / "copaw-flow.png"), full_page=True)

        self.open(session.get_absolute_url())
        page.click('.tabs [data-tab="ledger"]')
        ledger = page.locator("#ledger-card")
        assert "tool_result/" in (ledger.text_content() or "")
        ledger.screenshot(path=str(self.shots / "copaw-ledger.png"))

        self.open(f"/sessions/{session.pk}/summaries/?v=2")
        assert "v2 against v1" in (page.text_content("main") or "")
        page.screenshot(path=str(self.shots / "copaw-summary-diff.png"), full_page=True)
        assert not self.page_errors
