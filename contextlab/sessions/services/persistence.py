"""A session's engine, loaded under the session's row lock, and what one engine step changed, written back."""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from contextlab.engine.core.messages import Message, block_to_dict
from contextlab.engine.hook import ContextManager, TurnResult
from contextlab.sessions import loss_records, payload_delta
from contextlab.sessions.models import (
    COMPACTION_OUTCOMES,
    FAILURE_OUTCOMES,
    AgentSession,
    OffloadedFile,
    SessionCall,
    SessionMessage,
    SummaryVersion,
    Turn,
)
from contextlab.sessions.services.inputs import SessionUnavailable
from contextlab.sessions.services.live_state import (
    current_live_view,
    live_state_of,
    live_view_of,
    session_announce,
)
from contextlab.support import telemetry

log = logging.getLogger(__name__)


def load_manager(session: AgentSession) -> ContextManager:
    """The session's engine, transactional: its archive writes are journaled until
    ``persist_step``'s transaction commits, so archive lines of a turn whose state never
    reached the database (the process died in between) are cut back here, on load.

    Load it only while holding the session's row lock (``locked_session``): unlocked, the
    turn "never saved" could be another process's turn that is still running.
    """
    profile = session.profile.to_engine()
    compactor = session.profile.summary_compactor()
    if not session.engine_state:
        manager = ContextManager(profile, session.workspace, system_prompt=session.system_prompt,
                                 compactor=compactor, transactional=True)
        _held[manager] = _Held({}, {}, set())
        return manager
    state = session.engine_state
    # A header (the live messages in their rows): its live order is either listed
    # ("live_ids", written before calls had rows, or when the order is not the rows')
    # or the rows' own ("live"). Without either, a state saved whole before rows.
    header = "live_ids" in state or "live" in state
    seqs: dict[str, int] = {}
    if header:
        state = _assemble_state(session, state, seqs)
    calls = _stored_calls(session, state)
    if calls.rowed:
        state = {**state, "calls": calls.entries, "answered": sorted(calls.answered)}
    manager = ContextManager.from_state(profile, session.workspace, state, compactor=compactor,
                                        transactional=True)
    # What the rows hold now: everything live when they were read, nothing for
    # a session saved whole before per-message rows (its next commit writes them).
    unrowed = set((state.get("unrowed") or {}).get("messages", {})) if header else set()
    _held[manager] = _Held({m.id: m for m in manager.messages if m.id not in unrowed} if header else {},
                           dict(manager.ledger), unrowed, seqs=seqs, calls_rowed=calls.rowed,
                           calls_made=calls.made, calls_answered=calls.answered,
                           written_ids=list(map(id, manager.messages)) if header else [])
    if manager.recovered_files:
        log.warning("session %s: cut %s back to before turn %s, whose state was never saved (the process "
                    "died before its commit)", session.pk, ", ".join(manager.recovered_files), manager.turn + 1)
    return manager


