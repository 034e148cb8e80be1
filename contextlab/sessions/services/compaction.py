"""Manual compaction of a session: run now, or queued as a background run a worker executes."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from contextlab.engine.core.errors import ContextLabError
from contextlab.sessions.models import (
    AgentSession,
    CompactionRun,
    Turn,
)
from contextlab.sessions.services.compaction_review import cancelled, dry_run_work
from contextlab.sessions.services.inputs import (
    MAX_INSTRUCTION_LENGTH,
    RunInProgress,
    SessionUnavailable,
    check_text,
)
from contextlab.sessions.services.live_state import run_announce
from contextlab.sessions.services.persistence import engines, locked_session, trace_step
from contextlab.sessions.services.runs import COMPACT_SESSION, run_claim, run_not_queued
from contextlab.sessions.services.summary_calls import CompactionCancelled, hook_turn
from contextlab.support import jobs, providers

log = logging.getLogger(__name__)


def compaction_preview(*, session: AgentSession) -> dict[str, Any]:
    """Which messages a manual compaction would summarise and which it would keep."""
    # The engine this process keeps for the session's version, when it has one:
    # a preview only reads it (the pages ask on every live update, and the lock
    # would queue them behind the writers).
    with engines.borrowed(session) as kept:
        if kept is not None:
            return kept.preview_compaction().to_dict()
    # Otherwise under the lock like a turn, because loading the engine may cut
    # back the archive (see ``load_manager``).
    with locked_session(session) as (_, manager):
        return manager.preview_compaction().to_dict()


def compaction_run(*, session: AgentSession, instruction: str | None = None,
                   requested_by: User | None = None) -> CompactionRun:
    """Record a manual compaction and run it now (a background job calls ``compaction_execute``)."""
    if instruction is not None:
        instruction = check_text(instruction, "instruction", max_length=MAX_INSTRUCTION_LENGTH)
    run = CompactionRun.objects.create(session=session, instruction=instruction or "", requested_by=requested_by)
    # Held like a worker holds it, so the sweep for dead workers leaves it alone.
    with jobs.hold_run(run.pk):
        compaction_execute(run=run)
    return run


def compaction_execute(*, run: CompactionRun) -> CompactionRun:
    run.mark_running()
    try:
        turn = hook_turn(run.session, manual=True, instruction=run.instruction or None)
    except ContextLabError as exc:
        run.mark_failed(exc.message)
        raise
    except Exception as exc:
        run.mark_failed(f"{type(exc).__name__}: {exc}")
        raise
    assert turn is not None
    run.mark_done(turn_number=turn.number, outcome=turn.outcome)
    if turn.outcome == "nothing_to_compact":
        run.error = _nothing_to_compact_reason(turn.trace)
        run.save(update_fields=["error"])
    return run


def _summary_failure(trace: Mapping[str, Any]) -> str:
    reasons: list[str] = []
    for name in ("summary", "validity"):
        step = trace_step(trace, name)
        if step.get("status") == "failed":
            reasons.extend(str(r) for r in step.get("reasons") or [])
    # The reasons quote the provider's answers: one line, bounded.
    return providers.bounded_upstream_text("; ".join(reasons)) or "the summary failed"


def _nothing_to_compact_reason(trace: Mapping[str, Any]) -> str:
    details = trace_step(trace, "context_check").get("details") or {}
    return str(details.get("nothing_to_compact") or "there is no live message to compact")


def _run_finish(run: CompactionRun, turn: Turn) -> None:
    """Record how the compaction turn ended; a failed summary is a failed run."""
    # In the turn's transaction, under the run's row lock: a cancel that came
    # first rolls the turn back; one that comes later waits and finds it done.
    if CompactionRun.objects.select_for_update().get(pk=run.pk).status == CompactionRun.Status.CANCELLED:
        raise CompactionCancelled()
    run.turn_number = turn.number
    run.outcome = turn.outcome
    run.finished = timezone.now()
    if turn.outcome == "compaction_failed":
        # The engine kept the messages and the previous summary; say why.
        run.status = CompactionRun.Status.FAILED
        run.error = _summary_failure(turn.trace) + " The previous summary and every message were kept."
    else:
        run.status = CompactionRun.Status.DONE
        run.error = ""
        if turn.outcome == "nothing_to_compact":
            # Not a failure, but the person who pressed "Compact now" is owed the why.
            run.error = _nothing_to_compact_reason(turn.trace)
        if turn.outcome == "fallback_summary":
            run.error = ("the summary model failed (" + _summary_failure(turn.trace)
                         + "); the offline extractive summary was used instead")
    run.save(update_fields=["status", "turn_number", "outcome", "finished", "error"])


def compaction_enqueue(*, session: AgentSession, instruction: str | None = None,
                       requested_by: User | None = None) -> CompactionRun:
    """Record a manual compaction and run it in the background; the row says how it goes."""
    if instruction is not None:
        instruction = check_text(instruction, "instruction", max_length=MAX_INSTRUCTION_LENGTH)
    if session.status == AgentSession.Status.IMPORTING:
        raise SessionUnavailable("the session is still being imported; try again when it is done", field="session")
    with transaction.atomic():
        run = CompactionRun.objects.create(session=session, instruction=instruction or "",
                                           requested_by=requested_by)
        # Announced before the job starts, so "queued" never follows "running".
        transaction.on_commit(lambda: run_announce(run))
        jobs.enqueue(COMPACT_SESSION, run.pk, on_error=lambda exc: run_not_queued(run, exc))
    return run


def _step_outline(turn_so_far: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The steps of a turn in progress, without their (possibly long) details."""
    return [{"step": s.get("step"), "status": s.get("status"), "outcome": s.get("outcome"),
             "duration_ms": s.get("duration_ms")} for s in turn_so_far.get("steps") or []]


