"""Sessions, the messages clients append to them, and the pre-reasoning hook that prepares each LLM call."""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from contextlab.engine.compactors.base import Compactor
from contextlab.engine.convert import from_openai
from contextlab.engine.core.errors import MalformedInput
from contextlab.engine.core.messages import Message
from contextlab.engine.hook import AgentCompaction, ContextManager, TurnResult
from contextlab.engine.stages.summary.plan import CompactionPlan, PlannedSummary, StalePlan
from contextlab.sessions.models import (
    AgentProfile,
    AgentSession,
    SessionMessage,
    Turn,
)
from contextlab.sessions.services.inputs import (
    MAX_TITLE_LENGTH,
    check_message_ids,
    check_raw_messages,
    check_text,
    convert_messages,
)
from contextlab.sessions.services.persistence import (
    engines,
    fate_sizes,
    load_manager,
    locked_session,
    persist_step,
    written_rows,
)
from contextlab.sessions.services.profiles import profile_default
from contextlab.sessions.services.summary_calls import calls_the_network, hook_turn, lease_active, lease_until

log = logging.getLogger(__name__)


def session_create(*, owner: User, system_prompt: str, profile: AgentProfile | None = None,
                   title: str = "") -> AgentSession:
    system_prompt = check_text(system_prompt, "system_prompt")
    title = check_text(title, "title", max_length=MAX_TITLE_LENGTH)
    profile = profile or profile_default(owner=owner)
    engine_profile = profile.to_engine()
    session = AgentSession(owner=owner, profile=profile, title=title, system_prompt=system_prompt,
                           tokens_threshold=engine_profile.threshold,
                           tokens_window=engine_profile.max_input_length)
    manager = ContextManager(engine_profile, session.workspace, system_prompt=system_prompt)
    session.engine_state = manager.export_state(per_message=False)
    session.save()
    return session


def session_delete(*, session: AgentSession) -> None:
    workspace = session.workspace
    session.delete()
    shutil.rmtree(workspace, ignore_errors=True)


def _counters_to(session: AgentSession, locked: AgentSession) -> None:
    """The caller's copy of the session gets the row as the step committed it (no second read;
    the caller may have read only the id): every column but the state header, and the profile."""
    if session is not locked:
        for column in AgentSession._meta.concrete_fields:
            if column.attname != "engine_state":
                setattr(session, column.attname, getattr(locked, column.attname))
        session.profile = locked.profile


def messages_append(*, session: AgentSession, messages: Any) -> list[SessionMessage]:
    """Ingest OpenAI, Anthropic or AgentScope messages (detected); stage-1 truncation applies.

    The batch is all or nothing: a bad message leaves the session untouched.
    """
    raw = check_raw_messages(messages)
    with locked_session(session) as (locked, manager):
        known_calls = manager.call_names()
        parsed = convert_messages(raw, known_calls)
        check_message_ids(parsed)
        before = fate_sizes(manager)
        manager.append(parsed)
        persist_step(locked, manager, before=before, originals={m.id: m for m in parsed})
        rows = written_rows(manager, [m.id for m in parsed])
    _counters_to(session, locked)
    return rows


def messages_append_openai(*, session: AgentSession, messages: list[dict[str, Any]]) -> list[SessionMessage]:
    """``messages_append`` for messages known to be OpenAI chat messages (no format detection).

    Detection cannot tell an OpenAI message whose content is a list of text
    parts from an Anthropic one; a caller that speaks OpenAI says so.
    """
    raw = check_raw_messages(messages)
    with locked_session(session) as (locked, manager):
        known_calls = manager.call_names()
        parsed = from_openai(raw, known_calls=known_calls)
        check_message_ids(parsed)
        before = fate_sizes(manager)
        manager.append(parsed)
        persist_step(locked, manager, before=before, originals={m.id: m for m in parsed})
        rows = written_rows(manager, [m.id for m in parsed])
    _counters_to(session, locked)
    return rows