class EngineCache:
    """Engines kept in this process between requests, each valid for one committed state.

    Keyed by session; an entry holds the ``state_version`` (and the profile's
    last change) it was committed at. A request holding the session's lock that
    finds the row at that version reuses the engine instead of loading the state;
    a version moved by any process (another web process, the worker) means a
    load. An engine is taken out while a request works on it and goes back only
    once that request's transaction has committed, so a rolled-back or failed
    step never leaves a half-changed engine behind.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._engines: OrderedDict[Any, tuple[tuple[Any, ...], ContextManager]] = OrderedDict()

    @staticmethod
    def key(session: AgentSession) -> tuple[Any, ...]:
        return (session.state_version, session.profile_id, session.profile.updated, str(session.workspace))

    def take(self, session: AgentSession) -> ContextManager | None:
        with self._lock:
            entry = self._engines.pop(session.pk, None)
        if entry is None or entry[0] != self.key(session):
            return None
        entry[1].observer = None  # the previous request's listener (a run's step announcer)
        return entry[1]

    def keep(self, session: AgentSession, manager: ContextManager) -> None:
        with self._lock:
            self._engines[session.pk] = (self.key(session), manager)
            self._engines.move_to_end(session.pk)
            while len(self._engines) > self.size:
                self._engines.popitem(last=False)

    @contextlib.contextmanager
    def borrowed(self, session: AgentSession) -> Iterator[ContextManager | None]:
        """The engine of ``session``'s version, to read without the session's lock (None when
        this process holds none). Out of the cache meanwhile, so no writer changes it under
        the reader; back afterwards unless a writer has kept a newer one."""
        manager = self.take(session)
        try:
            yield manager
        finally:
            if manager is not None:
                with self._lock:
                    if session.pk not in self._engines:
                        self._engines[session.pk] = (self.key(session), manager)

    def clear(self) -> None:
        with self._lock:
            self._engines.clear()


engines = EngineCache(size=int(getattr(settings, "CONTEXTLAB_ENGINE_CACHE_SIZE", 256)))


@dataclass
class _Held:
    """What the database holds of an engine: the live message objects its rows were
    written from, the ledger entries its file rows were, and the live messages
    that have no row (kept in the state header instead)."""

    rows: dict[str, Message]
    ledger: dict[str, dict[str, Any]]
    unrowed: set[str]
    # The last turn this engine wrote: the base of the next turn's stored delta.
    last_payload: _StoredPayload | None = None
    # The message rows the last step wrote, as written (an append answers with them).
    written: dict[str, SessionMessage] = field(default_factory=dict)
    # The seq of each live message's row: the header names the live order only when
    # it is not the rows' own.
    seqs: dict[str, int] = field(default_factory=dict)
    # The identities of the live message objects at the last write, in order: a step that
    # only appended is recognised by one comparison.
    written_ids: list[int] = field(default_factory=list)
    # Whether the last step's live list was the one written before plus new messages at its end.
    appended_only: bool = False
    # The live order check of the last write: how many live messages it covered, the
    # seq of the last one with a row (0: none; None: not in seq order) and where the
    # messages without a row sat.
    ordered: tuple[int, int | None, dict[str, int]] = (0, 0, {})
    # The tool calls' rows: every call id with a row, those made (not taken back) and answered.
    calls_rowed: set[str] = field(default_factory=set)
    calls_made: set[str] = field(default_factory=set)
    calls_answered: set[str] = field(default_factory=set)


@dataclass
class _StoredPayload:
    number: int
    payload: list[dict[str, Any]]
    keyframe: int
    depth: int


_held: weakref.WeakKeyDictionary[ContextManager, _Held] = weakref.WeakKeyDictionary()


def _assemble_state(session: AgentSession, header: Mapping[str, Any], seqs: dict[str, int]) -> dict[str, Any]:
    """The engine's state from the header and the rows: what a cold load costs. ``seqs``
    gets the seq of each live message's row."""
    unrowed = header.get("unrowed") or {}
    forms: dict[str, Any] = dict(unrowed.get("messages") or {})
    fate: dict[str, Any] = dict(unrowed.get("fate") or {})
    listed = "live_ids" in header
    live_rows = SessionMessage.objects.filter(session=session)
    live_rows = (live_rows.filter(message_id__in=list(header["live_ids"])) if listed
                 else live_rows.filter(live_form__isnull=False).order_by("seq"))
    in_seq_order: list[str] = []
    for message_id, seq, events, form in live_rows.values_list("message_id", "seq", "fate", "live_form"):
        if form is not None:
            forms[message_id] = form
            fate[message_id] = events
            seqs[message_id] = seq
            in_seq_order.append(message_id)
    if listed:
        live_ids: list[str] = list(header["live_ids"])
    else:
        # The rows' order, with the messages that have no row at their places.
        live_ids = in_seq_order
        for message_id, index in sorted((header["live"].get("unrowed_at") or {}).items(), key=lambda kv: kv[1]):
            live_ids.insert(index, message_id)
    missing = [mid for mid in live_ids if mid not in forms]
    if missing:
        raise RuntimeError(f"session {session.pk}: no stored form of live message(s) {', '.join(missing[:5])}")
    messages = [forms[mid] for mid in live_ids]
    ledger = {f"{m['id']}#{block}": entry for m in messages
              for block, entry in ((m.get("metadata") or {}).get("offload") or {}).items()}
    rows = SessionMessage.objects.filter(session=session)
    ids = [*rows.values_list("message_id", flat=True), *forms]
    archived = list(rows.filter(status=SessionMessage.Status.ARCHIVED).order_by("seq")
                    .values_list("message_id", flat=True))
    state = {**header, "messages": messages, "fate": fate, "ledger": ledger, "ids": sorted(set(ids)),
             "archived_ids": archived}
    state.pop("live", None)
    return state


