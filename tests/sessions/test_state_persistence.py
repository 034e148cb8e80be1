"""The engine kept in process between requests, and its state stored incrementally:
a small header on the session row, each live message in its own row."""

from __future__ import annotations

import json

import pytest

from contextlab.sessions import services
from contextlab.sessions.models import AgentSession
from contextlab.sessions.services import persistence
from contextlab.sessions.services.persistence import EngineCache, load_manager
from tests.conversations import answer, tool_turn
from tests.invariants import assert_nothing_lost

pytestmark = pytest.mark.django_db(transaction=True)


def _steps(session: AgentSession, first: int, last: int) -> None:
    for i in range(first, last + 1):
        services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                            *tool_turn(i, output_bytes=1_800)])
        services.session_prepare(session=session)


def _comparable(state: dict) -> dict:
    return {**state, "archived_ids": sorted(state["archived_ids"]), "ids": sorted(state["ids"])}


def test_it_rebuilds_from_the_header_and_rows_exactly_the_engine_it_kept(alice_session):
    _steps(alice_session, 1, 12)
    alice_session.refresh_from_db()
    assert alice_session.compactions_count > 0  # truncation and compaction both happened
    kept = persistence.engines.take(alice_session)
    assert kept is not None
    cold = load_manager(alice_session)
    assert cold is not kept
    assert _comparable(cold.export_state(history=False)) == _comparable(kept.export_state(history=False))


def test_it_keeps_message_content_out_of_the_session_row(alice_session):
    _steps(alice_session, 1, 4)
    alice_session.refresh_from_db()
    header = json.dumps(alice_session.engine_state)
    assert "messages" not in alice_session.engine_state
    assert "[t4] step 0001" not in header  # a live tool result's text lives in its row only
    # Neither the live ids nor the calls: the rows' order is the live order, and calls have rows.
    assert alice_session.engine_state["live"] == {"unrowed_at": {}}
    assert "live_ids" not in alice_session.engine_state and "calls" not in alice_session.engine_state


def test_it_reuses_the_engine_while_its_version_is_current(alice_session):
    _steps(alice_session, 1, 2)
    alice_session.refresh_from_db()
    first = persistence.engines.take(alice_session)
    assert first is not None
    persistence.engines.keep(alice_session, first)
    _steps(alice_session, 3, 3)
    alice_session.refresh_from_db()
    assert persistence.engines.take(alice_session) is first


def test_it_reloads_when_another_process_moved_the_version(alice_session, monkeypatch):
    # Two processes, each with its own cache, taking turns on one session.
    process_a, process_b = EngineCache(size=8), EngineCache(size=8)
    for i in range(1, 9):
        monkeypatch.setattr(persistence, "engines", process_a if i % 2 else process_b)
        _steps(alice_session, i, i)
    alice_session.refresh_from_db()
    assert alice_session.turns_count == 8
    assert process_a.take(alice_session) is None  # its engine is of an older version
    assert_nothing_lost(alice_session)


def test_it_loads_a_session_saved_whole_before_the_header(alice_session):
    _steps(alice_session, 1, 3)
    alice_session.refresh_from_db()
    whole = load_manager(alice_session).export_state(history=False)
    # A row as an older release left it: the whole state, no per-message forms.
    AgentSession.objects.filter(pk=alice_session.pk).update(engine_state=whole, state_version=100)
    alice_session.messages.update(live_form=None)
    _steps(alice_session, 4, 5)
    alice_session.refresh_from_db()
    assert "live" in alice_session.engine_state
    assert not alice_session.messages.filter(status="live", live_form=None).exists()
    assert_nothing_lost(alice_session)


def test_it_previews_a_compaction_on_the_kept_engine_without_the_sessions_lock(alice_session, monkeypatch):
    from contextlab.sessions.services import compaction

    _steps(alice_session, 1, 3)
    alice_session.refresh_from_db()
    expected = load_manager(alice_session).preview_compaction().to_dict()

    def no_lock(*args, **kwargs):
        raise AssertionError("a preview of a kept engine must not lock the session")

    monkeypatch.setattr(compaction, "locked_session", no_lock)
    # The pages ask on every live update: each time from the kept engine, which stays kept.
    assert services.compaction_preview(session=alice_session) == expected
    assert services.compaction_preview(session=alice_session) == expected
    assert persistence.engines.take(alice_session) is not None
