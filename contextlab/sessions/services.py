"""Workflows over sessions: the engine does the work, these functions persist it.

Every function that changes a session runs the engine and writes the result in
one transaction holding a row lock on the session (``select_for_update``; on
SQLite the IMMEDIATE transactions of the settings serialise writers instead),
so two hooks, or a hook and a manual compaction, never interleave on one
session: the second waits and then starts from the state the first committed.
The engine itself writes the dialog archive before it removes a message, so a
rollback after a file write leaves an extra archive line at worst, never a loss.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import tempfile
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import UploadedFile
from django.db import DatabaseError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from contextlab import jobs, live
from contextlab.engine.archive import DialogArchive
from contextlab.engine.convert import detect_message_format, from_agentscope, from_anthropic, from_openai
from contextlab.engine.errors import ContextLabError, InvalidMessages, InvalidProfile, MalformedInput
from contextlab.engine.hook import ContextManager, TurnResult, replay_turns
from contextlab.engine.importers import load_transcript
from contextlab.engine.messages import Message, block_to_dict
from contextlab.engine.profile import Profile
from contextlab.sessions import compaction_loss
from contextlab.sessions.models import (
    COMPACTION_OUTCOMES,
    FAILURE_OUTCOMES,
    LIST_KNOBS,
    PROFILE_KNOBS,
    AgentProfile,
    AgentSession,
    CompactionRun,
    OffloadedFile,
    SessionMessage,
    SummaryVersion,
    Turn,
)

log = logging.getLogger(__name__)

BUNDLE_FORMAT = "contextlab.session-bundle/1"
MAX_MESSAGE_ID_LENGTH = 200
MAX_TITLE_LENGTH = 200
MAX_INSTRUCTION_LENGTH = 20_000


class SessionUnavailable(ContextLabError):
    """The session cannot take this request now (an import is still replaying it)."""


class PayloadTooLarge(MalformedInput):
    """An upload over the configured size limit."""


class RunInProgress(ContextLabError):
    """A manual compaction of the session is already queued or running."""


# -- input checks ------------------------------------------------------------------------


def _check_text(value: Any, field: str, *, max_length: int | None = None) -> str:
    if not isinstance(value, str):
        raise MalformedInput(f"{field} must be a string", field=field)
    if "\x00" in value:
        raise MalformedInput(f"{field} holds a NUL character", field=field)
    if max_length is not None and len(value) > max_length:
        raise MalformedInput(f"{field} is longer than {max_length:,} characters", field=field)
    return value


def _find_nul(value: Any) -> bool:
    """True when any string (key or value) inside ``value`` holds a NUL character."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _check_raw_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise InvalidMessages("messages must be a list of message objects", field="messages")
    if not messages:
        raise InvalidMessages("messages is empty", field="messages")
    for index, item in enumerate(messages):
        # PostgreSQL text cannot hold NUL, so refuse it on every database
        # rather than store a message SQLite keeps and PostgreSQL loses.
        if _find_nul(item):
            raise InvalidMessages(
                "the message holds a NUL character (\\u0000), which cannot be stored; escape binary output",
                field=f"messages[{index}]",
            )
    return messages


def _check_message_ids(messages: list[Message]) -> None:
    for index, msg in enumerate(messages):
        if len(msg.id) > MAX_MESSAGE_ID_LENGTH:
            raise InvalidMessages(f"message id longer than {MAX_MESSAGE_ID_LENGTH} characters",
                                  field=f"messages[{index}].id")


def _convert(messages: list[dict[str, Any]], known_calls: Mapping[str, str]) -> list[Message]:
    """Like ``messages_from_any``, but a batch may answer tool calls of an earlier batch."""
    fmt = detect_message_format(messages)
    if fmt == "anthropic":
        return from_anthropic(messages, known_calls=known_calls)
    if fmt == "agentscope":
        return from_agentscope(messages, known_calls=known_calls)
    return from_openai(messages, known_calls=known_calls)


# -- profiles ----------------------------------------------------------------------------


def profile_default(*, owner: User) -> AgentProfile:
    profile, _ = AgentProfile.objects.get_or_create(owner=owner, name="default")
    return profile


def profile_create(*, owner: User, name: str, knobs: Mapping[str, Any]) -> AgentProfile:
    """Create a profile from knob values; errors name the knob (``InvalidProfile``)."""
    name = _check_text(name, "name", max_length=100).strip()
    if not name:
        raise InvalidProfile("a profile needs a name", field="name")
    if not isinstance(knobs, Mapping):
        raise InvalidProfile("a profile must be an object of settings", field="profile")
    # The engine checks names, types, bounds and combinations first, so the
    # error is the engine's sentence naming the knob at fault.
    engine = Profile.from_dict({**dict(knobs), "name": name})
    if AgentProfile.objects.filter(owner=owner, name=name).exists():
        raise InvalidProfile(f"you already have a profile named {name!r}", field="name")
    values = {k: (list(v) if k in LIST_KNOBS else v) for k, v in engine.to_dict().items() if k in PROFILE_KNOBS}
    profile = AgentProfile(owner=owner, name=name, **values)
    try:
        profile.full_clean()
    except ValidationError as exc:
        field, messages = next(iter(exc.message_dict.items()))
        raise InvalidProfile(" ".join(messages), field=field) from exc
    profile.save()
    return profile


def profile_resolve(*, owner: User, ref: Any) -> AgentProfile:
    """A profile of ``owner`` by id, by name, or created from an object of knobs."""
    if isinstance(ref, dict):
        knobs = dict(ref)
        name = knobs.pop("name", None) or f"profile-{uuid.uuid4().hex[:8]}"
        return profile_create(owner=owner, name=name, knobs=knobs)
    profiles = AgentProfile.objects.filter(owner=owner)
    found: AgentProfile | None = None
    if isinstance(ref, int) and not isinstance(ref, bool):
        found = profiles.filter(pk=ref).first()
    elif isinstance(ref, str):
        found = profiles.filter(name=ref).first()
        if found is None and ref.isdigit():
            found = profiles.filter(pk=int(ref)).first()
    else:
        raise InvalidProfile("profile must be a profile id, a profile name or an object of settings",
                             field="profile")
    if found is None:
        raise InvalidProfile(f"you have no profile {ref!r}", field="profile")
    return found


# -- the engine, loaded and persisted --------------------------------------------------


