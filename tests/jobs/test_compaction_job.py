"""Manual compaction as a background job, end to end: enqueue -> pool -> run row."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, CompactionRun, SessionMessage
from contextlab.sessions.services import runs
from contextlab.support import jobs
from tests.conversations import answer, tool_turn
from tests.fakellm import FakeLLM, Reply, Sleep, Status
from tests.invariants import assert_nothing_lost

SUMMARY = ("## Goal\n- build every target\n## Constraints & Preferences\n- none\n## Progress\n### Done\n- t1\n"
           "### In Progress\n- t2\n### Blocked\n- none\n## Key Decisions\n- use make\n## Next Steps\n- t3\n"
           "## Critical Context\n- /srv/app/t1.log\n")

pytestmark = pytest.mark.django_db(transaction=True)


def _fill(session: AgentSession, turns: int = 3) -> None:
    for i in range(1, turns + 1):
        services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []), *tool_turn(i)])


def _llm_profile(alice, llm: FakeLLM, settings, *, timeout: float = 10.0):
    settings.CONTEXTLAB_PROVIDERS = llm.provider
    return services.profile_create(owner=alice, name=f"llm-{timeout}", knobs={
        "max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400,
        "compactor": "openai", "compaction_provider": "fake", "compaction_model": "fake-model",
        "compaction_timeout": timeout, "compaction_retries": 0,
    })


def _use_profile(session: AgentSession, profile) -> None:
    # An update, not save(): the object in hand holds an old engine state.
    AgentSession.objects.filter(pk=session.pk).update(profile=profile)
    session.refresh_from_db()


def test_it_runs_a_queued_compaction_on_the_pool_and_records_it(alice, alice_session, viewer):
    _fill(alice_session)
    page = viewer(alice_session.pk)
    run = services.compaction_enqueue(session=alice_session, instruction="Keep every path.", requested_by=alice)
    assert jobs.drain(30)
    run.refresh_from_db()
    assert run.status == CompactionRun.Status.DONE
    assert run.outcome == "compacted"
    assert run.started is not None and run.finished is not None and run.error == ""
    turn = alice_session.turns.get(number=run.turn_number)
    assert turn.trigger == "manual"
    alice_session.refresh_from_db()
    assert alice_session.summary_version == 1
    assert_nothing_lost(alice_session)

    events = page.events()
    statuses = [e["run"]["status"] for e in events if e["type"] == "run.update" and e["run_id"] == run.pk]
    assert statuses[0] in ("queued", "running")
    assert statuses[-1] == "done"
    gauges = [e for e in events if e["type"] == "gauge.update"]
    assert gauges and gauges[-1]["state"]["summary_version"] == 1
    assert gauges[-1]["state"]["turn"]["number"] == run.turn_number


def test_it_announces_every_committed_change_as_the_whole_gauge_state(alice_session, viewer):
    page = viewer(alice_session.pk)
    _fill(alice_session, 1)
    [event] = [e for e in page.events() if e["type"] == "gauge.update"]
    state = event["state"]
    assert event["session_id"] == str(alice_session.pk)
    assert state["messages"] == 3 and state["live_messages"] == 3
    assert state["tokens"]["live_messages"] > 0
    assert state["tokens"]["threshold"] == 2_800 and state["tokens"]["window"] == 4_000
    assert state["turn"] is None  # appended, no hook run yet
    services.session_prepare(session=alice_session)
    [event] = [e for e in page.events() if e["type"] == "gauge.update"]
    assert event["state"]["turn"]["number"] == 1
    assert event["state"]["turn"]["layers"]["total"] == event["state"]["tokens"]["used"]


def test_it_records_a_failed_summary_call_and_keeps_the_session_usable(alice, alice_session, settings):
    _fill(alice_session)
    with FakeLLM([Status(500, "the model is overloaded")]) as llm:
        _use_profile(alice_session, _llm_profile(alice, llm, settings))
        run = services.compaction_enqueue(session=alice_session)
        assert jobs.drain(30)
    run.refresh_from_db()
    # A manual compaction falls back to the offline summary; the run says the model failed.
    assert run.status == CompactionRun.Status.DONE
    assert run.outcome == "fallback_summary"
    assert "summary model failed" in run.error and "overloaded" in run.error
    assert_nothing_lost(alice_session)


def test_it_records_an_llm_timeout(alice, alice_session, settings):
    _fill(alice_session)
    with FakeLLM([Sleep(5, Reply(SUMMARY))]) as llm:
        _use_profile(alice_session, _llm_profile(alice, llm, settings, timeout=1.0))
        run = services.compaction_enqueue(session=alice_session)
        assert jobs.drain(30)
    run.refresh_from_db()
    assert run.outcome == "fallback_summary"
    assert "timed out" in run.error.lower() or "timeout" in run.error.lower()
    assert_nothing_lost(alice_session)


def test_it_marks_a_run_failed_when_the_session_is_being_imported(alice_session):
    run = CompactionRun.objects.create(session=alice_session)
    AgentSession.objects.filter(pk=alice_session.pk).update(status=AgentSession.Status.IMPORTING)
    assert services.compaction_work(run_id=run.pk) == "failed"
    run.refresh_from_db()
    assert run.status == CompactionRun.Status.FAILED
    assert "being imported" in run.error


def test_it_fails_the_runs_whose_worker_died_and_leaves_the_live_ones(alice_session):
    _fill(alice_session)
    before = alice_session.turns.count()
    dead = CompactionRun.objects.create(session=alice_session, status="running", started=timezone.now())
    alive = CompactionRun.objects.create(session=alice_session, status="running", started=timezone.now())
    with jobs.hold_run(alive.pk):
        assert services.runs_reap() == [dead.pk]
    dead.refresh_from_db()
    alive.refresh_from_db()
    assert dead.status == CompactionRun.Status.FAILED and "stopped before it finished" in dead.error
    assert alive.status == CompactionRun.Status.RUNNING
    # Nothing half done: no turn, no summary, every message live.
    assert alice_session.turns.count() == before
    assert not SessionMessage.objects.filter(session=alice_session, status="archived").exists()


def test_it_takes_over_a_run_whose_worker_died(alice_session):
    _fill(alice_session)
    run = CompactionRun.objects.create(session=alice_session, status="running", started=timezone.now())
    assert services.compaction_work(run_id=run.pk) == "done"
    run.refresh_from_db()
    assert run.outcome == "compacted"
    assert_nothing_lost(alice_session)


def test_it_leaves_a_run_another_worker_holds_and_never_runs_a_finished_one(alice_session):
    _fill(alice_session)
    run = CompactionRun.objects.create(session=alice_session)
    with jobs.hold_run(run.pk):
        assert services.compaction_work(run_id=run.pk) == "busy"
    run.refresh_from_db()
    assert run.status == CompactionRun.Status.QUEUED
    assert services.compaction_work(run_id=run.pk) == "done"
    # A second delivery of the same job (Redis redelivers unacknowledged ones).
    assert services.compaction_work(run_id=run.pk) == "skipped"
    alice_session.refresh_from_db()
    assert alice_session.summary_version == 1


def test_it_restarts_the_runs_a_previous_process_only_queued(alice_session):
    _fill(alice_session)
    queued = CompactionRun.objects.create(session=alice_session)
    running = CompactionRun.objects.create(session=alice_session, status="running", started=timezone.now())
    failed, requeued = services.runs_recover()
    assert failed == [running.pk] and requeued == [queued.pk]
    assert jobs.drain(30)
    queued.refresh_from_db()
    assert queued.status == CompactionRun.Status.DONE


def test_it_refuses_a_compaction_of_a_session_being_imported(alice_session):
    alice_session.status = AgentSession.Status.IMPORTING
    with pytest.raises(services.SessionUnavailable):
        services.compaction_enqueue(session=alice_session)
    assert not CompactionRun.objects.exists()


def test_it_fails_a_run_nobody_took_in_time_and_never_starts_it_later(alice_session, settings):
    _fill(alice_session)
    settings.CONTEXTLAB_QUEUED_MINUTES = 30
    run = CompactionRun.objects.create(session=alice_session)
    assert services.runs_reap(now=timezone.now() + timedelta(minutes=29)) == []
    assert services.runs_reap(now=timezone.now() + timedelta(minutes=31)) == [run.pk]
    run.refresh_from_db()
    assert run.status == CompactionRun.Status.FAILED and "no worker took this job within 30 minutes" in run.error
    # Its job, turning up late, does nothing.
    assert services.compaction_work(run_id=run.pk) == "skipped"
    alice_session.refresh_from_db()
    assert alice_session.summary_version == 0


class _BrokerDown:
    name = "contextlab.sessions.tasks.compact_session"

    def delay(self, *args):
        raise ConnectionRefusedError("the broker refused the connection")


def test_it_fails_a_run_whose_job_could_not_be_queued(alice_session, settings):
    settings.CONTEXTLAB_JOBS_MODE = "scaled"
    run = CompactionRun.objects.create(session=alice_session)
    jobs.enqueue(_BrokerDown(), run.pk, on_error=lambda exc: runs.run_not_queued(run, exc))  # type: ignore[arg-type]
    run.refresh_from_db()
    assert run.status == CompactionRun.Status.FAILED
    assert "could not be queued (ConnectionRefusedError: the broker refused the connection)" in run.error
