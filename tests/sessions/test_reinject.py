"""Re-injecting a compacted message's original into a session: the next payload carries it, fate and trace say so."""

from __future__ import annotations

import pytest

from contextlab.engine.core.errors import MalformedInput
from contextlab.lib.blocks import first_text
from contextlab.sessions import services
from contextlab.sessions.models import SessionMessage, Turn
from tests.dashboard.conftest import work


def test_it_puts_a_compacted_messages_original_into_the_next_payload(alice_session):
    work(alice_session, 12)
    worked_session = alice_session
    row = (SessionMessage.objects.filter(session=worked_session, status="archived", truncated_stage__isnull=False)
           .order_by("seq").first())
    assert row is not None
    original = first_text(row.content)
    added = services.message_reinject(session=worked_session, seq=row.seq)
    assert added.status == "live" and added.role == "user"
    assert added.fate[0]["reinjected_from"] == row.message_id
    row.refresh_from_db()
    assert row.fate[-1]["event"] == "reinjected" and row.fate[-1]["message_id"] == added.message_id
    # The row's earlier story is kept.
    assert [e["event"] for e in row.fate][:1] == ["ingested"] and row.status == "archived"
    payload, trace = services.session_prepare(session=worked_session)
    sent = "\n".join(str(m.get("content")) for m in payload)
    assert original.splitlines()[-1] in sent
    assert trace["payload"]["reinjected"] == [{"message_id": added.message_id, "source_id": row.message_id}]
    assert Turn.objects.get(session=worked_session, number=trace["turn"]).trace["payload"]["reinjected"]


def test_it_refuses_a_message_that_is_whole_in_the_context(alice_session):
    services.messages_append(session=alice_session, messages=[{"role": "user", "content": "hello"}])
    with pytest.raises(MalformedInput):
        services.message_reinject(session=alice_session, seq=1)