def _manager(session: AgentSession) -> ContextManager:
    """The session's engine, transactional: its archive writes are journaled until
    ``_persist``'s transaction commits, so archive lines of a turn whose state never
    reached the database (the process died in between) are cut back here, on load.

    Load it only while holding the session's row lock (``_locked``): unlocked, the
    turn "never saved" could be another process's turn that is still running.
    """
    profile = session.profile.to_engine()
    if not session.engine_state:
        return ContextManager(profile, session.workspace, system_prompt=session.system_prompt, transactional=True)
    manager = ContextManager.from_state(profile, session.workspace, session.engine_state, transactional=True)
    if manager.recovered_files:
        log.warning("session %s: cut %s back to before turn %s, whose state was never saved (the process "
                    "died before its commit)", session.pk, ", ".join(manager.recovered_files), manager.turn + 1)
    return manager


@contextlib.contextmanager
def _locked(session: AgentSession) -> Iterator[tuple[AgentSession, ContextManager]]:
    """The session row, locked until the transaction ends, and its engine."""
    with transaction.atomic():
        locked = (AgentSession.objects.select_for_update(of=("self",)).select_related("profile")
                  .get(pk=session.pk))
        if locked.status == AgentSession.Status.IMPORTING:
            raise SessionUnavailable("the session is still being imported; try again when it is done",
                                     field="session")
        yield locked, _manager(locked)


def _fate_sizes(manager: ContextManager) -> dict[str, int]:
    return {message_id: len(events) for message_id, events in manager.fate.items()}


def _apply_fate(row: SessionMessage, events: list[dict[str, Any]], live: Message | None,
                manager: ContextManager) -> None:
    row.fate = list(events)
    for event in events:
        kind = event.get("event")
        if kind == "truncated":
            stage = event.get("stage")
            row.truncated_stage = stage if isinstance(stage, int) else 2
            row.truncated_turn = event.get("turn", event.get("before_turn"))
        elif kind == "compacted":
            archive = event.get("archive") or {}
            row.status = SessionMessage.Status.ARCHIVED
            row.compacted_turn = event.get("turn")
            row.summary_version = event.get("summary_version")
            row.archive_file = archive.get("file", "")
            row.archive_line = archive.get("line")
    if live is not None:
        row.status = SessionMessage.Status.LIVE
        row.current_content = [block_to_dict(b) for b in live.content]
        row.tokens = manager.exact_counter.count_message(live)
    elif row.current_content is None:
        # Ingested and compacted within one persisted step (an import): the
        # archive holds the original, which is what it last looked like.
        row.current_content = row.content


_MESSAGE_FIELDS = ["fate", "status", "truncated_stage", "truncated_turn", "compacted_turn", "summary_version",
                   "archive_file", "archive_line", "current_content", "tokens"]


def _persist_messages(session: AgentSession, manager: ContextManager, before: Mapping[str, int],
                      originals: Mapping[str, Message]) -> None:
    """Write the rows of every message whose fate changed since ``before``.

    Keyed by message id, so persisting the same step twice updates rows instead
    of adding duplicates.
    """
    changed = [mid for mid, events in manager.fate.items() if len(events) != before.get(mid)]
    if not changed:
        return
    live = {m.id: m for m in manager.messages}
    existing = {row.message_id: row for row in SessionMessage.objects.filter(session=session, message_id__in=changed)}
    new_rows: list[SessionMessage] = []
    updated: list[SessionMessage] = []
    for mid in changed:
        row = existing.get(mid)
        if row is None:
            original = originals.get(mid)
            if original is None:
                log.warning("session %s: message %s has no ingested original; not recorded", session.pk, mid)
                continue
            session.messages_count += 1
            row = SessionMessage(session=session, message_id=mid, seq=session.messages_count, role=original.role,
                                 name=original.name or "", timestamp=original.timestamp,
                                 content=[block_to_dict(b) for b in original.content], current_content=None)
            new_rows.append(row)
        else:
            updated.append(row)
        _apply_fate(row, manager.fate[mid], live.get(mid), manager)
    SessionMessage.objects.bulk_create(new_rows)
    if updated:
        SessionMessage.objects.bulk_update(updated, _MESSAGE_FIELDS)


def _step(trace: Mapping[str, Any], name: str) -> dict[str, Any]:
    for step in trace.get("steps") or []:
        if step.get("step") == name:
            return dict(step)
    return {}


def _persist_turn(session: AgentSession, result: TurnResult) -> Turn:
    trace = result.trace.to_dict()
    gate = _step(trace, "gate").get("numbers") or {}
    archived = (_step(trace, "mark_compressed").get("numbers") or {}).get("archived") or 0
    budget = trace.get("budget") or {}
    turn, created = Turn.objects.update_or_create(
        session=session,
        number=trace["turn"],
        defaults={
            "trigger": trace["trigger"],
            "outcome": trace["outcome"],
            "policy": trace["policy"],
            "trace": trace,
            "payload": result.openai_messages(),
            "used_tokens": int(gate.get("used", 0)) + int(gate.get("messages_tokens", 0)),
            "threshold": int(budget.get("threshold", 0)),
            "window": int(budget.get("window", 0)),
            "payload_tokens": int(trace["payload"]["tokens"]["total"]),
            "compacted_count": int(archived),
            "duration_ms": float(trace.get("duration_ms") or 0.0),
            "summary_version": int(trace["payload"].get("summary_version") or 0),
        },
    )
    session.tokens_used = turn.payload_tokens
    if created:
        session.compactions_count += int(turn.outcome in COMPACTION_OUTCOMES)
        session.failures_count += int(turn.outcome in FAILURE_OUTCOMES)
    return turn


def _persist_summaries(session: AgentSession, manager: ContextManager) -> None:
    known = set(SummaryVersion.objects.filter(session=session).values_list("version", flat=True))
    SummaryVersion.objects.bulk_create([
        SummaryVersion(session=session, version=s.version, text=s.text, turn=s.turn, trigger=s.trigger,
                       compactor=s.compactor, fallback=s.fallback, compacted_ids=s.compacted_ids,
                       created=parse_datetime(s.created_at.replace("Z", "+00:00")) or timezone.now())
        for s in manager.summaries if s.version not in known
    ])


