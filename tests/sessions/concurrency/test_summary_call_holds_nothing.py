"""A summary call in flight holds no lock: the same session and the others keep taking
appends and prepares, and the compaction lands without losing or doubling a message.

Runs on SQLite (a file database, see the conftest) and, in scaled mode, on PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest

from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, CompactionRun, SessionMessage, Turn
from tests.conversations import answer, tool_turn
from tests.fakellm import FakeLLM, Gate, Reply
from tests.invariants import assert_nothing_lost
from tests.sessions.concurrency.helpers import STEP_LIMIT_SECONDS, SUMMARY, in_thread

pytestmark = pytest.mark.django_db(transaction=True)



def _remote_session(alice, llm: FakeLLM, settings, title: str) -> AgentSession:
    # The operator offers the fake LLM as the provider "fake"; the profile picks it.
    settings.CONTEXTLAB_PROVIDERS = llm.provider
    profile = services.profile_create(owner=alice, name=f"remote {title}", knobs={
        "max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400,
        "compactor": "openai", "compaction_provider": "fake", "compaction_model": "fake-model",
        "compaction_timeout": 120.0, "compaction_retries": 0,
    })
    return services.session_create(owner=alice, system_prompt="You are a careful coding agent.", profile=profile,
                                   title=title)


def _fill(session: AgentSession, first: int, last: int) -> None:
    for i in range(first, last + 1):
        services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []), *tool_turn(i)])


def _traffic_during_the_call(gate: Gate, a: AgentSession, b: AgentSession) -> tuple[list[str], list[int]]:
    """While the summary call waits at the gate: appends and prepares on the compacting session
    and on another one. Returns the ids appended to ``a`` and the turn numbers its prepares got."""
    assert gate.arrived.wait(STEP_LIMIT_SECONDS), "the summary call never started"
    appended: list[str] = []
    prepared: list[int] = []
    errors: list[BaseException] = []

    def work() -> None:
        for i in range(30, 33):
            rows = services.messages_append(session=a, messages=[answer(i - 1), *tool_turn(i, output_bytes=200)])
            appended.extend(r.message_id for r in rows)
            _, trace = services.session_prepare(session=a)
            prepared.append(trace["turn"])
            services.messages_append(session=b, messages=[answer(i + 99), *tool_turn(i + 100, output_bytes=200)])
            services.session_prepare(session=b)
        assert not gate.opened.is_set()

    thread = in_thread(work, errors)
    thread.join(STEP_LIMIT_SECONDS)
    assert not thread.is_alive(), "a request waited for the session the summary is being written for"
    assert not errors, errors
    return appended, prepared


def _assert_compaction_landed_after(a: AgentSession, appended: list[str], turn: Turn) -> None:
    assert turn.outcome == "compacted", turn.trace
    check = next(s for s in turn.trace["steps"] if s["step"] == "context_check")
    assert check["details"]["planned"]["rebased_over"] == appended
    a.refresh_from_db()
    live = list(SessionMessage.objects.filter(session=a, status="live").values_list("message_id", flat=True))
    assert live[-len(appended):] == appended
    assert a.summary_call_until is None
    assert_nothing_lost(a)


def test_it_holds_nothing_during_a_manual_compactions_summary_call(alice, settings):
    gate = Gate(Reply(SUMMARY))
    with FakeLLM([gate]) as llm:
        a = _remote_session(alice, llm, settings, "a")
        b = _remote_session(alice, llm, settings, "b")
        _fill(a, 1, 3)
        _fill(b, 1, 1)
        errors: list[BaseException] = []
        runs: list[CompactionRun] = []
        compaction = in_thread(lambda: runs.append(services.compaction_run(session=a)), errors)
        appended, prepared = _traffic_during_the_call(gate, a, b)
        gate.opened.set()
        compaction.join(STEP_LIMIT_SECONDS)
        assert not compaction.is_alive() and not errors, errors
    assert len(llm.requests) == 1
    run = runs[0]
    assert run.status == "done"
    turn = Turn.objects.get(session=a, number=run.turn_number)
    # The prepares during the call were turns of their own (nothing to compact under the window).
    assert prepared == sorted(prepared) and run.turn_number > max(prepared)
    _assert_compaction_landed_after(a, appended, turn)
    assert_nothing_lost(b)


def test_it_answers_prepares_while_the_hooks_own_summary_call_runs(alice, settings):
    gate = Gate(Reply(SUMMARY))
    with FakeLLM([gate]) as llm:
        a = _remote_session(alice, llm, settings, "a")
        b = _remote_session(alice, llm, settings, "b")
        _fill(a, 1, 16)
        _fill(b, 1, 1)
        last_before = Turn.objects.filter(session=a).count()
        errors: list[BaseException] = []
        results: list[dict[str, Any]] = []
        hook = in_thread(lambda: results.append(services.session_prepare(session=a)[1]), errors)
        appended, prepared = _traffic_during_the_call(gate, a, b)
        gate.opened.set()
        hook.join(STEP_LIMIT_SECONDS)
        assert not hook.is_alive() and not errors, errors
    assert len(llm.requests) == 1
    # Prepares during the call: each kept every message (deferred) or got the last committed payload.
    deferred = Turn.objects.filter(session=a, outcome="compaction_deferred").count()
    assert deferred == len(set(prepared)) - (1 if last_before in prepared else 0)
    turn = Turn.objects.get(session=a, number=results[0]["turn"])
    _assert_compaction_landed_after(a, appended, turn)
    assert_nothing_lost(b)