def compaction_active(*, session: AgentSession) -> CompactionRun | None:
    """The session's manual compaction that is queued or running, if any."""
    return (CompactionRun.objects.filter(session=session, status__in=(CompactionRun.Status.QUEUED,
                                                                      CompactionRun.Status.RUNNING))
            .exclude(trigger="import").order_by("-created").first())


def compaction_start(*, session: AgentSession, instruction: str | None = None,
                     requested_by: User | None = None) -> CompactionRun:
    """``compaction_enqueue`` for a person at the dashboard: refused (``RunInProgress``)
    while another compaction of the session is queued or running, so a second
    click never queues a second summary of the same messages."""
    active = compaction_active(session=session)
    if active is not None:
        raise RunInProgress(f"compaction run {active.pk} is {active.status}; wait for it to finish or cancel it",
                            field="session")
    return compaction_enqueue(session=session, instruction=instruction, requested_by=requested_by)


def compaction_work(*, run_id: int) -> str:
    """The background side of ``compaction_enqueue``: "done", "failed", "skipped" or "busy"."""
    if CompactionRun.objects.filter(pk=run_id, kind=CompactionRun.Kind.DRY_RUN).exists():
        return dry_run_work(run_id=run_id)
    with jobs.hold_run(run_id) as held:
        if not held:
            return "busy"  # another worker has it (a second delivery of the same job)
        run, retried = run_claim(run_id)
        if run is None:
            return "skipped"
        if retried:
            log.warning("compaction run %s: its previous worker died; running it again", run_id)
        run_announce(run, retried=retried)
        try:
            # Each finished step goes to the page at once, so a slow summary
            # call shows where it stands (gate, split done; summary running).
            # _run_finish runs in the compaction's own transaction: "done" and
            # the compaction are committed together, or neither is.
            hook_turn(run.session, manual=True, instruction=run.instruction or None,
                      observer=lambda trace_step, turn_so_far: run_announce(run, steps=_step_outline(turn_so_far)),
                      on_turn=lambda _, turn: _run_finish(run, turn), cancelled=lambda: cancelled(run))
        except CompactionCancelled:
            run.refresh_from_db()  # cancelled by a person: the row says so already
        except ContextLabError as exc:
            run.mark_failed(exc.message)
        except Exception as exc:
            log.exception("compaction run %s failed", run_id)
            run.mark_failed(f"{type(exc).__name__}: {exc}")
        run_announce(run)
        return str(run.status)