def _persist_offloaded(session: AgentSession, manager: ContextManager) -> None:
    if not manager.ledger:
        return
    referenced = manager.referenced_files()
    existing = {f.path: f for f in OffloadedFile.objects.filter(session=session)}
    new_rows: list[OffloadedFile] = []
    updated: list[OffloadedFile] = []
    for entry in manager.ledger.values():
        values = {
            "message_id": entry["message_id"], "tool": entry.get("tool") or "", "stage": int(entry["stage"]),
            "bytes": int(entry["original_bytes"]), "kept_bytes": int(entry["kept_bytes"]),
            "sha256": entry["sha256"], "expires_at": parse_datetime(entry["expires_at"]),
            "referenced": entry["file"] in referenced,
        }
        row = existing.get(entry["file"])
        if row is None:
            new_rows.append(OffloadedFile(session=session, path=entry["file"], **values))
        elif any(getattr(row, k) != v for k, v in values.items()):
            for key, value in values.items():
                setattr(row, key, value)
            updated.append(row)
    OffloadedFile.objects.bulk_create(new_rows)
    if updated:
        OffloadedFile.objects.bulk_update(updated, ["message_id", "tool", "stage", "bytes", "kept_bytes",
                                                    "sha256", "expires_at", "referenced"])


def _persist(session: AgentSession, manager: ContextManager, *, before: Mapping[str, int],
             originals: Mapping[str, Message] | None = None, result: TurnResult | None = None) -> Turn | None:
    """Write what one engine step changed: messages, turn, summaries, files, state."""
    _persist_messages(session, manager, before, originals or {})
    turn = _persist_turn(session, result) if result is not None else None
    _persist_summaries(session, manager)
    _persist_offloaded(session, manager)
    compaction_loss.record(session)
    profile = manager.profile
    session.engine_state = manager.export_state(history=False)
    session.summary = manager.summary or ""
    session.summary_version = manager.summary_version
    session.turns_count = manager.turn
    session.live_count = len(manager.messages)
    session.tokens_threshold = profile.threshold
    session.tokens_window = profile.max_input_length
    session.last_activity = timezone.now()
    session.save()
    # The archive journal goes only once the database holds the state its lines
    # belong to; robust, because a journal left behind is harmless (the next load
    # sees its turn was saved and clears it) and must not turn a commit into an error.
    transaction.on_commit(manager.commit, robust=True)
    state = _live_state(session, manager, turn)
    transaction.on_commit(lambda: session_announce(session_id=session.pk, state=state))
    return turn


# -- sessions ----------------------------------------------------------------------------


def session_create(*, owner: User, system_prompt: str, profile: AgentProfile | None = None,
                   title: str = "") -> AgentSession:
    system_prompt = _check_text(system_prompt, "system_prompt")
    title = _check_text(title, "title", max_length=MAX_TITLE_LENGTH)
    profile = profile or profile_default(owner=owner)
    engine_profile = profile.to_engine()
    session = AgentSession(owner=owner, profile=profile, title=title, system_prompt=system_prompt,
                           tokens_threshold=engine_profile.threshold,
                           tokens_window=engine_profile.max_input_length)
    manager = ContextManager(engine_profile, session.workspace, system_prompt=system_prompt)
    session.engine_state = manager.export_state(history=False)
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
    raw = _check_raw_messages(messages)
    with _locked(session) as (locked, manager):
        known_calls = {call_id: call["name"] for call_id, call in (locked.engine_state.get("calls") or {}).items()}
        parsed = _convert(raw, known_calls)
        _check_message_ids(parsed)
        before = _fate_sizes(manager)
        manager.append(parsed)
        _persist(locked, manager, before=before, originals={m.id: m for m in parsed})
    ids = [m.id for m in parsed]
    rows = {row.message_id: row for row in SessionMessage.objects.filter(session=locked, message_id__in=ids)}
    return [rows[mid] for mid in ids if mid in rows]


def messages_append_openai(*, session: AgentSession, messages: list[dict[str, Any]]) -> list[SessionMessage]:
    """``messages_append`` for messages known to be OpenAI chat messages (no format detection).

    Detection cannot tell an OpenAI message whose content is a list of text
    parts from an Anthropic one; a caller that speaks OpenAI says so.
    """
    raw = _check_raw_messages(messages)
    with _locked(session) as (locked, manager):
        known_calls = {call_id: call["name"] for call_id, call in (locked.engine_state.get("calls") or {}).items()}
        parsed = from_openai(raw, known_calls=known_calls)
        _check_message_ids(parsed)
        before = _fate_sizes(manager)
        manager.append(parsed)
        _persist(locked, manager, before=before, originals={m.id: m for m in parsed})
    ids = [m.id for m in parsed]
    rows = {row.message_id: row for row in SessionMessage.objects.filter(session=locked, message_id__in=ids)}
    return [rows[mid] for mid in ids if mid in rows]


def session_prepare(*, session: AgentSession) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the pre-reasoning hook: the exact messages for the next LLM call (OpenAI format),
    and the turn's trace (``trace["turn"]`` is the turn number)."""
    with _locked(session) as (locked, manager):
        before = _fate_sizes(manager)
        result = manager.prepare()
        turn = _persist(locked, manager, before=before, result=result)
    assert turn is not None
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
        _check_raw_messages(messages)
    if system_prompt is not None:
        system_prompt = _check_text(system_prompt, "system_prompt")
    with _locked(session) as (locked, manager):
        if system_prompt is not None and system_prompt != manager.system_prompt:
            manager.system_prompt = system_prompt
            locked.system_prompt = system_prompt
        before = _fate_sizes(manager)
        parsed: list[Message] = []
        if messages:
            known_calls = {call_id: call["name"]
                           for call_id, call in (locked.engine_state.get("calls") or {}).items()}
            parsed = from_openai(messages, known_calls=known_calls)
            _check_message_ids(parsed)
            manager.append(parsed)
        result = manager.prepare()
        turn = _persist(locked, manager, before=before, originals={m.id: m for m in parsed}, result=result)
    assert turn is not None
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


# -- manual compaction -------------------------------------------------------------------


def compaction_preview(*, session: AgentSession) -> dict[str, Any]:
    """Which messages a manual compaction would summarise and which it would keep."""
    # Under the lock like a turn, because loading the engine may cut back the
    # archive (see ``_manager``).
    with _locked(session) as (_, manager):
        return manager.preview_compaction().to_dict()


def compaction_run(*, session: AgentSession, instruction: str | None = None,
                   requested_by: User | None = None) -> CompactionRun:
    """Record a manual compaction and run it now (a background job calls ``compaction_execute``)."""
    if instruction is not None:
        instruction = _check_text(instruction, "instruction", max_length=MAX_INSTRUCTION_LENGTH)
    run = CompactionRun.objects.create(session=session, instruction=instruction or "", requested_by=requested_by)
    # Held like a worker holds it, so the sweep for dead workers leaves it alone.
    with jobs.hold_run(run.pk):
        compaction_execute(run=run)
    return run