def session_prepare(*, session: AgentSession,
                    request_schemas: tuple[Any, Any] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the pre-reasoning hook: the exact messages for the next LLM call (OpenAI format),
    and the turn's trace (``trace["turn"]`` is the turn number). ``request_schemas``: as
    in ``session_advance``.

    While another request writes this session's summary, the last committed
    payload comes back at once (see ``summary_calls``).
    """

    def schemas(locked: AgentSession, manager: ContextManager) -> list[Message]:
        if request_schemas is not None:
            manager.set_request_schemas(*request_schemas)
        return []

    turn = hook_turn(session, ingest=schemas, reuse_last=True)
    return turn.payload, turn.trace


def session_advance(*, session: AgentSession, messages: list[dict[str, Any]],
                    system_prompt: str | None = None,
                    request_schemas: tuple[Any, Any] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Ingest new OpenAI chat messages (possibly none) and run the hook, as one step.

    What ``messages_append`` then ``session_prepare`` do, under one lock and one
    load of the engine: nothing can slip in between, and the turn costs one
    state load instead of two. ``system_prompt``, when given and different,
    replaces the session's (clients that put the date or live notes in it).
    ``request_schemas``, when given, is the call's ``(tools, response_format)``:
    a budget layer of this and the following turns, until the next call says otherwise.
    Returns the payload and the trace, like ``session_prepare``.
    """
    if messages:
        check_raw_messages(messages)
    if system_prompt is not None:
        system_prompt = check_text(system_prompt, "system_prompt")

    def ingest(locked: AgentSession, manager: ContextManager) -> list[Message]:
        if system_prompt is not None and system_prompt != manager.system_prompt:
            manager.system_prompt = system_prompt
            locked.system_prompt = system_prompt
        if request_schemas is not None:
            manager.set_request_schemas(*request_schemas)
        if not messages:
            return []
        known_calls = manager.call_names()
        parsed = from_openai(messages, known_calls=known_calls)
        check_message_ids(parsed)
        manager.append(parsed)
        return parsed

    turn = hook_turn(session, ingest=ingest)
    return turn.payload, turn.trace


@dataclass
class PendingTurn:
    """A turn the hook computed under the session's lock but did not write yet.

    The gateway sends its payload upstream first and writes it (with the
    provider's reply) only once the provider answered, so a call that fails
    upstream, and each retry of it, leaves the session as it was.
    """

    session: AgentSession
    manager: ContextManager
    # None for a repeat of the last turn (``session_repeat_pending``): no new turn.
    result: TurnResult | None
    messages: list[dict[str, Any]]
    system_prompt: str | None
    request_schemas: tuple[Any, Any] | None = None
    before: dict[str, int] = field(default_factory=dict)
    originals: dict[str, Message] = field(default_factory=dict)
    # The session as the hook found it; a commit checks nobody wrote it since.
    version: tuple[Any, ...] = ()
    # Written at once: the hook compacted, and the archive lines it wrote
    # belong to a state that must be saved now (see ``session_advance_pending``).
    committed: bool = False
    # A repeat: the turn whose payload goes upstream again, and the reply it replaces.
    repeated: Turn | None = None
    retracted: list[str] = field(default_factory=list)
    # Staged (``stage_summary``): the turn needs a summary first. Nothing is
    # computed yet (``result`` is None); the caller asks ``compactor`` the plan's
    # question holding nothing, then ``pending_turn_apply_plan`` runs the turn.
    plan: CompactionPlan | None = None
    compactor: Compactor | None = None
    # ``pending_turn_commit`` wrote the provider's usage with the turn's row.
    usage_written: bool = False

    @property
    def payload(self) -> list[dict[str, Any]]:
        if self.result is None:
            assert self.repeated is not None
            return list(self.repeated.payload)
        return self.result.openai_messages()

    @property
    def trace(self) -> dict[str, Any]:
        if self.result is None:
            assert self.repeated is not None
            return dict(self.repeated.trace)
        return self.result.trace.to_dict()


def _version(session: AgentSession) -> tuple[Any, ...]:
    return (session.state_version,)


def session_new(*, owner: User, system_prompt: str, profile: AgentProfile, title: str = "") -> AgentSession:
    """A session not saved yet: ``session_advance_pending`` runs its first turn, a commit saves it."""
    system_prompt = check_text(system_prompt, "system_prompt")
    title = check_text(title, "title", max_length=MAX_TITLE_LENGTH)
    engine_profile = profile.to_engine()
    return AgentSession(owner=owner, profile=profile, title=title, system_prompt=system_prompt,
                        tokens_threshold=engine_profile.threshold, tokens_window=engine_profile.max_input_length)


def session_advance_pending(*, session: AgentSession, messages: list[dict[str, Any]],
                            system_prompt: str | None = None,
                            request_schemas: tuple[Any, Any] | None = None,
                            stage_summary: bool = False, defer_summary: bool = False,
                            agent_compaction: AgentCompaction | None = None) -> PendingTurn:
    """``session_advance`` without the write: the payload now, the turn once ``pending_turn_commit`` runs.

    ``session`` may be new (``session_new``). Call it inside the caller's
    transaction. Nothing is written, with one exception: a hook that compacted
    has already written the summary's archive lines, and a later load would cut
    them back as a turn that never saved, so that turn is written at once
    (``committed``).

    ``stage_summary``: a turn that would call the summary model over the
    network is only planned (``plan``), and the session gets a lease so other
    turns meanwhile keep every message instead of calling it too; the caller
    makes the call outside its transaction and finishes with
    ``pending_turn_apply_plan``. ``defer_summary``: keep every message this turn.

    ``agent_compaction``: the agent compacted its own context, so ``messages``
    (all it sent) replace the live ones in an agent-compaction turn of this
    same session (``ContextManager.adopt_agent_compaction``), written at once
    like a compaction of the hook's.
    """
    if messages:
        check_raw_messages(messages)
    if system_prompt is not None:
        system_prompt = check_text(system_prompt, "system_prompt")
    new = session._state.adding
    with contextlib.ExitStack() as stack:
        if new:
            locked = session
            manager = ContextManager(session.profile.to_engine(), session.workspace,
                                     system_prompt=session.system_prompt, transactional=True)
        else:
            locked, manager = stack.enter_context(locked_session(session, keep=False))
        version = () if new else _version(locked)
        if system_prompt is not None and system_prompt != manager.system_prompt:
            manager.system_prompt = system_prompt
            locked.system_prompt = system_prompt
        if request_schemas is not None:
            manager.set_request_schemas(*request_schemas)
        before = fate_sizes(manager)
        parsed: list[Message] = []
        if agent_compaction is not None:
            parsed = from_openai(messages, known_calls={})
            check_message_ids(parsed)
            result = manager.adopt_agent_compaction(parsed, agent_compaction)
            pending = PendingTurn(session=locked, manager=manager, result=result, messages=messages,
                                  system_prompt=system_prompt, request_schemas=request_schemas, before=before,
                                  originals={m.id: m for m in parsed}, version=version, committed=True)
            # The replaced messages went to the archive: the turn is written now.
            if new:
                locked.save()
            persist_step(locked, manager, before=before, originals=pending.originals, result=result)
            return pending
        if messages:
            parsed = from_openai(messages, known_calls=manager.call_names())
            check_message_ids(parsed)
            manager.append(parsed)
        defer_summary = defer_summary or (not new and lease_active(locked))
        plan = (manager.plan_compaction() if stage_summary and not defer_summary and calls_the_network(manager)
                else None)
        if plan is not None:
            if not new:
                # Written now, though nothing else of the turn is: other turns of the
                # session must not start a second summary call while this one runs.
                AgentSession.objects.filter(pk=locked.pk).update(summary_call_until=lease_until(manager))
            return PendingTurn(session=locked, manager=manager, result=None, messages=messages,
                               system_prompt=system_prompt, request_schemas=request_schemas, before=before,
                               originals={m.id: m for m in parsed}, version=version, plan=plan,
                               compactor=manager.compactor)
        result = manager.prepare(defer_summary=defer_summary)
        pending = PendingTurn(session=locked, manager=manager, result=result, messages=messages,
                              system_prompt=system_prompt, request_schemas=request_schemas, before=before,
                              originals={m.id: m for m in parsed},
                              version=version)
        if manager.archive.journal_path.exists():
            if new:
                locked.save()
            persist_step(locked, manager, before=before, originals=pending.originals, result=result)
            pending.committed = True
    return pending


def pending_turn_apply_plan(*, pending: PendingTurn, planned: PlannedSummary) -> bool:
    """Run a staged turn (``session_advance_pending(stage_summary=True)``) with its summary,
    in the caller's transaction, and write it at once (``committed``), lease cleared.

    False, with the lease cleared and nothing else written, when the session
    moved since the plan (another writer got in during the summary call) or the
    plan no longer applies: the caller prepares the turn again, keeping every
    message (``defer_summary``), and a later turn compacts.
    """
    session, manager = pending.session, pending.manager
    new = session._state.adding
    locked = session if new else (AgentSession.objects.select_for_update(of=("self",)).select_related("profile")
                                  .get(pk=session.pk))
    if not new and _version(locked) != pending.version:
        log.info("session %s moved during the summary call of a staged turn; the turn runs again", session.pk)
        AgentSession.objects.filter(pk=locked.pk).update(summary_call_until=None)
        return False
    try:
        result = manager.prepare(planned=planned)
    except StalePlan as exc:
        log.info("session %s: the staged turn's plan went stale (%s)", session.pk, exc.message)
        if not new:
            AgentSession.objects.filter(pk=locked.pk).update(summary_call_until=None)
        return False
    locked.summary_call_until = None
    if pending.system_prompt is not None:
        locked.system_prompt = manager.system_prompt
    if new:
        locked.save()
    persist_step(locked, manager, before=pending.before, originals=pending.originals, result=result)
    pending.session, pending.result, pending.plan, pending.committed = locked, result, None, True
    return True


def session_repeat_pending(*, session: AgentSession) -> PendingTurn | None:
    """The last turn again, for a client that sends the same request once more (a retry after
    its timeout, a "regenerate"): the reply recorded for it, which that client never took,
    is taken back, and the next reply replaces it once ``pending_turn_commit`` runs.

    None when the session's newest message is not such a reply.
    """
    with locked_session(session, keep=False) as (locked, manager):
        turn = Turn.objects.filter(session=locked, number=locked.turns_count).first()
        if turn is None:
            return None
        reply = manager.retract_newest_reply()
        if reply is None:
            return None
        return PendingTurn(session=locked, manager=manager, result=None, messages=[], system_prompt=None,
                           before=fate_sizes(manager), version=_version(locked), repeated=turn,
                           retracted=[reply.id])


def pending_turn_commit(*, pending: PendingTurn, reply: list[dict[str, Any]],
                        usage: dict[str, Any] | None = None) -> bool:
    """Write a pending turn and the provider's reply (OpenAI messages, possibly none) in the caller's transaction.

    Returns False when the session moved since the turn was computed (another
    writer got in between): then the turn is run again on the newer state, so
    nothing is lost or written twice, and the recorded payload is the new run's.

    ``usage`` (checked with ``check_usage``): the provider's, written with a new
    turn's row (``pending.usage_written`` says whether it was); a caller records
    it with ``usage_report`` otherwise.
    """
    session = pending.session
    if pending.committed:
        if reply:
            messages_append_openai(session=session, messages=reply)
        return True
    if session._state.adding:
        session.save()
        locked, manager, same = session, pending.manager, True
    else:
        locked = (AgentSession.objects.select_for_update(of=("self",)).select_related("profile")
                  .get(pk=session.pk))
        same = _version(locked) == pending.version
        manager = pending.manager if same else load_manager(locked)
    if not same and pending.repeated is not None:
        log.info("session %s moved while a repeated call waited for the provider; not recorded", session.pk)
        return False
    if not same:
        log.info("session %s moved while its turn waited for the provider; running the turn again", session.pk)
        session_advance(session=locked, messages=pending.messages, system_prompt=pending.system_prompt,
                        request_schemas=pending.request_schemas)
        if reply:
            messages_append_openai(session=locked, messages=reply)
        return False
    if pending.system_prompt is not None:
        locked.system_prompt = manager.system_prompt
    if pending.retracted:
        taken_back = SessionMessage.objects.filter(session=locked, message_id__in=pending.retracted).delete()[0]
        locked.messages_count -= taken_back
    originals = dict(pending.originals)
    if reply:
        # The reply joins in the same write as the turn: one state header, one
        # version bump per call (the turn's payload was computed without it).
        check_raw_messages(reply)
        parsed = from_openai(reply, known_calls=manager.call_names())
        check_message_ids(parsed)
        manager.append(parsed)
        originals.update((m.id, m) for m in parsed)
    persist_step(locked, manager, before=pending.before, originals=originals, result=pending.result, usage=usage)
    pending.usage_written = usage is not None and pending.result is not None
    # Written: from now on the engine is the committed state, for the next request to reuse.
    transaction.on_commit(lambda: engines.keep(locked, manager))
    return True


def usage_report(*, session: AgentSession, turn_number: int, usage: Any) -> Turn:
    """Record what the provider billed for the call made with turn ``turn_number``'s payload."""
    check_usage(usage)
    with transaction.atomic():
        # Only the usage: the payload and trace columns grow with the session.
        turn = Turn.objects.select_for_update().only("id", "session_id", "number", "usage").get(
            session=session, number=turn_number)
        turn.usage = usage
        turn.save(update_fields=["usage"])
    return turn


def check_usage(usage: Any) -> dict[str, Any]:
    """A provider's usage object, checked (``MalformedInput`` naming the bad field)."""
    if not isinstance(usage, dict) or not usage:
        raise MalformedInput("usage must be a non-empty object, e.g. {\"prompt_tokens\": 1234}", field="usage")
    for key, value in usage.items():
        if isinstance(value, bool) or not isinstance(value, int | float | dict | type(None)):
            raise MalformedInput(f"usage.{key} must be a number or an object", field=f"usage.{key}")
        if isinstance(value, int | float) and value < 0:
            raise MalformedInput(f"usage.{key} must not be negative", field=f"usage.{key}")
    return usage


def reported_prompt_tokens(usage: Mapping[str, Any] | None) -> int | None:
    """Input tokens from an OpenAI (``prompt_tokens``) or Anthropic (``input_tokens`` + cache) usage."""
    if not usage:
        return None
    if isinstance(usage.get("prompt_tokens"), int):
        return int(usage["prompt_tokens"])
    if isinstance(usage.get("input_tokens"), int):
        total = int(usage["input_tokens"])
        for key in ("cache_read_input_tokens", "cache_creation_input_tokens"):
            if isinstance(usage.get(key), int):
                total += int(usage[key])
        return total
    return None