def stored_live_ids(session: AgentSession) -> list[str]:
    """The live message ids, in order, as the session's last commit left them (read from the
    header and, when it names no order of its own, the rows); no engine is loaded."""
    state = session.engine_state or {}
    if "live_ids" in state:
        return [str(mid) for mid in state["live_ids"]]
    if "live" not in state:  # a state saved whole, before headers
        return [str(m.get("id")) for m in state.get("messages") or [] if isinstance(m, dict)]
    live_ids = list(SessionMessage.objects.filter(session=session, live_form__isnull=False).order_by("seq")
                    .values_list("message_id", flat=True))
    for message_id, index in sorted((state["live"].get("unrowed_at") or {}).items(), key=lambda kv: kv[1]):
        live_ids.insert(index, message_id)
    return live_ids


@dataclass
class _StoredCalls:
    entries: dict[str, dict[str, Any]]
    answered: set[str]
    rowed: set[str]
    made: set[str]


def _stored_calls(session: AgentSession, state: Mapping[str, Any]) -> _StoredCalls:
    """The session's tool calls from their rows, merged over any the state still lists (a state
    written before calls had rows: its next commit gives them rows).

    A call whose message is no longer live, and is not waiting for its result, comes back
    without its arguments, as the header used to hold it: the engine reads only the live
    ones' (the row keeps them all, for the record)."""
    entries: dict[str, dict[str, Any]] = dict(state.get("calls") or {})
    answered = set(state.get("answered") or [])
    rowed: set[str] = set()
    made: set[str] = set()
    if session._state.adding:
        return _StoredCalls(entries, answered, rowed, made)
    live_calls = {block.get("id") for message in state.get("messages") or [] for block in message.get("content") or []
                  if isinstance(block, dict) and block.get("type") == "tool_use"} | set(state.get("pending_calls") or {})
    for call_id, name, arguments, raw, is_made, is_answered in (
            SessionCall.objects.filter(session=session).order_by("pk")
            .values_list("call_id", "name", "input", "raw_input", "made", "answered")):
        rowed.add(call_id)
        if is_made:
            made.add(call_id)
            keep = call_id in live_calls
            entries[call_id] = {"id": call_id, "name": name, "input": arguments if keep else {},
                                "raw_input": raw if keep else None}
        if is_answered:
            answered.add(call_id)
    return _StoredCalls(entries, answered, rowed, made)


@contextlib.contextmanager
def locked_session(session: AgentSession, *, keep: bool = True) -> Iterator[tuple[AgentSession, ContextManager]]:
    """The session row, locked until the transaction ends, and its engine (cached when current).

    ``keep=False``: the caller changes the engine without writing it (a turn it
    writes later, or never), so the engine must not go back into the cache as
    if it were the committed state; the caller keeps it itself once written."""
    with transaction.atomic():
        # The state header is read only when this process holds no current
        # engine: decoding it on every request would cost what the cache saves.
        locked = (AgentSession.objects.select_for_update(of=("self",)).select_related("profile")
                  .defer("engine_state").get(pk=session.pk))
        if locked.status == AgentSession.Status.IMPORTING:
            raise SessionUnavailable("the session is still being imported; try again when it is done",
                                     field="session")
        manager = engines.take(locked) or load_manager(locked)
        yield locked, manager
        # Reached only when the block ended normally; the key is read at commit,
        # after persist_step bumped the version.
        if keep:
            transaction.on_commit(lambda: engines.keep(locked, manager))