def compaction_execute(*, run: CompactionRun) -> CompactionRun:
    run.mark_running()
    try:
        with _locked(run.session) as (locked, manager):
            before = _fate_sizes(manager)
            result = manager.compact(run.instruction or None)
            turn = _persist(locked, manager, before=before, result=result)
    except ContextLabError as exc:
        run.mark_failed(exc.message)
        raise
    except Exception as exc:
        run.mark_failed(f"{type(exc).__name__}: {exc}")
        raise
    assert turn is not None
    run.mark_done(turn_number=turn.number, outcome=turn.outcome)
    return run


# -- imports -----------------------------------------------------------------------------


@dataclass
class _Spooled:
    path: Path
    name: str


@contextlib.contextmanager
def _spooled(upload: UploadedFile) -> Iterator[_Spooled]:
    """The upload as a file on disk (importers read paths), keeping its file name."""
    limit = settings.CONTEXTLAB_MAX_UPLOAD_BYTES
    if upload.size is not None and upload.size > limit:
        raise PayloadTooLarge(f"the file holds {upload.size:,} bytes, more than the {limit:,}-byte limit",
                              field="file")
    # Only the last part of the client's name, and only harmless characters.
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in PurePosixPath(upload.name or "").name)
    name = name.lstrip(".") or "transcript.json"
    with tempfile.TemporaryDirectory(prefix="contextlab-upload-") as tmp:
        path = Path(tmp) / name
        with path.open("wb") as fh:
            for chunk in upload.chunks():
                fh.write(chunk)
        yield _Spooled(path=path, name=name)


def transcript_import(*, owner: User, path: str | Path | None = None, upload: UploadedFile | None = None,
                      profile: AgentProfile | None = None, title: str = "") -> AgentSession:
    """Import a recorded transcript (any format the engine reads, or a session bundle)
    and replay it through the hook turn by turn, persisting each turn.

    Unreadable input is refused before anything is written; a failure during the
    replay removes the half-imported session.
    """
    if (path is None) == (upload is None):
        raise MalformedInput("give a transcript path or an uploaded file", field="file")
    if upload is not None:
        with _spooled(upload) as spooled:
            return transcript_import(owner=owner, path=spooled.path, profile=profile,
                                     title=title or spooled.name[:MAX_TITLE_LENGTH])
    assert path is not None
    source = Path(path)
    with source.open("rb") as fh:
        if fh.read(4) == b"PK\x03\x04":
            return session_import_bundle(owner=owner, data=source.read_bytes(), profile=profile)
    transcript = load_transcript(source)
    session = session_create(owner=owner, system_prompt=transcript.system_prompt or "", profile=profile,
                             title=title or source.name[:MAX_TITLE_LENGTH])
    session.status = AgentSession.Status.IMPORTING
    session.source = {"format": transcript.format, "file": source.name, "warnings": transcript.warnings[:100],
                      "messages": len(transcript.messages)}
    session.save(update_fields=["status", "source"])
    try:
        _replay(session, transcript.messages)
    except BaseException:
        session_delete(session=session)
        raise
    session.refresh_from_db()
    session.status = AgentSession.Status.ACTIVE
    session.save(update_fields=["status"])
    return session


def _replay(session: AgentSession, messages: list[Message],
            progress: Callable[[int, int], None] | None = None) -> None:
    manager = _manager(session)
    originals = {m.id: m for m in messages}
    before: dict[str, int] = {}

    def on_turn(result: TurnResult, done: int) -> None:
        nonlocal before
        # One transaction per turn, like a live agent's hook calls; the
        # "importing" status keeps every other writer away meanwhile.
        with transaction.atomic():
            locked = AgentSession.objects.select_for_update(of=("self",)).get(pk=session.pk)
            _persist(locked, manager, before=before, originals=originals, result=result)
        before = _fate_sizes(manager)
        if progress is not None:
            progress(done, len(messages))

    if messages:
        replay_turns(messages, manager, on_turn=on_turn)


# -- bundles -----------------------------------------------------------------------------

_BUNDLE_SESSION_FIELDS = ("title", "system_prompt", "status", "summary", "summary_version", "tokens_used",
                          "tokens_threshold", "tokens_window", "turns_count", "compactions_count",
                          "failures_count", "messages_count", "live_count", "source")
_BUNDLE_ROWS: dict[str, tuple[type[Any], tuple[str, ...]]] = {
    "messages.jsonl": (SessionMessage, ("message_id", "seq", "role", "name", "timestamp", "content",
                                        "current_content", "tokens", "status", "truncated_stage", "truncated_turn",
                                        "compacted_turn", "summary_version", "archive_file", "archive_line",
                                        "fate")),
    "turns.jsonl": (Turn, ("number", "trigger", "outcome", "policy", "trace", "payload", "used_tokens", "threshold",
                           "window", "payload_tokens", "compacted_count", "duration_ms", "summary_version", "usage",
                           "created")),
    "summaries.jsonl": (SummaryVersion, ("version", "text", "turn", "trigger", "compactor", "fallback",
                                         "compacted_ids", "created")),
    "offloaded_files.jsonl": (OffloadedFile, ("path", "message_id", "tool", "stage", "bytes", "kept_bytes", "sha256",
                                              "expires_at", "referenced")),
    "compaction_runs.jsonl": (CompactionRun, ("status", "trigger", "instruction", "error", "turn_number", "outcome",
                                              "created", "started", "finished")),
}
_DATETIME_FIELDS = {"created", "started", "finished", "expires_at", "last_activity"}
# A fixed timestamp inside the zip, so the same session always gives the same bytes.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def _json_value(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _zip_write(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    archive.writestr(info, data)


