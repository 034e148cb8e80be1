"""Turns that may call the summary model, run so that no lock or transaction is open during the call.

1. Under the session's row lock: ingest what the client sent, then plan the
   turn (``ContextManager.plan_compaction``). No summary needed: the turn runs
   and commits right there, like any other step. Otherwise the ingested
   messages commit with a lease on the session row (``summary_call_until``),
   and the lock goes.
2. Nothing held: the summary call (seconds, or the model's whole timeout).
3. Under the lock again: the turn runs on whatever state is current, taking
   the summary from the plan; messages appended meanwhile stay live after the
   compacted prefix. A plan another commit made impossible (a second
   compaction won the race) is planned again from the newer state.

While the lease runs, a turn of the same session does not start a second
summary call: it keeps every message (``compaction_deferred``), and a bare
prepare with nothing new answers with the last committed payload.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

from django.utils import timezone

from contextlab.engine.core.errors import ContextLabError
from contextlab.engine.core.messages import Message
from contextlab.engine.core.trace import Observer
from contextlab.engine.hook import ContextManager, TurnResult
from contextlab.engine.stages.summary.plan import CompactionPlan, PlannedSummary, StalePlan
from contextlab.sessions.models import AgentSession, Turn
from contextlab.sessions.services.persistence import fate_sizes, locked_session, persist_step

log = logging.getLogger(__name__)

# Plans made stale by another commit before the turn gives up on summarising now.
MAX_PLANS = 3
# Beyond the compactor's own bound (timeout × attempts), for the rest of the turn.
LEASE_MARGIN = dt.timedelta(seconds=30)

Ingest = Callable[[AgentSession, ContextManager], list[Message]]
OnTurn = Callable[[AgentSession, Turn], None]


class CompactionCancelled(Exception):  # noqa: N818 - a signal to unwind, not an error
    """A person cancelled the run: its summary is thrown away, whatever it was about to commit rolls back."""


class SessionKeptChanging(ContextLabError):
    """A manual compaction's plan went stale on every attempt (other compactions kept landing)."""


def lease_active(session: AgentSession) -> bool:
    return session.summary_call_until is not None and session.summary_call_until > timezone.now()


def lease_until(manager: ContextManager) -> dt.datetime:
    profile = manager.profile
    bound = profile.compaction_timeout * (profile.compaction_retries + 1)
    return timezone.now() + dt.timedelta(seconds=bound) + LEASE_MARGIN


def calls_the_network(manager: ContextManager) -> bool:
    # The offline extractive summary answers in-process in milliseconds: it may
    # run under the lock like the rest of the turn.
    return manager.compactor.name != "extractive"


def _run(manager: ContextManager, *, manual: bool, instruction: str | None,
         planned: PlannedSummary | None = None) -> TurnResult:
    if manual:
        return manager.compact(instruction, planned=planned)
    return manager.prepare(planned=planned)


def _clear_lease(session: AgentSession) -> None:
    AgentSession.objects.filter(pk=session.pk).update(summary_call_until=None)


def hook_turn(session: AgentSession, *, manual: bool = False, instruction: str | None = None,
              ingest: Ingest | None = None, reuse_last: bool = False, observer: Observer | None = None,
              on_turn: OnTurn | None = None, cancelled: Callable[[], bool] | None = None) -> Turn:
    """Run one turn (the hook, or a manual compaction), holding the session's lock
    only for the short steps around a summary call; returns the committed turn.

    ``ingest`` appends the client's messages first (once, in the first step).
    ``reuse_last``: while another request's summary call runs and nothing new
    was ingested, answer with the last committed turn instead of a new one.
    ``on_turn`` runs inside the transaction that commits the turn (raising there
    rolls the turn back). ``cancelled`` is asked when the summary call returns:
    True throws the summary away and raises ``CompactionCancelled``.
    """
    pending_ingest = ingest
    holds_lease = False
    for attempt in range(1, MAX_PLANS + 1):
        with locked_session(session) as (locked, manager):
            manager.observer = observer
            before = fate_sizes(manager)
            parsed = pending_ingest(locked, manager) if pending_ingest is not None else []
            pending_ingest = None
            originals = {m.id: m for m in parsed}
            plan: CompactionPlan | None = None
            if not manual and not holds_lease and lease_active(locked):
                last = locked.turns.order_by("-number").first() if reuse_last and not parsed else None
                if last is not None:
                    return last
                result = manager.prepare(defer_summary=True)
                return _commit(locked, manager, before, originals, result, on_turn)
            if calls_the_network(manager):
                plan = manager.plan_compaction(manual=manual, instruction=instruction)
            if plan is None:
                result = _run(manager, manual=manual, instruction=instruction)
                if holds_lease:
                    locked.summary_call_until = None
                return _commit(locked, manager, before, originals, result, on_turn)
            if originals:
                persist_step(locked, manager, before=before, originals=originals)
            compactor = manager.compactor  # taken under the lock: the engine may serve other turns meanwhile
            locked.summary_call_until = lease_until(manager)
            locked.save(update_fields=["summary_call_until"])
            holds_lease = True
        # The lock and the transaction are gone: the call may take the model's whole timeout.
        try:
            planned = manager.summarize_plan(plan, compactor)
        except BaseException:
            _clear_lease(session)  # a bug, not an answer: later turns must not wait for the lease
            raise
        if cancelled is not None and cancelled():
            _clear_lease(session)
            raise CompactionCancelled()
        try:
            with locked_session(session) as (locked, manager):
                manager.observer = observer
                before = fate_sizes(manager)
                result = _run(manager, manual=manual, instruction=instruction, planned=planned)
                locked.summary_call_until = None
                return _commit(locked, manager, before, {}, result, on_turn)
        except StalePlan as exc:
            log.info("session %s: compaction plan %s of %s went stale (%s); planning again",
                     session.pk, attempt, MAX_PLANS, exc.message)
        except BaseException:
            _clear_lease(session)
            raise
    # Compactions kept landing in between: clear the lease and let this turn keep
    # everything (a hook turn), or say so (a manual compaction).
    with locked_session(session) as (locked, manager):
        locked.summary_call_until = None
        if manual:
            locked.save(update_fields=["summary_call_until"])
            raise SessionKeptChanging("other compactions of this session kept landing while this one's summary "
                                      "was written; nothing changed, try again", field="session")
        manager.observer = observer
        before = fate_sizes(manager)
        result = manager.prepare(defer_summary=True)
        return _commit(locked, manager, before, {}, result, on_turn)


def _commit(locked: AgentSession, manager: ContextManager, before: dict[str, int], originals: dict[str, Message],
            result: TurnResult, on_turn: OnTurn | None) -> Turn:
    turn = persist_step(locked, manager, before=before, originals=originals, result=result)
    assert turn is not None
    if on_turn is not None:
        on_turn(locked, turn)
    return turn