def fate_sizes(manager: ContextManager) -> dict[str, int]:
    # Built in C (zip, map): it runs before every step, over every message the session holds.
    return dict(zip(manager.fate.keys(), map(len, manager.fate.values()), strict=True))


def _fate_changed(manager: ContextManager, before: Mapping[str, int]) -> list[str]:
    """The ids whose fate gained events since ``before``, in the engine's order (ingest order)."""
    fate = manager.fate
    sizes = list(map(len, fate.values()))
    known = len(before)
    if (len(sizes) >= known and sizes[:known] == list(before.values())
            and list(itertools.islice(fate.keys(), known)) == list(before.keys())):
        # Nothing old changed (compared in C): only the messages ingested since.
        return list(itertools.islice(fate.keys(), known, None))
    return [mid for mid, size in zip(fate.keys(), sizes, strict=True) if size != before.get(mid)]


def _form_changed(manager: ContextManager, held: _Held) -> tuple[list[str], list[str], Mapping[str, Message]]:
    """(live messages whose object is not the one their row was written from, rowed messages
    no longer live, the live messages by id). The live list is usually the last one written
    plus new messages at its end: that is checked in C (object identities), and only the
    new tail is looked at; the others are then the very objects of ``held.rows``."""
    messages = manager.messages
    known = len(held.written_ids)
    held.appended_only = known <= len(messages) and list(map(id, messages[:known])) == held.written_ids
    if held.appended_only:
        tail = {m.id: m for m in messages[known:]}
        changed = [mid for mid, m in tail.items() if held.rows.get(mid) is not m and mid not in held.unrowed]
        return changed, [], collections.ChainMap(tail, held.rows)
    live = {m.id: m for m in messages}
    form_changed = [mid for mid, m in live.items() if held.rows.get(mid) is not m and mid not in held.unrowed]
    return form_changed, [mid for mid in held.rows if mid not in live], live


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
                   "archive_file", "archive_line", "current_content", "tokens", "live_form"]


def _persist_messages(session: AgentSession, manager: ContextManager, before: Mapping[str, int],
                      originals: Mapping[str, Message]) -> bool:
    """Write the rows of the messages this step changed: a new fate event, a new
    live form (a new message, a re-cut result), or leaving the live context.

    Keyed by message id, so persisting the same step twice updates rows instead
    of adding duplicates. The cost follows what changed, not the session's size
    (one pass over the live list compares objects, nothing is encoded). True when
    a message left the live context.
    """
    held = _held.setdefault(manager, _Held({}, {}, set()))
    # In the engine's order (ingest order), which is the order new rows get their seq in.
    fate_order = _fate_changed(manager, before)
    fate_changed = set(fate_order)
    form_changed, left, live = _form_changed(manager, held)
    touched = list(dict.fromkeys([*fate_order, *form_changed, *left]))
    if held.unrowed and not held.appended_only:
        held.unrowed &= {m.id for m in manager.messages}
    held.written = {}
    if not touched:
        held.written_ids = list(map(id, manager.messages))
        return False
    # A message ingested in this step (one fate event, no row written by this engine)
    # has no row yet: only the others are looked up, so an append reads nothing.
    maybe_rowed = [mid for mid in touched if not (mid in originals and mid not in held.rows
                                                  and len(manager.fate.get(mid) or ()) == 1)]
    existing = ({row.message_id: row for row in SessionMessage.objects.filter(session=session,
                                                                             message_id__in=maybe_rowed)}
                if maybe_rowed else {})
    new_rows: list[SessionMessage] = []
    updated: list[SessionMessage] = []
    for mid in touched:
        row = existing.get(mid)
        if row is None:
            original = originals.get(mid)
            if original is None:
                if mid in live or mid in held.unrowed:
                    held.unrowed.add(mid)  # made by the engine (a placeholder): kept in the header
                else:
                    log.warning("session %s: message %s has no ingested original; not recorded", session.pk, mid)
                continue
            session.messages_count += 1
            row = SessionMessage(session=session, message_id=mid, seq=session.messages_count, role=original.role,
                                 name=original.name or "", timestamp=original.timestamp,
                                 content=[block_to_dict(b) for b in original.content], current_content=None)
            new_rows.append(row)
        else:
            updated.append(row)
        if mid in fate_changed:
            _apply_fate(row, manager.fate[mid], live.get(mid), manager)
        message = live.get(mid)
        if message is not None:
            row.live_form = manager.message_form(message)
            if mid not in fate_changed:
                row.current_content = [block_to_dict(b) for b in message.content]
                row.tokens = manager.exact_counter.count_message(message)
            held.rows[mid] = message
            held.seqs[mid] = row.seq
        else:
            row.live_form = None
            held.rows.pop(mid, None)
            held.seqs.pop(mid, None)
    SessionMessage.objects.bulk_create(new_rows)
    if updated:
        SessionMessage.objects.bulk_update(updated, _MESSAGE_FIELDS)
    held.written = {row.message_id: row for row in [*new_rows, *updated]}
    held.written_ids = list(map(id, manager.messages))
    return bool(left)