def session_export(*, session: AgentSession) -> bytes:
    """The whole session as a zip: rows, engine state and the workspace files."""
    manifest = {
        "format": BUNDLE_FORMAT,
        "id": str(session.id),
        "created": session.created.isoformat(),
        "last_activity": session.last_activity.isoformat(),
        "session": {name: getattr(session, name) for name in _BUNDLE_SESSION_FIELDS},
        "profile": {"name": session.profile.name, **session.profile.knobs()},
        "engine_state": session.engine_state,
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        _zip_write(archive, "session.json", json.dumps(manifest, ensure_ascii=False, indent=1).encode())
        for file_name, (model, fields) in _BUNDLE_ROWS.items():
            rows = model.objects.filter(session=session).order_by("pk").values_list(*fields)
            lines = [json.dumps(dict(zip(fields, map(_json_value, row), strict=True)), ensure_ascii=False)
                     for row in rows]
            _zip_write(archive, file_name, "".join(line + "\n" for line in lines).encode())
        workspace = session.workspace
        # The archive journal is bookkeeping of a turn in flight here (see
        # ``_manager``), not session data: a bundle carries the committed state.
        journal = workspace / DialogArchive.folder_name / DialogArchive.journal_name
        if workspace.is_dir():
            for path in sorted(p for p in workspace.rglob("*") if p.is_file() and p != journal):
                _zip_write(archive, f"workspace/{path.relative_to(workspace).as_posix()}", path.read_bytes())
    return buffer.getvalue()


def _bundle_member_path(name: str) -> str | None:
    """The workspace-relative path of a ``workspace/…`` member; refuses anything that could escape."""
    if not name.startswith("workspace/") or name.endswith("/"):
        return None
    relative = PurePosixPath(name[len("workspace/"):])
    if relative.is_absolute() or not relative.parts or any(p in ("..", "") or "\\" in p for p in relative.parts):
        raise MalformedInput(f"the bundle holds an unsafe path {name!r}", field="file")
    return relative.as_posix()


def _bundle_profile(owner: User, data: Mapping[str, Any]) -> AgentProfile:
    """The owner's profile with the bundle's name and knobs, created when there is none."""
    name = str(data.get("name") or "imported")
    knobs = {k: data[k] for k in PROFILE_KNOBS if k in data}
    same = AgentProfile.objects.filter(owner=owner, name=name).first()
    if same is not None and same.knobs() == {**same.knobs(), **knobs}:
        return same
    candidate, n = name if same is None else f"{name} (imported)", 1
    while AgentProfile.objects.filter(owner=owner, name=candidate).exists():
        n += 1
        candidate = f"{name} (imported {n})"
    return profile_create(owner=owner, name=candidate, knobs=knobs)


def session_import_bundle(*, owner: User, data: bytes, profile: AgentProfile | None = None) -> AgentSession:
    """Recreate a session from ``session_export``'s zip, for ``owner``.

    The session keeps its id when that id is free (so the notices in its
    messages still name its own workspace), else it gets a new one.
    """
    limit = settings.CONTEXTLAB_MAX_UPLOAD_BYTES
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except zipfile.BadZipFile as exc:
        raise MalformedInput(f"not a session bundle: {exc}", field="file") from exc
    # Declared sizes bound what reading can cost (a zip bomb is refused here).
    if sum(info.file_size for info in infos) > 4 * limit:
        raise PayloadTooLarge("the bundle unpacks to more than the upload limit allows", field="file")
    names = {info.filename for info in infos}
    if "session.json" not in names:
        raise MalformedInput("not a session bundle: session.json is missing", field="file")
    files = {rel: info for info in infos if (rel := _bundle_member_path(info.filename)) is not None}
    try:
        manifest = json.loads(archive.read("session.json"))
        rows = {name: [json.loads(line) for line in archive.read(name).splitlines() if line.strip()]
                for name in _BUNDLE_ROWS if name in names}
    except (ValueError, RecursionError) as exc:
        raise MalformedInput(f"the bundle holds invalid JSON: {exc}", field="file") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise MalformedInput(f"not a session bundle of format {BUNDLE_FORMAT}", field="file")

    try:
        session = _bundle_restore(owner, profile, manifest, rows, archive, files)
    except (TypeError, ValueError, KeyError, DatabaseError) as exc:
        raise MalformedInput(f"the bundle does not describe a valid session: {exc}", field="file") from exc
    return session


def _bundle_restore(owner: User, profile: AgentProfile | None, manifest: dict[str, Any],
                    rows: dict[str, list[dict[str, Any]]], archive: zipfile.ZipFile,
                    files: dict[str, zipfile.ZipInfo]) -> AgentSession:
    with transaction.atomic():
        profile = profile or _bundle_profile(owner, manifest.get("profile") or {})
        session = AgentSession(owner=owner, profile=profile, engine_state=manifest.get("engine_state") or {},
                               created=parse_datetime(manifest.get("created") or "") or timezone.now(),
                               last_activity=parse_datetime(manifest.get("last_activity") or "") or timezone.now())
        wanted = manifest.get("id")
        with contextlib.suppress(ValueError, ValidationError):
            if wanted and not AgentSession.objects.filter(pk=wanted).exists():
                session.id = uuid.UUID(str(wanted))
        for name in _BUNDLE_SESSION_FIELDS:
            if name in (manifest.get("session") or {}):
                setattr(session, name, manifest["session"][name])
        try:
            session.full_clean(exclude=["owner", "profile", "engine_state", "source"])
        except ValidationError as exc:
            field, messages = next(iter(exc.message_dict.items()))
            raise MalformedInput(f"session.{field}: {' '.join(messages)}", field="file") from exc
        session.save(force_insert=True)
        for name, (model, fields) in _BUNDLE_ROWS.items():
            objects = []
            for record in rows.get(name, []):
                values = {k: record.get(k) for k in fields if k in record}
                for key in _DATETIME_FIELDS & values.keys():
                    values[key] = parse_datetime(str(values[key])) if values[key] else None
                objects.append(model(session=session, **values))
            model.objects.bulk_create(objects)
        workspace = session.workspace
        # A folder left by a session deleted outside the services is stale.
        shutil.rmtree(workspace, ignore_errors=True)
        try:
            for relative, info in sorted(files.items()):
                target = workspace / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(info))
            # Loading the engine from the restored state proves the bundle is usable.
            _manager(session)
        except BaseException:
            shutil.rmtree(workspace, ignore_errors=True)
            raise
    return session


# -- live state --------------------------------------------------------------------------


def _live_state(session: AgentSession, manager: ContextManager, turn: Turn | None) -> dict[str, Any]:
    """Everything the session's gauge and counters show, as it was just committed.

    Sent whole with every update (a page never applies deltas), so a viewer
    that missed events is right again with the next one.
    """
    profile = manager.profile
    return {
        "status": session.status,
        "turns": session.turns_count,
        "messages": session.messages_count,
        "live_messages": session.live_count,
        "summary_version": session.summary_version,
        "compactions": session.compactions_count,
        "failures": session.failures_count,
        "tokens": {
            # The last payload sent (what the gauge of the latest turn shows) and
            # the live messages now, which an append changes before any turn.
            "used": session.tokens_used,
            "live_messages": manager.live_exact_tokens,
            "threshold": profile.threshold,
            "reserve": profile.reserve,
            "window": profile.max_input_length,
        },
        "turn": None if turn is None else {
            "number": turn.number, "trigger": turn.trigger, "outcome": turn.outcome,
            "layers": turn.layer_tokens(), "payload_tokens": turn.payload_tokens,
        },
        "last_activity": session.last_activity.isoformat(),
    }


