"""What one turn writes does not grow with the session: the state header, the SQL
statements of an API turn, and the live order a cold load reads back from the rows."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile, AgentSession, SessionCall
from contextlab.sessions.services import persistence
from contextlab.sessions.services.persistence import fate_sizes, load_manager, locked_session, persist_step
from tests.conftest import JsonClient
from tests.invariants import assert_nothing_lost

pytestmark = pytest.mark.django_db(transaction=True)


def _exchange(i: int) -> list[dict[str, Any]]:
    """An agent's step: the answer to the last one, a user ask, a tool call and its result."""
    return [
        {"role": "assistant", "content": f"Step {i - 1} done."},
        {"role": "user", "content": f"Step {i}: build t{i}."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": "run_shell",
                                                                 "arguments": json.dumps({"command": f"make t{i}"})}}]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": f"[t{i}] built"},
    ]


@pytest.fixture
def wide(alice: User) -> AgentProfile:
    # Nothing compacts and nothing is cut: only the web tier's own work grows or not.
    return services.profile_create(owner=alice, name="wide", knobs={"max_input_length": 10_000_000})


def _session_of(alice: User, profile: AgentProfile, live: int) -> AgentSession:
    session = services.session_create(owner=alice, system_prompt="You build things.", profile=profile)
    messages = [m for i in range(1, live // 4 + 1) for m in _exchange(i)]
    services.messages_append_openai(session=session, messages=messages)
    services.session_prepare(session=session)
    session.refresh_from_db()
    return session


def _api_turn(api: JsonClient, session: AgentSession, step: int) -> None:
    assert api.post(f"/api/v1/sessions/{session.pk}/messages", {"messages": _exchange(step)}).status_code == 201
    assert api.post(f"/api/v1/sessions/{session.pk}/prepare", {}).status_code == 200


def test_it_keeps_the_state_header_the_same_size_at_100_and_1000_live_messages(alice, wide):
    sizes = {}
    for live in (100, 1_000):
        session = _session_of(alice, wide, live)
        assert session.live_count >= live
        sizes[live] = len(json.dumps(session.engine_state))
        # The calls are rows: one per call, the engine's record of them.
        assert SessionCall.objects.filter(session=session, made=True, answered=True).count() == live // 4
    # The turn number's digits may differ; 900 more live messages and 225 more calls may not
    # (they were about 36 and 33 bytes each in the header before).
    assert abs(sizes[1_000] - sizes[100]) < 20, sizes


def test_it_runs_an_api_turn_in_the_same_sql_statements_at_100_and_1000_live_messages(alice, wide, api):
    statements = {}
    for live in (100, 1_000):
        session = _session_of(alice, wide, live)
        step = live // 4 + 1
        _api_turn(api, session, step)  # this process now keeps the session's engine
        with CaptureQueriesContext(connection) as queries:
            _api_turn(api, session, step + 1)
        statements[live] = [q["sql"].split(" ", 1)[0] for q in queries.captured_queries]
    assert statements[100] == statements[1_000]
    # Append: token, session, lock, new rows, call row, session row; prepare: token, session, lock,
    # turn row, session row; two BEGIN/COMMIT pairs.
    assert len(statements[1_000]) <= 16, statements[1_000]


def test_it_rebuilds_the_live_order_from_the_rows_or_from_the_listed_ids(alice, wide):
    session = _session_of(alice, wide, 40)
    persistence.engines.clear()
    assert load_manager(session).live_ids() == persistence.stored_live_ids(session)
    # A step that puts the live messages out of their rows' order (no service does it
    # today; a policy might): the header then lists the order, and a cold load follows it.
    with locked_session(session) as (locked, manager):
        before = fate_sizes(manager)
        manager.messages[2], manager.messages[3] = manager.messages[3], manager.messages[2]
        expected = manager.live_ids()
        persist_step(locked, manager, before=before)
    session.refresh_from_db()
    assert session.engine_state["live_ids"] == expected
    persistence.engines.clear()
    assert load_manager(session).live_ids() == expected
    # The next step that keeps that order still lists it; nothing is lost either way.
    services.messages_append_openai(session=session, messages=_exchange(11))
    session.refresh_from_db()
    assert persistence.stored_live_ids(session)[:len(expected)] == expected
    assert_nothing_lost(session)


def test_it_brings_back_the_calls_of_a_cold_load_as_the_header_held_them(alice, wide):
    session = _session_of(alice, wide, 40)
    with locked_session(session) as (_, kept):
        kept_state = kept.export_state(history=False)
    persistence.engines.clear()
    session.refresh_from_db()
    cold = load_manager(session)
    assert cold.export_state(history=False)["calls"] == kept_state["calls"]
    assert cold.export_state(history=False)["answered"] == kept_state["answered"]
    assert cold.call_names() == {f"call_{i}": "run_shell" for i in range(1, 11)}


def test_it_moves_the_calls_of_an_existing_header_into_rows_on_migrating(alice, wide):
    from django.db.migrations.executor import MigrationExecutor

    session = _session_of(alice, wide, 40)
    with locked_session(session) as (_, kept):
        expected = kept.export_state(history=False)
    # The header as the release before wrote it: calls, answered and live ids in it, no call rows.
    old_header = kept.export_state(per_message=False)
    before = [("contextlab_sessions", "0011_compaction_review_and_pins")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)  # the call rows' table goes
    AgentSession.objects.filter(pk=session.pk).update(engine_state=old_header)
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    session.refresh_from_db()
    assert "calls" not in session.engine_state and "answered" not in session.engine_state
    assert session.engine_state["live_ids"] == old_header["live_ids"]
    assert SessionCall.objects.filter(session=session, made=True, answered=True).count() == 10
    persistence.engines.clear()
    assert load_manager(session).export_state(history=False) == expected


def test_it_carries_the_call_rows_through_a_bundle(alice, wide):
    session = _session_of(alice, wide, 40)
    with locked_session(session) as (_, kept):
        expected = kept.export_state(history=False)
    copy = services.session_import_bundle(owner=alice, data=services.session_export(session=session))
    assert SessionCall.objects.filter(session=copy).count() == 10
    persistence.engines.clear()
    restored = load_manager(copy).export_state(history=False)
    assert (restored["calls"], restored["answered"]) == (expected["calls"], expected["answered"])
    # The copy goes on: a result for one of its calls pairs with it.
    services.messages_append_openai(session=copy, messages=_exchange(11))
    assert_nothing_lost(copy)


def test_it_forgets_the_call_rows_when_an_import_starts_again(alice, wide):
    from contextlab.sessions.services.runs import import_reset

    session = _session_of(alice, wide, 40)
    import_reset(session)
    assert not SessionCall.objects.filter(session=session).exists()
    services.messages_append_openai(session=session, messages=[m for i in range(1, 4) for m in _exchange(i)])
    assert SessionCall.objects.filter(session=session).count() == 3