def written_rows(manager: ContextManager, message_ids: list[str]) -> list[SessionMessage]:
    """The rows of ``message_ids`` the engine's last step wrote, in that order (skipping any it did
    not write): what an append answers with, without reading them back."""
    written = _held[manager].written if manager in _held else {}
    return [written[mid] for mid in message_ids if mid in written]


def trace_step(trace: Mapping[str, Any], name: str) -> dict[str, Any]:
    for step in trace.get("steps") or []:
        if step.get("step") == name:
            return dict(step)
    return {}


def _stored_payload(held: _Held, number: int, payload: list[dict[str, Any]]) -> Any:
    """What the turn row stores: a delta against this engine's previous turn when that is
    the turn just before and the chain is short, else the payload whole."""
    last = held.last_payload
    if last is not None and last.number == number - 1 and last.depth < payload_delta.KEYFRAME_EVERY:
        ops, carried = payload_delta.operations(last.payload, payload)
        if carried < len(payload):  # at least one message taken from the base
            held.last_payload = _StoredPayload(number, payload, last.keyframe, last.depth + 1)
            return payload_delta.encode(last.number, last.keyframe, ops)
    held.last_payload = _StoredPayload(number, payload, number, 0)
    return payload


def _persist_turn(session: AgentSession, result: TurnResult, held: _Held,
                  usage: dict[str, Any] | None = None) -> Turn:
    trace = result.trace.to_dict()
    # Converted once per turn, from the forms the engine keeps per live message.
    payload = result.openai_messages()
    number = int(trace["turn"])
    stored = _stored_payload(held, number, payload)
    gate = trace_step(trace, "gate").get("numbers") or {}
    archived = (trace_step(trace, "mark_compressed").get("numbers") or {}).get("archived") or 0
    budget = trace.get("budget") or {}
    values: dict[str, Any] = {
        "trigger": trace["trigger"],
        "outcome": trace["outcome"],
        "policy": trace["policy"],
        "trace": trace,
        "payload": stored,
        "used_tokens": int(gate.get("used", 0)) + int(gate.get("messages_tokens", 0)),
        "threshold": int(budget.get("threshold", 0)),
        "window": int(budget.get("window", 0)),
        "payload_tokens": int(trace["payload"]["tokens"]["total"]),
        "compacted_count": int(archived),
        "duration_ms": float(trace.get("duration_ms") or 0.0),
        "summary_version": int(trace["payload"].get("summary_version") or 0),
        # The profile's version now: the engine of this step was built from it
        # (the engine cache is keyed by the profile's last change).
        "profile_version": session.profile.version,
        # Known already when the provider answered first (the gateway): written
        # with the row, not by a second write of a row that holds the payload.
        **({"usage": usage} if usage is not None else {}),
    }
    if number > session.turns_count:
        # A turn past the last one committed has no row: one INSERT, no lookup.
        turn, created = Turn(session=session, number=number, **values), True
        turn.set_payload(stored, payload)
        turn.save(force_insert=True)
    else:
        # The same step persisted again (a staged turn, a replay): its row is updated.
        turn, created = Turn.objects.update_or_create(session=session, number=number, defaults=values)
        turn.set_payload(stored, payload)
    session.tokens_used = turn.payload_tokens
    if created:
        session.compactions_count += int(turn.outcome in COMPACTION_OUTCOMES)
        session.failures_count += int(turn.outcome in FAILURE_OUTCOMES)
    return turn