def session_announce(*, session_id: Any, state: dict[str, Any]) -> None:
    """Push a session's new state to its viewers (at most ten times a second)."""
    live.publish(live.session_group(session_id),
                 {"type": "gauge.update", "session_id": str(session_id), "state": state}, coalesce="gauge")


def run_announce(run: CompactionRun, **extra: Any) -> None:
    """Push a run's row (plus ``extra``, e.g. import progress) to the session's viewers."""
    event = {"type": "run.update", "run_id": run.pk, "session_id": str(run.session_id), "run": run.to_dict(),
             **extra}
    # One key per run: a burst of progress collapses to its latest, and the
    # final status always goes out last.
    live.publish(live.session_group(run.session_id), event, coalesce=f"run-{run.pk}")


# -- background runs ---------------------------------------------------------------------
#
# A run row (CompactionRun; trigger "import" for a background import) goes
# queued -> running -> done | failed. A worker takes ``jobs.hold_run`` before it
# marks the run running and keeps it to the end, so a running run nobody holds
# belonged to a worker that died: ``runs_reap`` fails it. A compaction commits
# in one transaction with its run's final status, so a dead worker leaves the
# session exactly as it was (the engine writes the archive before it removes
# anything, and the database rolls back whatever the transaction had written).

WORKER_DIED = ("the worker running this job stopped before it finished; nothing it had started was kept. "
               "Run it again.")
NEVER_STARTED = ("no worker took this job within {minutes} minutes (is a `celery worker` running?); "
                 "it was not started. Run it again.")


def _run_claim(run_id: int) -> tuple[CompactionRun | None, bool]:
    """Mark the run running; (None, False) when it is gone or already finished.

    A run found running was started by a worker that died (the caller holds
    the run, so nobody else is working on it): it is taken over, i.e. retried.
    """
    with transaction.atomic():
        run = (CompactionRun.objects.select_for_update(of=("self",)).select_related("session")
               .filter(pk=run_id).first())
        if run is None or run.status not in (CompactionRun.Status.QUEUED, CompactionRun.Status.RUNNING):
            return None, False
        retried = run.status == CompactionRun.Status.RUNNING
        run.status = CompactionRun.Status.RUNNING
        run.started = timezone.now()
        run.finished = None
        run.error = ""
        run.save(update_fields=["status", "started", "finished", "error"])
    return run, retried


def _summary_failure(trace: Mapping[str, Any]) -> str:
    reasons: list[str] = []
    for name in ("summary", "validity"):
        step = _step(trace, name)
        if step.get("status") == "failed":
            reasons.extend(str(r) for r in step.get("reasons") or [])
    return "; ".join(reasons) or "the summary failed"


def _run_finish(run: CompactionRun, turn: Turn) -> None:
    """Record how the compaction turn ended; a failed summary is a failed run."""
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
        if turn.outcome == "fallback_summary":
            run.error = ("the summary model failed (" + _summary_failure(turn.trace)
                         + "); the offline extractive summary was used instead")
    run.save(update_fields=["status", "turn_number", "outcome", "finished", "error"])


def compaction_enqueue(*, session: AgentSession, instruction: str | None = None,
                       requested_by: User | None = None) -> CompactionRun:
    """Record a manual compaction and run it in the background; the row says how it goes."""
    if instruction is not None:
        instruction = _check_text(instruction, "instruction", max_length=MAX_INSTRUCTION_LENGTH)
    if session.status == AgentSession.Status.IMPORTING:
        raise SessionUnavailable("the session is still being imported; try again when it is done", field="session")
    from contextlab.sessions.tasks import compact_session

    with transaction.atomic():
        run = CompactionRun.objects.create(session=session, instruction=instruction or "",
                                           requested_by=requested_by)
        # Announced before the job starts, so "queued" never follows "running".
        transaction.on_commit(lambda: run_announce(run))
        jobs.enqueue(compact_session, run.pk, on_error=lambda exc: _run_not_queued(run, exc))
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
        raise RunInProgress(f"compaction run {active.pk} is {active.status}; wait for it to finish",
                            field="session")
    return compaction_enqueue(session=session, instruction=instruction, requested_by=requested_by)


def compaction_work(*, run_id: int) -> str:
    """The background side of ``compaction_enqueue``: "done", "failed", "skipped" or "busy"."""
    with jobs.hold_run(run_id) as held:
        if not held:
            return "busy"  # another worker has it (a second delivery of the same job)
        run, retried = _run_claim(run_id)
        if run is None:
            return "skipped"
        if retried:
            log.warning("compaction run %s: its previous worker died; running it again", run_id)
        run_announce(run, retried=retried)
        try:
            with _locked(run.session) as (locked, manager):
                # Each finished step goes to the page at once, so a slow summary
                # call shows where it stands (gate, split done; summary running).
                manager.observer = lambda _step, turn_so_far: run_announce(run, steps=_step_outline(turn_so_far))
                before = _fate_sizes(manager)
                result = manager.compact(run.instruction or None)
                turn = _persist(locked, manager, before=before, result=result)
                assert turn is not None
                # In the compaction's own transaction: "done" and the compaction
                # are committed together, or neither is.
                _run_finish(run, turn)
        except ContextLabError as exc:
            run.mark_failed(exc.message)
        except Exception as exc:
            log.exception("compaction run %s failed", run_id)
            run.mark_failed(f"{type(exc).__name__}: {exc}")
        run_announce(run)
        return str(run.status)


# -- background imports ------------------------------------------------------------------


def _import_source_dir(session_id: Any) -> Path:
    # Beside the workspaces (web and worker processes share that folder), not
    # inside the session's own CoPaw-layout workspace.
    return Path(settings.WORKSPACES_DIR) / ".imports" / str(session_id)


