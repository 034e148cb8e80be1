"""Sessions, the messages clients append to them, and the pre-reasoning hook that prepares each LLM call."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from contextlab.engine.convert import from_openai
from contextlab.engine.errors import MalformedInput
from contextlab.engine.hook import ContextManager
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
from contextlab.sessions.services.persistence import fate_sizes, locked_session, persist_step
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
        known_calls = {call_id: call["name"] for call_id, call in (locked.engine_state.get("calls") or {}).items()}
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
        known_calls = {call_id: call["name"] for call_id, call in (locked.engine_state.get("calls") or {}).items()}
        parsed = from_openai(raw, known_calls=known_calls)
        check_message_ids(parsed)
        before = fate_sizes(manager)
        manager.append(parsed)
        persist_step(locked, manager, before=before, originals={m.id: m for m in parsed})
    ids = [m.id for m in parsed]
    rows = {row.message_id: row for row in SessionMessage.objects.filter(session=locked, message_id__in=ids)}
    return [rows[mid] for mid in ids if mid in rows]


def session_prepare(*, session: AgentSession) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the pre-reasoning hook: the exact messages for the next LLM call (OpenAI format),
    and the turn's trace (``trace["turn"]`` is the turn number).

    While another request writes this session's summary, the last committed
    payload comes back at once (see ``summary_calls``).
    """
    turn = hook_turn(session, reuse_last=True)
    return turn.payload, turn.trace


def session_advance(*, session: AgentSession, messages: list[dict[str, Any]],
                    system_prompt: str | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Ingest new OpenAI chat messages (possibly none) and run the hook, as one step.

    What ``messages_append`` then ``session_prepare`` do, under one lock and one
    load of the engine: nothing can slip in between, and the turn costs one
    state load instead of two. ``system_prompt``, when given and different,
    replaces the session's (clients that put the date or live notes in it).
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
        if not messages:
            return []
        known_calls = {call_id: call["name"] for call_id, call in (locked.engine_state.get("calls") or {}).items()}
        parsed = from_openai(messages, known_calls=known_calls)
        check_message_ids(parsed)
        manager.append(parsed)
        return parsed

    turn = hook_turn(session, ingest=ingest)
    return turn.payload, turn.trace


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


