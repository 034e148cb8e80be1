"""Manual compaction as a review: pins, a dry run with the profile's compactor, then accept or discard.

* Pins live in the engine's state (``ContextManager.pins``), so every
  compaction, automatic or manual, honours them; changing them is a step like
  any other (under the session's lock, and it moves ``state_version``).
* A dry run is a background run (``CompactionRun.kind == "dry_run"``): planned
  under the lock (nothing changes), the summary call with nothing held, then
  the draft is computed on a throwaway copy under the lock and stored on the
  run with its lost-identifier flags. No archive line, fate, turn or file.
* Accept commits the draft's stored answer: no second compactor call. It is
  checked first on a copy: when the session moved on since the draft so that
  committing would store another summary than the one reviewed (another
  compaction landed, the pins changed), the draft is marked stale instead.
  Messages appended since stay live after the compacted prefix (a rebase).
* Cancel stops a queued run, or throws away a running one's result when its
  summary call returns; its commit (if it got that far) is rolled back.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from contextlab.engine.core.errors import ContextLabError
from contextlab.engine.memory.pins import Pins
from contextlab.engine.stages.summary.plan import StalePlan, fingerprint, planned_from_dict, planned_to_dict
from contextlab.sessions import loss_records
from contextlab.sessions.models import AgentSession, CompactionRun
from contextlab.sessions.services.inputs import (
    MAX_INSTRUCTION_LENGTH,
    RunInProgress,
    SessionUnavailable,
    check_text,
)
from contextlab.sessions.services.live_state import current_live_view, run_announce
from contextlab.sessions.services.persistence import fate_sizes, locked_session, persist_step
from contextlab.sessions.services.runs import COMPACT_SESSION, run_claim, run_not_queued
from contextlab.sessions.services.summary_calls import CompactionCancelled
from contextlab.support import jobs

__all__ = ["CompactionCancelled", "DraftNotOpen", "DraftStale"]

log = logging.getLogger(__name__)

ACTIVE = (CompactionRun.Status.QUEUED, CompactionRun.Status.RUNNING)


class DraftStale(ContextLabError):
    """The session moved on since the draft in a way the draft cannot be committed onto."""


class DraftNotOpen(ContextLabError):
    """The run holds no draft waiting for review (never made, or already accepted or discarded)."""


# -- pins -------------------------------------------------------------------------------------------------


def pins_of(session: AgentSession) -> Pins:
    """The session's pins as last committed (no lock): from its live view, which a page
    reads anyway, else from the state header (a large document to decode)."""
    view = current_live_view(session)
    if view is not None and "pins" in view:
        return Pins.from_dict(view["pins"])
    return Pins.from_dict((session.engine_state or {}).get("pins"))


def _change_pins(session: AgentSession, change: str, value: str) -> Pins:
    with locked_session(session) as (locked, manager):
        before = fate_sizes(manager)
        if change == "pin_message":
            manager.pin_message(value)
        elif change == "unpin_message":
            manager.unpin_message(value)
        elif change == "pin_fact":
            manager.pin_fact(value)
        else:
            manager.unpin_fact(value)
        persist_step(locked, manager, before=before)
        session.engine_state = locked.engine_state
        session.state_version = locked.state_version
        session.live_view = locked.live_view
        return Pins.from_dict(manager.pins.to_dict())


def pin_message(*, session: AgentSession, message_id: str) -> Pins:
    return _change_pins(session, "pin_message", check_text(message_id, "message_id", max_length=256))


def unpin_message(*, session: AgentSession, message_id: str) -> Pins:
    return _change_pins(session, "unpin_message", check_text(message_id, "message_id", max_length=256))


def pin_fact(*, session: AgentSession, fact: str) -> Pins:
    return _change_pins(session, "pin_fact", check_text(fact, "fact", max_length=2_000))


def unpin_fact(*, session: AgentSession, fact: str) -> Pins:
    return _change_pins(session, "unpin_fact", check_text(fact, "fact", max_length=2_000))


# -- dry run ----------------------------------------------------------------------------------------------


def dry_run_start(*, session: AgentSession, instruction: str | None = None,
                  requested_by: User | None = None) -> CompactionRun:
    """Queue a dry run; refused while another compaction of the session is queued or running."""
    if instruction is not None:
        instruction = check_text(instruction, "instruction", max_length=MAX_INSTRUCTION_LENGTH)
    if session.status == AgentSession.Status.IMPORTING:
        raise SessionUnavailable("the session is still being imported; try again when it is done", field="session")
    active = (CompactionRun.objects.filter(session=session, status__in=ACTIVE).exclude(trigger="import")
              .order_by("-created").first())
    if active is not None:
        raise RunInProgress(f"compaction run {active.pk} is {active.status}; wait for it to finish or cancel it",
                            field="session")
    with transaction.atomic():
        run = CompactionRun.objects.create(session=session, kind=CompactionRun.Kind.DRY_RUN,
                                           instruction=instruction or "", requested_by=requested_by)
        transaction.on_commit(lambda: run_announce(run))
        jobs.enqueue(COMPACT_SESSION, run.pk, on_error=lambda exc: run_not_queued(run, exc))
    return run


def cancelled(run: CompactionRun) -> bool:
    """Whether a person cancelled ``run``, read from the database (another process may have)."""
    return CompactionRun.objects.filter(pk=run.pk, status=CompactionRun.Status.CANCELLED).exists()


def _steps(*done: str, running: str | None = None) -> list[dict[str, Any]]:
    steps = [{"step": name, "status": "ok", "outcome": "", "duration_ms": None} for name in done]
    if running:
        steps.append({"step": running, "status": "running", "outcome": "", "duration_ms": None})
    return steps


def dry_run_execute(run: CompactionRun) -> None:
    """Plan, summarise with nothing held, draft on a copy; store the draft on the run (status "draft")."""
    session = run.session
    instruction = run.instruction or None
    with locked_session(session) as (_, manager):
        plan = manager.plan_compaction(manual=True, instruction=instruction)
        compactor = manager.compactor
    if plan is None:
        _finish(run, CompactionRun.Status.DONE, outcome="nothing_to_compact",
                error="there is no live message to compact")
        return
    run_announce(run, steps=_steps("plan", running=f"summary ({compactor.name})"))
    # The lock and the transaction are gone: an LLM compactor may take its whole timeout.
    planned = manager.summarize_plan(plan, compactor)
    if cancelled(run):
        return
    with locked_session(session) as (locked, manager):
        try:
            draft = manager.draft_compaction(planned)
        except StalePlan as exc:
            _finish(run, CompactionRun.Status.FAILED,
                    error=f"the session changed while the summary was written ({exc.message}); run it again")
            return
        pins = manager.pins.to_dict()
        state_version = locked.state_version
    loss = loss_records.check_text(session, draft.compact_ids, draft.summary, draft=True) if draft.summary else None
    with transaction.atomic():
        # Under the run's row lock, so a cancel that lands now wins or loses cleanly.
        fresh = CompactionRun.objects.select_for_update().get(pk=run.pk)
        if fresh.status == CompactionRun.Status.CANCELLED:
            return
        run.draft = {
            "planned": planned_to_dict(planned),
            # The dry run's trace stays out: the draft is read on every push of the panel.
            "draft": {k: v for k, v in draft.to_dict().items() if k != "trace"},
            "pins": pins,
            "pins_fingerprint": fingerprint(pins),
            "lost": [{"kind": lost.kind, "value": lost.value, "message_id": lost.message_id}
                     for lost in loss.lost] if loss else [],
            "lost_count": loss.count if loss else 0,
            "failure": planned.failure.message if planned.failure is not None else None,
        }
        run.state_version = state_version
        run.outcome = draft.outcome
        run.status = CompactionRun.Status.DRAFT
        run.finished = timezone.now()
        run.error = ""
        if planned.failure is not None:
            run.error = (f"the summary model failed ({planned.failure.message}); the draft is what accepting "
                         "would commit: the offline extractive summary")
        run.save(update_fields=["draft", "state_version", "outcome", "status", "finished", "error"])


def _finish(run: CompactionRun, status: str, *, outcome: str = "", error: str = "") -> None:
    with transaction.atomic():
        fresh = CompactionRun.objects.select_for_update().get(pk=run.pk)
        if fresh.status == CompactionRun.Status.CANCELLED:
            return
        run.status, run.outcome, run.error, run.finished = status, outcome, error, timezone.now()
        run.save(update_fields=["status", "outcome", "error", "finished"])


def dry_run_work(*, run_id: int) -> str:
    """The background side of ``dry_run_start`` (called by ``compaction_work`` for a dry run)."""
    with jobs.hold_run(run_id) as held:
        if not held:
            return "busy"
        run, _ = run_claim(run_id)
        if run is None:
            return "skipped"
        run_announce(run)
        try:
            dry_run_execute(run)
        except ContextLabError as exc:
            run.mark_failed(exc.message)
        except Exception as exc:
            log.exception("dry run %s failed", run_id)
            run.mark_failed(f"{type(exc).__name__}: {exc}")
        run.refresh_from_db()
        run_announce(run)
        return str(run.status)


# -- review -----------------------------------------------------------------------------------------------


def _open_draft(run: CompactionRun) -> None:
    if run.kind != CompactionRun.Kind.DRY_RUN or run.status != CompactionRun.Status.DRAFT or not run.draft:
        raise DraftNotOpen(f"run {run.pk} has no draft waiting for review (it is {run.status})", field="run")


def draft_accept(*, run: CompactionRun) -> CompactionRun:
    """Commit exactly the reviewed draft (no compactor call), or mark it stale and raise ``DraftStale``."""
    _open_draft(run)
    assert run.draft is not None
    planned = planned_from_dict(run.draft["planned"])
    expected = run.draft["draft"]["summary"]
    reason: str | None = None
    with locked_session(run.session) as (locked, manager):
        if fingerprint(manager.pins.to_dict()) != run.draft["pins_fingerprint"]:
            reason = "the pins changed since the draft"
        else:
            try:
                # On a copy first: commit only when it stores the very text reviewed.
                check = manager.draft_compaction(planned)
            except StalePlan as exc:
                reason = exc.message
            else:
                if check.summary != expected:
                    reason = "committing now would store another summary than the one reviewed"
        if reason is None:
            before = fate_sizes(manager)
            result = manager.compact(planned.plan.instruction, planned=planned)
            turn = persist_step(locked, manager, before=before, result=result)
            assert turn is not None
            run.status = CompactionRun.Status.ACCEPTED
            run.turn_number = turn.number
            run.outcome = turn.outcome
            run.finished = timezone.now()
            run.save(update_fields=["status", "turn_number", "outcome", "finished"])
    if reason is not None:
        run.status = CompactionRun.Status.STALE
        run.error = f"This draft is stale: {reason}. Nothing was committed; run a new dry run."
        run.save(update_fields=["status", "error"])
        run_announce(run)
        raise DraftStale(run.error, field="run")
    run_announce(run)
    return run


def draft_discard(*, run: CompactionRun) -> CompactionRun:
    """Drop the draft: nothing of it was ever committed, so only the run's row changes."""
    _open_draft(run)
    run.status = CompactionRun.Status.DISCARDED
    run.save(update_fields=["status"])
    run_announce(run)
    return run


def run_cancel(*, run: CompactionRun) -> CompactionRun:
    """Cancel a queued or running compaction or dry run; nothing of it is committed."""
    with transaction.atomic():
        fresh = CompactionRun.objects.select_for_update().get(pk=run.pk)
        if fresh.status not in ACTIVE or fresh.trigger == "import":
            raise DraftNotOpen(f"run {run.pk} is {fresh.status}: only a queued or running compaction can be "
                               "cancelled", field="run")
        fresh.status = CompactionRun.Status.CANCELLED
        fresh.error = "cancelled: nothing was committed"
        fresh.finished = timezone.now()
        fresh.save(update_fields=["status", "error", "finished"])
    run.refresh_from_db()
    run_announce(run)
    return run


def latest_draft(session: AgentSession) -> CompactionRun | None:
    """The newest dry run of the session that has a draft to show (open, stale, or the last reviewed)."""
    return (CompactionRun.objects.filter(session=session, kind=CompactionRun.Kind.DRY_RUN)
            .exclude(status__in=ACTIVE).order_by("-created").first())