def transcript_import_enqueue(*, owner: User, path: str | Path | None = None, upload: UploadedFile | None = None,
                              profile: AgentProfile | None = None,
                              title: str = "") -> tuple[AgentSession, CompactionRun | None]:
    """Like ``transcript_import``, but the replay runs in the background.

    The transcript is read now, so unreadable input is refused before anything
    is written. A session bundle is restored at once (there is nothing to
    replay) and comes back without a run.
    """
    if (path is None) == (upload is None):
        raise MalformedInput("give a transcript path or an uploaded file", field="file")
    if upload is not None:
        with _spooled(upload) as spooled:
            return transcript_import_enqueue(owner=owner, path=spooled.path, profile=profile,
                                             title=title or spooled.name[:MAX_TITLE_LENGTH])
    assert path is not None
    source = Path(path)
    with source.open("rb") as fh:
        if fh.read(4) == b"PK\x03\x04":
            return session_import_bundle(owner=owner, data=source.read_bytes(), profile=profile), None
    transcript = load_transcript(source)
    from contextlab.sessions.tasks import import_transcript

    with transaction.atomic():
        session = session_create(owner=owner, system_prompt=transcript.system_prompt or "", profile=profile,
                                 title=title or source.name[:MAX_TITLE_LENGTH])
        session.status = AgentSession.Status.IMPORTING
        session.source = {"format": transcript.format, "file": source.name, "warnings": transcript.warnings[:100],
                          "messages": len(transcript.messages)}
        session.save(update_fields=["status", "source"])
        run = CompactionRun.objects.create(session=session, trigger="import", requested_by=owner)
        folder = _import_source_dir(session.pk)
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, folder / source.name)
        transaction.on_commit(lambda: run_announce(run, done=0, total=len(transcript.messages)))
        jobs.enqueue(import_transcript, run.pk, on_error=lambda exc: _run_not_queued(run, exc))
    return session, run


def _import_reset(session: AgentSession) -> None:
    """Forget every turn an interrupted or failed replay wrote; the session row stays."""
    with transaction.atomic():
        for model in (SessionMessage, Turn, SummaryVersion, OffloadedFile):
            model.objects.filter(session=session).delete()
        shutil.rmtree(session.workspace, ignore_errors=True)
        manager = ContextManager(session.profile.to_engine(), session.workspace, system_prompt=session.system_prompt)
        session.engine_state = manager.export_state(history=False)
        session.summary = ""
        for name in ("summary_version", "tokens_used", "turns_count", "compactions_count", "failures_count",
                     "messages_count", "live_count"):
            setattr(session, name, 0)
        session.save()


def _import_failed(run: CompactionRun, error: str) -> None:
    """A failed import leaves an empty, closed session that says why, and the failed run."""
    session = run.session
    session.refresh_from_db()
    _import_reset(session)
    session.status = AgentSession.Status.CLOSED
    session.source = {**(session.source or {}), "error": error}
    session.save(update_fields=["status", "source"])
    shutil.rmtree(_import_source_dir(session.pk), ignore_errors=True)
    run.mark_failed(error)


def transcript_import_work(*, run_id: int) -> str:
    """The background side of ``transcript_import_enqueue``: replay, publishing progress."""
    with jobs.hold_run(run_id) as held:
        if not held:
            return "busy"
        run, retried = _run_claim(run_id)
        if run is None:
            return "skipped"
        session = run.session
        run_announce(run, retried=retried, done=0, total=int((session.source or {}).get("messages") or 0))
        try:
            files = sorted(p for p in _import_source_dir(session.pk).glob("*") if p.is_file())
            if not files:
                raise MalformedInput("the uploaded transcript is gone; upload it again", field="file")
            # A retried run starts from scratch: the replay is deterministic.
            _import_reset(session)
            transcript = load_transcript(files[0])
            _replay(session, transcript.messages,
                    progress=lambda done, total: run_announce(run, done=done, total=total))
            session.refresh_from_db()
            with transaction.atomic():
                session.status = AgentSession.Status.ACTIVE
                session.save(update_fields=["status"])
                run.status = CompactionRun.Status.DONE
                run.turn_number = session.turns_count
                run.outcome = "imported"
                run.finished = timezone.now()
                run.save(update_fields=["status", "turn_number", "outcome", "finished"])
            shutil.rmtree(_import_source_dir(session.pk), ignore_errors=True)
        except ContextLabError as exc:
            _import_failed(run, exc.message)
        except Exception as exc:
            log.exception("import run %s failed", run_id)
            _import_failed(run, f"{type(exc).__name__}: {exc}")
        session.refresh_from_db()
        # Loaded under the lock: the session is open to writers again (see ``_manager``).
        with _locked(session) as (locked, manager):
            state = _live_state(locked, manager, None)
        session_announce(session_id=session.pk, state=state)
        run_announce(run, done=session.messages_count, total=int((session.source or {}).get("messages") or 0))
        return str(run.status)


# -- dead workers ------------------------------------------------------------------------


def _run_not_queued(run: CompactionRun, exc: Exception) -> None:
    error = f"the job could not be queued ({type(exc).__name__}: {exc}); nothing was started. Run it again."
    if run.trigger == "import":
        _import_failed(run, error)
    else:
        run.mark_failed(error)
    run_announce(run)


def runs_reap(*, now: datetime | None = None) -> list[int]:
    """Fail every run marked running whose worker is gone, and every run queued for longer
    than ``CONTEXTLAB_QUEUED_MINUTES`` (its job was lost, or no worker runs); returns their ids.

    A job that does turn up later finds its run failed and does nothing.
    """
    reaped: list[int] = []
    minutes = settings.CONTEXTLAB_QUEUED_MINUTES
    cutoff = (now or timezone.now()) - timedelta(minutes=minutes)
    for stale in list(CompactionRun.objects.select_related("session")
                      .filter(status=CompactionRun.Status.QUEUED, created__lt=cutoff)):
        with jobs.hold_run(stale.pk) as held:
            # Held: a worker is taking it right now.
            if not held or not CompactionRun.objects.filter(pk=stale.pk, status=CompactionRun.Status.QUEUED).exists():
                continue
            log.warning("run %s (%s): queued for more than %s minutes; marking it failed", stale.pk, stale.trigger,
                        minutes)
            if stale.trigger == "import":
                _import_failed(stale, NEVER_STARTED.format(minutes=minutes))
            else:
                stale.mark_failed(NEVER_STARTED.format(minutes=minutes))
            run_announce(stale)
            reaped.append(stale.pk)
    for run_id in list(CompactionRun.objects.filter(status=CompactionRun.Status.RUNNING)
                       .values_list("pk", flat=True)):
        with jobs.hold_run(run_id) as held:
            if not held:
                continue  # its worker is alive and holds it
            run = (CompactionRun.objects.select_related("session")
                   .filter(pk=run_id, status=CompactionRun.Status.RUNNING).first())
            if run is None:
                continue  # finished between the listing and the lock
            log.warning("run %s (%s): its worker died; marking it failed", run_id, run.trigger)
            if run.trigger == "import":
                _import_failed(run, WORKER_DIED)
            else:
                run.mark_failed(WORKER_DIED)
            run_announce(run)
            reaped.append(run_id)
    return reaped