def _persist_summaries(session: AgentSession, manager: ContextManager) -> bool:
    """Write the summary versions the step added; True when there were any."""
    if manager.summary_version == session.summary_version:
        return False
    known = set(SummaryVersion.objects.filter(session=session).values_list("version", flat=True))
    SummaryVersion.objects.bulk_create([
        SummaryVersion(session=session, version=s.version, text=s.text, turn=s.turn, trigger=s.trigger,
                       compactor=s.compactor, fallback=s.fallback, compacted_ids=s.compacted_ids,
                       created=parse_datetime(s.created_at.replace("Z", "+00:00")) or timezone.now())
        for s in manager.summaries if s.version not in known
    ])
    return True


def _persist_offloaded(session: AgentSession, manager: ContextManager, *, left_live: bool) -> None:
    held = _held.setdefault(manager, _Held({}, {}, set()))
    changed = any(held.ledger.get(key) is not entry for key, entry in manager.ledger.items())
    # A message leaving the context may leave its files unreferenced; otherwise
    # nothing of the file rows can have changed.
    if not manager.ledger or not (changed or left_live):
        return
    held.ledger = dict(manager.ledger)
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


def _live_order(manager: ContextManager, held: _Held) -> dict[str, int] | None:
    """Where the live messages without a row sit, when every other live message is in its
    row's seq order (a load reads them back in that order); None when they are not.

    After a step that only appended, only the new messages are looked at."""
    messages = manager.messages
    count, last, unrowed_at = held.ordered
    if not (held.appended_only and last is not None and count <= len(messages)):
        count, last, unrowed_at = 0, 0, {}
    unrowed_at = dict(unrowed_at)
    for index in range(count, len(messages)):
        message = messages[index]
        if message.id in held.unrowed:
            unrowed_at[message.id] = index
            continue
        seq = held.seqs.get(message.id)
        if seq is None or last is None or seq <= last:
            last = None
            break
        last = seq
    held.ordered = (len(messages), last, unrowed_at)
    return unrowed_at if last is not None else None


def _persist_calls(session: AgentSession, manager: ContextManager, held: _Held) -> None:
    """Write the tool calls this step added, took back or answered: one row per call id,
    so a commit's cost follows the step's calls, not every call the session ever saw."""
    seen = manager.calls_seen()
    answered = manager.answered_call_ids()
    made = seen.keys() - held.calls_made
    taken_back = held.calls_made - seen.keys()
    newly_answered = answered - held.calls_answered
    if not (made or taken_back or newly_answered):
        return
    new_rows = [SessionCall(session=session, call_id=call_id, name=seen[call_id].name, input=seen[call_id].input,
                            raw_input=seen[call_id].raw_input, made=True, answered=call_id in answered)
                for call_id in sorted(made - held.calls_rowed)]
    # A result whose call the engine does not hold (its message was taken back).
    new_rows += [SessionCall(session=session, call_id=call_id, name="", input={}, made=False, answered=True)
                 for call_id in sorted(newly_answered - seen.keys() - held.calls_rowed)]
    SessionCall.objects.bulk_create(new_rows)
    inserted = {row.call_id for row in new_rows}
    for call_id in sorted(made & held.calls_rowed):  # taken back earlier, made again under the same id
        call = seen[call_id]
        SessionCall.objects.filter(session=session, call_id=call_id).update(
            name=call.name, input=call.input, raw_input=call.raw_input, made=True)
    if taken_back:
        SessionCall.objects.filter(session=session, call_id__in=sorted(taken_back)).update(made=False)
    answered_rows = sorted((newly_answered & held.calls_rowed) - inserted)
    if answered_rows:
        SessionCall.objects.filter(session=session, call_id__in=answered_rows).update(answered=True)
    held.calls_rowed |= inserted
    held.calls_made |= made
    held.calls_made -= taken_back
    held.calls_answered |= newly_answered


