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

from contextlab.engine.convert import from_openai
from contextlab.engine.errors import MalformedInput
from contextlab.engine.hook import ContextManager, TurnResult
from contextlab.engine.messages import Message
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
)
from contextlab.sessions.services.profiles import profile_default
from contextlab.sessions.services.summary_calls import hook_turn

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
    ids = [m.id for m in parsed]
    rows = {row.message_id: row for row in SessionMessage.objects.filter(session=locked, message_id__in=ids)}
    return [rows[mid] for mid in ids if mid in rows]


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
    ids = [m.id for m in parsed]
    rows = {row.message_id: row for row in SessionMessage.objects.filter(session=locked, message_id__in=ids)}
    return [rows[mid] for mid in ids if mid in rows]


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
                            request_schemas: tuple[Any, Any] | None = None) -> PendingTurn:
    """``session_advance`` without the write: the payload now, the turn once ``pending_turn_commit`` runs.

    ``session`` may be new (``session_new``). Call it inside the caller's
    transaction. Nothing is written, with one exception: a hook that compacted
    has already written the summary's archive lines, and a later load would cut
    them back as a turn that never saved, so that turn is written at once
    (``committed``).
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
        if messages:
            parsed = from_openai(messages, known_calls=manager.call_names())
            check_message_ids(parsed)
            manager.append(parsed)
        result = manager.prepare()
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


def pending_turn_commit(*, pending: PendingTurn, reply: list[dict[str, Any]]) -> bool:
    """Write a pending turn and the provider's reply (OpenAI messages, possibly none) in the caller's transaction.

    Returns False when the session moved since the turn was computed (another
    writer got in between): then the turn is run again on the newer state, so
    nothing is lost or written twice, and the recorded payload is the new run's.
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
    persist_step(locked, manager, before=pending.before, originals=pending.originals, result=pending.result)
    if reply:
        check_raw_messages(reply)
        parsed = from_openai(reply, known_calls=manager.call_names())
        check_message_ids(parsed)
        before = fate_sizes(manager)
        manager.append(parsed)
        persist_step(locked, manager, before=before, originals={m.id: m for m in parsed})
    # Written: from now on the engine is the committed state, for the next request to reuse.
    transaction.on_commit(lambda: engines.keep(locked, manager))
    return True


def usage_report(*, session: AgentSession, turn_number: int, usage: Any) -> Turn:
    """Record what the provider billed for the call made with turn ``turn_number``'s payload."""
    if not isinstance(usage, dict) or not usage:
        raise MalformedInput("usage must be a non-empty object, e.g. {\"prompt_tokens\": 1234}", field="usage")
    for key, value in usage.items():
        if isinstance(value, bool) or not isinstance(value, int | float | dict | type(None)):
            raise MalformedInput(f"usage.{key} must be a number or an object", field=f"usage.{key}")
        if isinstance(value, int | float) and value < 0:
            raise MalformedInput(f"usage.{key} must not be negative", field=f"usage.{key}")
    with transaction.atomic():
        turn = Turn.objects.select_for_update().get(session=session, number=turn_number)
        turn.usage = usage
        turn.save(update_fields=["usage"])
    return turn


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