def runs_recover() -> tuple[list[int], list[int]]:
    """At the start of an embedded-mode process: fail the runs the previous process
    was running and start again the ones it had only queued. Returns (failed, queued)."""
    from contextlab.sessions.tasks import compact_session, import_transcript

    failed = runs_reap()
    queued = list(CompactionRun.objects.filter(status=CompactionRun.Status.QUEUED)
                  .values_list("pk", "trigger").order_by("pk"))
    for run_id, trigger in queued:
        jobs.enqueue(import_transcript if trigger == "import" else compact_session, run_id)
    return failed, [run_id for run_id, _ in queued]


# -- retention ---------------------------------------------------------------------------


@dataclass
class PruneResult:
    sessions: int
    removed: list[str]  # "<session id>/<path>"
    kept_referenced: int  # expired files kept because the live context points to them


def offloaded_prune(*, now: datetime | None = None) -> PruneResult:
    """Delete offloaded tool outputs past their profile's retention, except those the
    live context still references; the rows stay (history) with ``referenced`` current.

    Only sessions with an unreferenced file old enough on disk are loaded, so
    the daily run costs little on a server with many sessions.
    """
    moment = now or timezone.now()
    candidates: set[Any] = set()
    for session_id, path, retention in (OffloadedFile.objects.filter(referenced=False)
                                        .values_list("session_id", "path", "session__profile__retention_days")):
        if session_id in candidates:
            continue
        file = Path(settings.WORKSPACES_DIR) / str(session_id) / path
        try:
            if file.stat().st_mtime + retention * 86_400 < moment.timestamp():
                candidates.add(session_id)
        except FileNotFoundError:
            pass  # pruned before
    result = PruneResult(sessions=0, removed=[], kept_referenced=0)
    for session in AgentSession.objects.filter(pk__in=candidates).select_related("profile"):
        try:
            with _locked(session) as (locked, manager):
                removed = manager.cleanup_offloaded(now=moment)
                referenced = manager.referenced_files()
                rows = list(OffloadedFile.objects.filter(session=locked))
                for row in rows:
                    row.referenced = row.path in referenced
                OffloadedFile.objects.bulk_update(rows, ["referenced"])
                expired = moment.timestamp() - locked.profile.retention_days * 86_400
                result.kept_referenced += sum(
                    1 for row in rows if row.referenced and (locked.workspace / row.path).is_file()
                    and (locked.workspace / row.path).stat().st_mtime < expired)
        except SessionUnavailable:
            continue  # being imported: the next run will see it
        result.sessions += 1
        result.removed.extend(f"{session.pk}/{path}" for path in removed)
        if removed:
            log.info("session %s: %d expired tool output(s) deleted", session.pk, len(removed))
    return result


# -- long-term memory --------------------------------------------------------------------


@dataclass
class MemoryConsolidation:
    session_id: str
    profile: str
    day: date
    backup: str | None
    diff: str
    added: list[str]
    removed: list[str]


def profile_zone(name: str) -> Any:
    """The profile's timezone; UTC (with a warning) when the name is unknown."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        log.warning("unknown timezone %r; using UTC", name)
        return ZoneInfo("UTC")


def memory_consolidate(*, profile: AgentProfile, day: date, now: datetime,
                       days: int | None = None) -> list[MemoryConsolidation]:
    """Merge the daily notes up to ``day`` into ``MEMORY.md`` in every workspace of the
    profile's sessions (the engine backs the old file up first); only changed ones are returned."""
    from contextlab.engine.memory import consolidate

    days = days or settings.CONTEXTLAB_MEMORY_DAYS
    changed: list[MemoryConsolidation] = []
    sessions = AgentSession.objects.filter(profile=profile).exclude(status=AgentSession.Status.IMPORTING)
    for session in sessions.only("id", "profile_id"):
        workspace = Path(settings.WORKSPACES_DIR) / str(session.pk)
        if not workspace.is_dir():
            continue
        try:
            result = consolidate(workspace, days=days, today=day, now=now)
        except Exception:  # one broken workspace must not stop the others
            log.exception("session %s: memory consolidation failed", session.pk)
            continue
        if result.diff:
            changed.append(MemoryConsolidation(
                session_id=str(session.pk), profile=profile.name, day=day,
                backup=str(result.backup_path.relative_to(workspace)) if result.backup_path else None,
                diff=result.diff, added=list(result.added), removed=list(result.removed)))
    return changed


def memory_day_due(zone: Any, tick: datetime, every: timedelta) -> date | None:
    """The local day that ended, when a local midnight of ``zone`` fell in (tick - every, tick].

    The local dates are compared, not the clock times, so a midnight that a
    daylight-saving change skips (23:59 -> 01:00) still counts, once. Running
    again for a day already merged changes nothing, so a repeat is harmless.
    """
    local_tick = tick.astimezone(zone)
    if (tick - every).astimezone(zone).date() == local_tick.date():
        return None
    return local_tick.date() - timedelta(days=1)


def memory_consolidate_due(*, now: datetime | None = None, every: timedelta = timedelta(minutes=15),
                           profile_ids: list[int] | None = None, days: int | None = None) -> list[MemoryConsolidation]:
    """The nightly job, run every ``every``: consolidate, up to the day that just
    ended, the profiles whose local midnight fell in the interval that ended at
    the last tick before ``now``. Stateless: a tick the scheduler misses skips
    that night, and the next night's run merges the notes it would have."""
    moment = now or timezone.now()
    step = int(every.total_seconds())
    tick = datetime.fromtimestamp(int(moment.timestamp()) // step * step, tz=UTC)
    profiles = AgentProfile.objects.all()
    if profile_ids is not None:
        profiles = profiles.filter(pk__in=profile_ids)
    changed: list[MemoryConsolidation] = []
    for profile in profiles:
        zone = profile_zone(profile.timezone)
        day = memory_day_due(zone, tick, every)
        if day is not None:
            changed.extend(memory_consolidate(profile=profile, day=day, now=moment.astimezone(zone), days=days))
    return changed
