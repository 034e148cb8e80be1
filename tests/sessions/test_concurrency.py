"""Two writers on one session (the hook and a manual compaction) never interleave.

Runs against PostgreSQL, where ``select_for_update`` does the locking:
DATABASE_URL=postgres://postgres@127.0.0.1:5432/contextlab pytest tests/sessions/test_concurrency.py
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, SessionMessage, Turn
from tests.conversations import answer, tool_turn
from tests.invariants import assert_nothing_lost

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks need PostgreSQL"),
]


def _in_thread(barrier: threading.Barrier, errors: list[BaseException], work) -> threading.Thread:
    def run() -> None:
        try:
            barrier.wait(timeout=30)
            work()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connections.close_all()

    return threading.Thread(target=run)


def test_it_serialises_the_hook_and_a_manual_compaction(alice_session):
    for i in range(1, 4):
        services.messages_append(session=alice_session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                 *tool_turn(i, output_bytes=1_200)])
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def hooks() -> None:
        session = AgentSession.objects.get(pk=alice_session.pk)
        for i in range(4, 10):
            services.messages_append(session=session, messages=[answer(i - 1), *tool_turn(i, output_bytes=1_200)])
            services.session_prepare(session=session)

    def compactions() -> None:
        session = AgentSession.objects.get(pk=alice_session.pk)
        for _ in range(4):
            services.compaction_run(session=session, instruction="Keep the target names.")

    threads = [_in_thread(barrier, errors, hooks), _in_thread(barrier, errors, compactions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors

    alice_session.refresh_from_db()
    numbers = list(Turn.objects.filter(session=alice_session).order_by("number").values_list("number", flat=True))
    assert numbers == list(range(1, 11))  # 6 hook turns + 4 compactions, none lost or doubled
    assert alice_session.turns_count == 10
    assert alice_session.engine_state["turn"] == 10
    # Every message ingested by either thread is recorded exactly once, in order.
    assert SessionMessage.objects.filter(session=alice_session).count() == (3 + 4 + 4) + 6 * 4
    assert_nothing_lost(alice_session)
    versions = list(alice_session.summary_versions.values_list("version", flat=True))
    assert versions == list(range(1, alice_session.summary_version + 1))