# What ``persist_step`` (and its callers, under the same lock) change on the session row.
_SESSION_FIELDS = ["engine_state", "summary", "summary_version", "turns_count", "live_count", "messages_count",
                   "tokens_used", "tokens_threshold", "tokens_window", "compactions_count", "failures_count",
                   "last_activity", "state_version", "system_prompt", "summary_call_until", "live_view"]


def persist_step(session: AgentSession, manager: ContextManager, *, before: Mapping[str, int],
             originals: Mapping[str, Message] | None = None, result: TurnResult | None = None,
             usage: dict[str, Any] | None = None) -> Turn | None:
    """Write what one engine step changed: messages, turn, summaries, files, and the
    state header (never the live context as a whole)."""
    held = _held.setdefault(manager, _Held({}, {}, set()))
    left_live = _persist_messages(session, manager, before, originals or {})
    turn = _persist_turn(session, result, held, usage) if result is not None else None
    new_summary = _persist_summaries(session, manager)
    _persist_offloaded(session, manager, left_live=left_live)
    if new_summary:
        # Only a new summary version has a loss at compaction to check (a query saved on every other step).
        loss_records.record(session)
    _persist_calls(session, manager, held)
    profile = manager.profile
    # The header does not grow with the session: the calls are in their rows, and the
    # live order is the rows' seq order (only the places of messages without a row are
    # named), except after a step that reordered them (then the ids are listed).
    header = manager.export_header()
    live_order = _live_order(manager, held)
    if live_order is None:
        header["live_ids"] = manager.live_ids()
    else:
        header["live"] = {"unrowed_at": live_order}
    if held.unrowed:
        # Found by their places when the order check has them (no pass over the live list).
        live = ({mid: manager.messages[index] for mid, index in live_order.items()} if live_order is not None
                else {m.id: m for m in manager.messages})
        header["unrowed"] = {"messages": {mid: manager.message_form(live[mid]) for mid in held.unrowed},
                             "fate": {mid: manager.fate.get(mid, []) for mid in held.unrowed}}
    # The view this step starts from, while it still describes the committed state.
    previous = current_live_view(session)
    session.engine_state = header
    session.summary = manager.summary or ""
    session.summary_version = manager.summary_version
    session.turns_count = manager.turn
    session.live_count = len(manager.messages)
    session.tokens_threshold = profile.threshold
    session.tokens_window = profile.max_input_length
    session.last_activity = timezone.now()
    session.state_version += 1
    session.live_view = live_view_of(session, manager, turn, previous=previous, unrowed=held.unrowed)
    # Only the columns a step changes: the row's other columns (its import source,
    # title, status) are neither re-encoded nor written back on every turn.
    session.save(update_fields=None if session._state.adding else _SESSION_FIELDS)
    # The archive journal goes only once the database holds the state its lines
    # belong to; robust, because a journal left behind is harmless (the next load
    # sees its turn was saved and clears it) and must not turn a commit into an error.
    transaction.on_commit(manager.commit, robust=True)
    if turn is not None and telemetry.tracer() is not None:
        # After the commit, under whatever span is current now (a gateway call's).
        parent, trace_dict, session_id = telemetry.current_context(), turn.trace, session.pk
        transaction.on_commit(lambda: telemetry.record_turn(trace_dict, session_id=session_id, parent=parent))
    state = live_state_of(session, manager, turn, session.live_view)
    transaction.on_commit(lambda: session_announce(session_id=session.pk, state=state))
    return turn


