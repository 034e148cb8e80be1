"""Checks of spec §4 over what the web app stored."""

from __future__ import annotations

import json

from contextlab.sessions.models import AgentSession, SessionMessage
from contextlab.sessions.services.persistence import stored_live_ids


def assert_nothing_lost(session: AgentSession) -> None:
    """Every message ever ingested is in the live context or in the archive, as ingested."""
    session.refresh_from_db()
    live_ids = stored_live_ids(session)
    rows = list(SessionMessage.objects.filter(session=session).order_by("seq"))
    assert len({r.message_id for r in rows}) == len(rows)
    assert [r.seq for r in rows] == list(range(1, len(rows) + 1))
    assert set(live_ids) == {r.message_id for r in rows if r.status == "live"}
    for row in rows:
        if row.status == "live":
            continue
        path = session.workspace / row.archive_file
        lines = path.read_text(encoding="utf-8").splitlines()
        record = json.loads(lines[row.archive_line - 1])
        assert record["id"] == row.message_id
        assert record["content"] == row.content
