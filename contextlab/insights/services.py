"""What the insight pages and the recall endpoint read, and the three things they do.

Reading: a workspace's long-term memory (``MEMORY.md``, the daily notes, the
backups and the change each consolidation made), the working memory and
operation history of a session's ingested messages, the stale reads the engine
recorded in the messages' fate, and the eviction plans in the turns' traces.

Doing: consolidating memory now (``memory_consolidate_session`` and
``memory_consolidate_profile``), replaying a session under every policy
(``compare_run``, cached as ``compare/result.json`` in the workspace) and
searching the workspace, optionally injecting the hits as a recollection
(``recall_search``, ``recall_inject``).

Where memory lives: the web app runs every session's engine with its default
memory workspace, the session workspace (``contextlab.sessions.services``
builds ``ContextManager`` without ``memory_workspace``), and the nightly job
consolidates each session workspace. So a profile's memory is the memory of its
sessions; the profile page lists them. A folder
``WORKSPACES_DIR/profiles/<profile id>/`` is shown as the agent-wide memory
when something (an agent, a future setting) writes one there; nothing here
creates it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from contextlab.engine.convert import to_openai
from contextlab.engine.core.errors import ContextLabError, MalformedInput
from contextlab.engine.core.messages import Message
from contextlab.engine.core.profile import Profile
from contextlab.engine.memory.long_term import (
    DAILY_DIR,
    LESSONS,
    MEMORY_FILE,
    PREFERENCES,
    ConsolidationResult,
    consolidate,
    memory_history,
    normalise,
    split_sections,
)
from contextlab.engine.memory.retrieval import Hit, recollection_message, search_workspace, terms
from contextlab.engine.memory.working import (
    Operation,
    OperationHistory,
    Subtask,
    WorkingMemory,
    extract_working_memory,
)
from contextlab.engine.replay.compare import compare_policies
from contextlab.lib import textsafe
from contextlab.sessions import services as session_services
from contextlab.sessions.models import AgentProfile, AgentSession, SessionMessage, Turn
from contextlab.sessions.services.persistence import stored_live_ids

# A MEMORY.md or note larger than this is shown cut (the engine bounds its own
# sections, but an agent may keep anything else in the file).
MAX_SHOWN_CHARS = 100_000
_BULLET = re.compile(r"^\s*[-*+]\s+\S")


# -- messages ------------------------------------------------------------------------------


def session_messages(session: AgentSession) -> list[Message]:
    """Every message the session ingested, as ingested (before any truncation), in order."""
    rows = session.messages.order_by("seq").values_list("message_id", "role", "name", "timestamp", "content")
    return [Message.from_dict({"id": mid, "role": role, "name": name or None, "timestamp": stamp,
                               "content": content})
            for mid, role, name, stamp, content in rows]


def message_seqs(session: AgentSession, ids: Iterable[str] | None = None) -> dict[str, int]:
    """Message id -> seq (what the message page's URL takes)."""
    qs = SessionMessage.objects.filter(session=session)
    if ids is not None:
        qs = qs.filter(message_id__in=list(set(ids)))
    return dict(qs.values_list("message_id", "seq"))


def live_message_ids(session: AgentSession) -> set[str]:
    """The ids in the live context now, as the engine's saved state holds them.

    The state is the authority: an evicted message can be gone from the
    context while its row still says "live" (the row's status follows
    compaction only).
    """
    return set(stored_live_ids(session))


# -- long-term memory ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryFile:
    relative: str  # to the memory workspace
    text: str
    truncated: bool
    modified: dt.datetime
    preferences: int
    lessons: int


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "file", "hunk", "add", "del" or "ctx"
    text: str
    old: int | None = None
    new: int | None = None


@dataclass(frozen=True)
class MemoryChange:
    """One change of MEMORY.md between two kept versions (a consolidation, as a rule)."""

    at: dt.datetime | None  # when the backup of the "before" version was taken
    before: str
    after: str
    lines: list[DiffLine]
    added: int
    removed: int


@dataclass(frozen=True)
class MemoryVersion:
    label: str
    taken_at: dt.datetime | None
    file: MemoryFile


@dataclass
class MemorySnapshot:
    workspace: Path
    memory: MemoryFile | None
    notes: list[MemoryFile]  # newest first
    versions: list[MemoryVersion]  # backups oldest first, then the current file
    changes: list[MemoryChange]  # newest first

    @property
    def empty(self) -> bool:
        return self.memory is None and not self.notes and not self.versions

    @property
    def backup_count(self) -> int:
        return sum(1 for v in self.versions if v.taken_at is not None)

    @property
    def last_consolidation(self) -> dt.datetime | None:
        return next((c.at for c in self.changes if c.at is not None), None)


def _count_items(text: str) -> tuple[int, int]:
    """(preferences, lessons) bullets of a memory file."""
    counts = {PREFERENCES: 0, LESSONS: 0}
    for name, body in split_sections(text)[1]:
        if name in counts:
            counts[name] += sum(1 for line in body if _BULLET.match(line))
    return counts[PREFERENCES], counts[LESSONS]


def read_memory_file(root: Path, path: Path) -> MemoryFile:
    raw = path.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    truncated = len(text) > MAX_SHOWN_CHARS
    preferences, lessons = _count_items(text)
    modified = dt.datetime.fromtimestamp(path.stat().st_mtime, tz=dt.UTC)
    return MemoryFile(relative=path.relative_to(root).as_posix(),
                      text=textsafe.clean(text[:MAX_SHOWN_CHARS] if truncated else text),
                      truncated=truncated, modified=modified, preferences=preferences, lessons=lessons)


def diff_lines(diff: str) -> list[DiffLine]:
    """A unified diff as rows with their old and new line numbers, for colouring."""
    rows: list[DiffLine] = []
    old = new = 0
    for line in diff.splitlines():
        if line.startswith(("--- ", "+++ ")):
            rows.append(DiffLine("file", line))
        elif line.startswith("@@"):
            match = re.match(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@", line)
            if match:
                old, new = int(match.group(1)), int(match.group(2))
            rows.append(DiffLine("hunk", line))
        elif line.startswith("+"):
            rows.append(DiffLine("add", line[1:], None, new))
            new += 1
        elif line.startswith("-"):
            rows.append(DiffLine("del", line[1:], old, None))
            old += 1
        else:
            rows.append(DiffLine("ctx", line[1:] if line.startswith(" ") else line, old, new))
            old += 1
            new += 1
    return rows


def unified_diff(before: str, after: str, *, before_label: str, after_label: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"MEMORY.md ({before_label})", tofile=f"MEMORY.md ({after_label})"))


def _change(before: str, after: str, *, at: dt.datetime | None, before_label: str, after_label: str) -> MemoryChange:
    lines = diff_lines(unified_diff(before, after, before_label=before_label, after_label=after_label))
    return MemoryChange(at=at, before=before_label, after=after_label, lines=lines,
                        added=sum(1 for r in lines if r.kind == "add"),
                        removed=sum(1 for r in lines if r.kind == "del"))


def memory_snapshot(workspace: Path) -> MemorySnapshot:
    """MEMORY.md, the daily notes, the backups, and what changed between kept versions.

    The engine keeps no log of consolidations, only a backup of MEMORY.md
    taken just before each one that changed it; so consolidation N's change is
    backup N against the next backup (or the current file). The oldest version
    is compared with no file at all: when it was written is not recorded.
    """
    root = Path(workspace)
    memory_path = root / MEMORY_FILE
    memory = read_memory_file(root, memory_path) if memory_path.is_file() else None
    notes_dir = root / DAILY_DIR
    notes = [read_memory_file(root, p) for p in sorted(notes_dir.glob("*.md"), reverse=True) if p.is_file()] \
        if notes_dir.is_dir() else []
    versions = [MemoryVersion(f"backup {b.path.name}", b.taken_at, read_memory_file(root, b.path))
                for b in memory_history(root)]
    if memory is not None:
        versions.append(MemoryVersion("current", None, memory))
    changes: list[MemoryChange] = []
    if versions:
        changes.append(_change("", versions[0].file.text, at=None, before_label="no file",
                               after_label="oldest kept version"))
    for index, version in enumerate(versions[:-1]):
        after = versions[index + 1]
        if version.taken_at is None or after.file.text == version.file.text:
            continue
        changes.append(_change(version.file.text, after.file.text, at=version.taken_at,
                               before_label=version.label, after_label=after.label))
    changes.reverse()
    return MemorySnapshot(workspace=root, memory=memory, notes=notes, versions=versions, changes=changes)


def profile_local_now(profile: AgentProfile, now: dt.datetime | None = None) -> dt.datetime:
    """Now in the profile's time zone: the nightly job names days and backups in it too."""
    return (now or timezone.now()).astimezone(session_services.profile_zone(profile.timezone))


@dataclass(frozen=True)
class Consolidated:
    result: ConsolidationResult
    at: dt.datetime
    lines: list[DiffLine]
    backup: str | None  # relative to the workspace


def memory_consolidate_session(*, session: AgentSession, now: dt.datetime | None = None) -> Consolidated:
    """"Consolidate now" for one session: merge its recent daily notes into its MEMORY.md.

    The same merge as the nightly job (the engine backs the old file up
    first), up to and including today in the profile's time zone. Holding the
    session's row lock keeps it from interleaving with a hook run of the same
    session, which may be writing today's note.
    """
    if session.status == AgentSession.Status.IMPORTING:
        raise session_services.SessionUnavailable(
            "the session is still being imported; consolidate when it is done", field="session")
    local = profile_local_now(session.profile, now)
    with transaction.atomic():
        list(AgentSession.objects.select_for_update().filter(pk=session.pk).values_list("pk", flat=True))
        result = consolidate(session.workspace, days=settings.CONTEXTLAB_MEMORY_DAYS, today=local.date(), now=local)
    backup = result.backup_path.relative_to(session.workspace).as_posix() if result.backup_path else None
    return Consolidated(result=result, at=local, lines=diff_lines(result.diff), backup=backup)


@dataclass(frozen=True)
class ProfileConsolidation:
    session: AgentSession
    lines: list[DiffLine]
    added: list[str]
    removed: list[str]
    backup: str | None


def memory_consolidate_profile(*, profile: AgentProfile,
                               now: dt.datetime | None = None) -> tuple[dt.datetime, list[ProfileConsolidation]]:
    """"Consolidate now" for every session of a profile, as the nightly job does, up to today."""
    local = profile_local_now(profile, now)
    changed = session_services.memory_consolidate(profile=profile, day=local.date(), now=local)
    sessions = AgentSession.objects.in_bulk([c.session_id for c in changed])
    out = [ProfileConsolidation(session=sessions[uuid.UUID(c.session_id)], lines=diff_lines(c.diff),
                                added=c.added, removed=c.removed, backup=c.backup)
           for c in changed if uuid.UUID(c.session_id) in sessions]
    return local, out


@dataclass(frozen=True)
class SessionMemoryRow:
    session: AgentSession
    memory: MemoryFile | None
    notes: int
    latest_note: str | None
    backups: int
    last_backup: dt.datetime | None


def session_memory_rows(sessions: Iterable[AgentSession]) -> list[SessionMemoryRow]:
    """One line of memory facts per session, for the profile page (reads a few files per session)."""
    rows: list[SessionMemoryRow] = []
    for session in sessions:
        root = session.workspace
        memory_path = root / MEMORY_FILE
        notes = sorted((root / DAILY_DIR).glob("*.md")) if (root / DAILY_DIR).is_dir() else []
        history = memory_history(root)
        rows.append(SessionMemoryRow(
            session=session, memory=read_memory_file(root, memory_path) if memory_path.is_file() else None,
            notes=len(notes), latest_note=notes[-1].stem if notes else None, backups=len(history),
            last_backup=history[-1].taken_at if history else None))
    return rows


@dataclass(frozen=True)
class RememberedItem:
    text: str
    sessions: int  # how many of the sessions keep it


_STAMPED_BULLET = re.compile(r"^\s*[-*+]\s+(?:\[[^\]]{4,20}\]\s*)?(.*\S)\s*$")


def merged_memory(rows: Sequence[SessionMemoryRow]) -> dict[str, list[RememberedItem]]:
    """The preferences and lessons the sessions' MEMORY.md files hold, each once, most shared first."""
    merged: dict[str, dict[str, tuple[str, int]]] = {PREFERENCES: {}, LESSONS: {}}
    for row in rows:
        if row.memory is None:
            continue
        seen: set[tuple[str, str]] = set()
        for name, body in split_sections(row.memory.text)[1]:
            if name not in merged:
                continue
            for line in body:
                match = _STAMPED_BULLET.match(line)
                if not match:
                    continue
                key = normalise(match.group(1))
                if not key or (name, key) in seen:
                    continue
                seen.add((name, key))
                text, count = merged[name].get(key, (match.group(1), 0))
                merged[name][key] = (text, count + 1)
    return {name: sorted((RememberedItem(text, count) for text, count in items.values()),
                         key=lambda item: -item.sessions)
            for name, items in merged.items()}


def agent_workspace(profile: AgentProfile) -> Path:
    """The agent-wide memory folder of a profile (see the module docstring)."""
    return Path(settings.WORKSPACES_DIR) / "profiles" / str(profile.pk)


# -- working memory and operations ------------------------------------------------------------


@dataclass(frozen=True)
class SubtaskRow:
    subtask: Subtask
    ok: int
    failed: int
    pending: int


@dataclass
class OperationsView:
    memory: WorkingMemory
    operations: list[Operation]
    subtasks: list[SubtaskRow]
    failures: int
    seqs: dict[str, int] = field(default_factory=dict)


def operations_for(session: AgentSession) -> OperationsView:
    """Goal, constraints and subtasks, and every tool call with its outcome, from the ingested messages."""
    messages = session_messages(session)
    memory = extract_working_memory(messages)
    history = OperationHistory.from_messages(messages)
    counts: dict[str, list[int]] = {}
    for op in history.operations:
        slot = counts.setdefault(op.subtask or "", [0, 0, 0])
        slot[0 if op.ok else 2 if op.ok is None else 1] += 1
    subtasks = [SubtaskRow(s, *counts.get(s.title, [0, 0, 0])) for s in memory.subtasks]
    return OperationsView(memory=memory, operations=history.operations, subtasks=subtasks,
                          failures=len(history.failures()), seqs=message_seqs(session))


def filter_operations(operations: Sequence[Operation], *, status: str = "", subtask: str = "") -> list[Operation]:
    out = list(operations)
    if status in ("ok", "failed", "pending"):
        out = [op for op in out if op.status == status]
    if subtask:
        out = [op for op in out if op.subtask == subtask]
    return out


# -- stale reads --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StaleRow:
    path: str
    read_id: str
    read_seq: int
    read_tool: str
    written_by: str
    write_seq: int | None
    write_tool: str
    before_turn: int | None
    live: bool


def stale_reads_for(session: AgentSession) -> list[StaleRow]:
    """Every read the engine flagged as stale while the session ran (its fate has a "stale" event)."""
    seqs: dict[str, int] = {}
    found: list[tuple[int, str, dict[str, Any]]] = []
    for seq, message_id, fate in session.messages.order_by("seq").values_list("seq", "message_id", "fate"):
        seqs[message_id] = seq
        for event in fate or []:
            if isinstance(event, dict) and event.get("event") == "stale":
                found.append((seq, message_id, event))
    live = live_message_ids(session)
    # The event names the writing tool only; the reading tool is the read result's own name.
    read_tools: dict[str, str] = {}
    for message_id, content in session.messages.filter(
            message_id__in={m for _, m, _ in found}).values_list("message_id", "content"):
        read_tools[message_id] = next((str(b.get("name") or "") for b in content or []
                                       if isinstance(b, dict) and b.get("type") == "tool_result"), "")
    rows: list[StaleRow] = []
    for seq, message_id, event in found:
        written_by = str(event.get("written_by") or "")
        turn = event.get("before_turn")
        rows.append(StaleRow(path=str(event.get("path") or ""), read_id=message_id, read_seq=seq,
                             read_tool=str(event.get("read_tool") or read_tools.get(message_id, "")), written_by=written_by,
                             write_seq=seqs.get(written_by), write_tool=str(event.get("write_tool") or ""),
                             before_turn=turn if isinstance(turn, int) else None, live=message_id in live))
    return rows


# -- eviction plans -----------------------------------------------------------------------------


def eviction_step(trace: dict[str, Any]) -> dict[str, Any] | None:
    for step in trace.get("steps") or []:
        if isinstance(step, dict) and step.get("step") == "eviction":
            return step
    return None


@dataclass
class PlanView:
    turn: int
    outcome: str
    strategy: str
    weights: dict[str, Any]
    numbers: dict[str, Any]
    notes: list[str]
    counts: dict[str, int]
    evicted: list[dict[str, Any]]
    kept: list[dict[str, Any]]


def plan_view(turn_number: int, trace: dict[str, Any], seqs: dict[str, int] | None = None) -> PlanView | None:
    """The ``eviction`` step's plan of one turn: every unit with its score, action and reason.

    Score parts (relevance, recency, density) are shown when the plan carries
    them (``score_parts`` on an action); the plan of this engine version names
    them in words in the reason instead.
    """
    step = eviction_step(trace)
    plan = ((step or {}).get("details") or {}).get("plan")
    if step is None or not isinstance(plan, dict):
        return None
    evicted: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    for action in plan.get("actions") or []:
        if not isinstance(action, dict):
            continue
        ids = [str(i) for i in action.get("message_ids") or []]
        row = {**action, "parts": action.get("score_parts") or {}, "label": textsafe.clean(str(action.get("label", ""))),
               "reason": textsafe.clean(str(action.get("reason", ""))),
               "seq": (seqs or {}).get(ids[0]) if ids else None, "message_count": len(ids)}
        (kept if action.get("action") == "keep" else evicted).append(row)
    return PlanView(turn=turn_number, outcome=str(trace.get("outcome", "")), strategy=str(plan.get("strategy", "")),
                    weights=dict((step.get("inputs") or {}).get("weights") or {}),
                    numbers={k: plan.get(k) for k in ("tokens_before", "tokens_after_estimate", "soft_limit",
                                                       "hard_limit", "target", "cutoff", "fits_hard_limit")},
                    notes=[str(n) for n in plan.get("notes") or []], counts=dict(plan.get("counts") or {}),
                    evicted=evicted, kept=kept)


def eviction_turns(session: AgentSession) -> QuerySet[Turn]:
    """The session's turns that ran the eviction policy's plan (newest last)."""
    return session.turns.filter(policy="eviction", outcome="evicted").defer("payload").order_by("number")


def plan_views(turns: Iterable[Turn], seqs: dict[str, int]) -> list[PlanView]:
    return [view for turn in turns if (view := plan_view(turn.number, turn.trace, seqs)) is not None]


# -- policy comparison ----------------------------------------------------------------------------

COMPARE_DIR = "compare"
RESULT_FILE = "result.json"
RESULT_FORMAT = "contextlab.insights.compare/1"
# Five replays of the whole session run inside the request; past this size the
# page points to ``contextlab compare``, which runs them outside the server.
MAX_COMPARE_MESSAGES = 5_000
EXAMPLES_PER_ACTION = 3
POLICY_LABELS = {
    "contextlab": "contextlab (summary + archive)",
    "copaw": "copaw (CoPaw 1.0.2's behaviour)",
    "lowest_score_first": "eviction · lowest score first",
    "sliding_window": "eviction · sliding window",
    "hierarchical_quota": "eviction · hierarchical quota",
}


class CompareTooLarge(MalformedInput):
    """The session has too many messages to replay five times inside a request."""


def compare_profile(session: AgentSession, window: int | None = None) -> Profile:
    """The session's profile for the replays, with the offline compactor.

    The extractive compactor keeps a comparison free (no model calls, no key
    needed) and repeatable; the decisions of when and what to compact do not
    depend on who writes the summary.
    """
    changes: dict[str, Any] = {"compactor": "extractive"}
    if window:
        changes["max_input_length"] = window
    return session.profile.to_engine().replace(**changes)


def _fingerprint(profile: Profile, messages: int) -> str:
    knobs = {f.name: getattr(profile, f.name) for f in dataclasses.fields(profile) if f.name not in ("name", "extra")}
    raw = json.dumps({"knobs": knobs, "messages": messages}, sort_keys=True)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:16]


def compare_cached(session: AgentSession) -> dict[str, Any] | None:
    """The last comparison of this session, with ``outdated`` set when the session or its profile changed since."""
    path = session.workspace / COMPARE_DIR / RESULT_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != RESULT_FORMAT:
        return None
    try:
        current = _fingerprint(compare_profile(session, data.get("window_override") or None), session.messages_count)
    except ContextLabError:  # the profile was edited into something the engine refuses
        current = ""
    data["outdated"] = current != data.get("fingerprint")
    return data


def _examples(trace: dict[str, Any], examples: dict[str, list[dict[str, Any]]]) -> None:
    """The first few removals of each kind in one turn's trace, with their reasons."""
    turn = trace.get("turn")
    for step in trace.get("steps") or []:
        name, status = step.get("step"), step.get("status")
        if status != "fired":
            continue
        if name == "mark_compressed":
            bucket = examples.setdefault("summarized", [])
            if len(bucket) < EXAMPLES_PER_ACTION:
                bucket.append({"turn": turn, "messages": (step.get("numbers") or {}).get("archived"),
                               "tokens": None, "reason": textsafe.clean(str(step.get("outcome", "")))})
        elif name == "eviction":
            for record in (step.get("details") or {}).get("records") or []:
                bucket = examples.setdefault(str(record.get("action")), [])
                if len(bucket) < EXAMPLES_PER_ACTION:
                    bucket.append({"turn": turn, "messages": len(record.get("message_ids") or []),
                                   "tokens": record.get("tokens"), "reason": textsafe.clean(str(record.get("reason", "")))})
    for loss in trace.get("copaw_losses") or []:
        bucket = examples.setdefault("lost", [])
        if len(bucket) < EXAMPLES_PER_ACTION:
            bucket.append({"turn": turn, "messages": None, "tokens": None,
                           "reason": textsafe.clean(f"{loss.get('title', '')}: {loss.get('detail', '')}")})


def _plans(trace: dict[str, Any]) -> dict[str, Any] | None:
    view = plan_view(int(trace.get("turn") or 0), trace)
    if view is None:
        return None
    return {"turn": view.turn, "strategy": view.strategy, "counts": view.counts, "numbers": view.numbers,
            "evicted": [{k: a.get(k) for k in ("label", "unit_type", "layer", "tokens", "score", "parts", "action",
                                               "reason", "mode")} for a in view.evicted]}


def transcript_for(session: AgentSession) -> list[dict[str, Any]]:
    """The session's ingested messages as an OpenAI chat transcript, system prompt first.

    ``load_transcript`` does not read the engine's own message dicts
    (``Message.to_dict``), so the replays get OpenAI messages, which it does
    read; ``is_error`` flags are not carried (OpenAI has no field for them).
    """
    head = [{"role": "system", "content": session.system_prompt}] if session.system_prompt else []
    return head + to_openai(session_messages(session))


def compare_run(*, session: AgentSession, window: int | None = None) -> dict[str, Any]:
    """Replay the session under every policy and cache the comparison in ``compare/result.json``.

    The replays run in a scratch folder under ``compare/`` that is removed
    afterwards: only the result (a few KB) stays, so exports and backups of
    the workspace do not carry five copies of the session.
    """
    if session.messages_count > MAX_COMPARE_MESSAGES:
        raise CompareTooLarge(
            f"the session has {session.messages_count:,} messages; comparisons run here up to "
            f"{MAX_COMPARE_MESSAGES:,}. Export it and run `contextlab compare` on the transcript instead.",
            field="session")
    if not session.messages_count:
        raise MalformedInput("the session has no messages to replay yet", field="session")
    profile = compare_profile(session, window)
    root = session.workspace / COMPARE_DIR
    scratch = root / f"run-{uuid.uuid4().hex[:12]}"
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        transcript = scratch / "transcript.json"
        transcript.write_text(json.dumps(transcript_for(session), ensure_ascii=False), encoding="utf-8")
        results = compare_policies(transcript, scratch / "out", profile=profile)
        policies: list[dict[str, Any]] = []
        for result in results:
            examples: dict[str, list[dict[str, Any]]] = {}
            plans: list[dict[str, Any]] = []
            trace_file = scratch / "out" / result.name / "trace.jsonl"
            for line in trace_file.read_bytes().decode("utf-8").splitlines():
                trace = json.loads(line)
                _examples(trace, examples)
                plan = _plans(trace)
                if plan is not None:
                    plans.append(plan)
            policies.append({**result.to_dict(), "label": POLICY_LABELS.get(result.name, result.name),
                             "peak": max(result.tokens, default=0),
                             "final": result.tokens[-1] if result.tokens else 0,
                             "examples_by_action": examples, "plans": plans})
        data = {"format": RESULT_FORMAT, "created": timezone.now().isoformat(), "messages": session.messages_count,
                "window": profile.max_input_length, "threshold": profile.threshold, "reserve": profile.reserve,
                "window_override": window or None, "profile": session.profile.name,
                "fingerprint": _fingerprint(profile, session.messages_count), "policies": policies}
        tmp = root / f"{RESULT_FILE}.{scratch.name}.tmp"
        tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, root / RESULT_FILE)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    data["outdated"] = False
    return data


# -- retrieval ------------------------------------------------------------------------------------

MAX_QUERY_CHARS = 1_000
MAX_RECALL_LIMIT = 50


@dataclass(frozen=True)
class HitRow:
    hit: Hit
    file: str
    line: int | None
    seq: int | None
    snippet: str
    segments: list[tuple[str, bool]] = field(default_factory=list)


def highlight(text: str, query: str) -> list[tuple[str, bool]]:
    """``text`` cut into (piece, is a query word) so a template can mark the words it
    matched while escaping every piece like any other text."""
    words = sorted({w for w in {query.strip().lower(), *terms(query)} if len(w) >= 2}, key=len, reverse=True)
    if not words:
        return [(text, False)]
    pattern = re.compile("|".join(re.escape(w) for w in words), re.IGNORECASE)
    out: list[tuple[str, bool]] = []
    position = 0
    for match in pattern.finditer(text):
        if match.start() > position:
            out.append((text[position:match.start()], False))
        out.append((match.group(0), True))
        position = match.end()
    if position < len(text):
        out.append((text[position:], False))
    return out


def split_location(location: str) -> tuple[str, int | None]:
    """``dialog/2026-03-20.jsonl:12`` -> (``dialog/2026-03-20.jsonl``, 12); no line -> None."""
    head, sep, tail = location.rpartition(":")
    if sep and tail.isdigit():
        return head, int(tail)
    return location, None


def recall_search(*, session: AgentSession, query: str, limit: int = 20) -> list[Hit]:
    """The archive, externalized units, offloaded outputs and memory notes of the session, ranked."""
    query = query.strip()
    if not query:
        return []
    return search_workspace(session.workspace, query[:MAX_QUERY_CHARS], limit=max(1, min(limit, MAX_RECALL_LIMIT)))


def hit_rows(session: AgentSession, hits: Sequence[Hit], query: str = "") -> list[HitRow]:
    seqs = message_seqs(session, [h.message_id for h in hits if h.message_id])
    rows: list[HitRow] = []
    for hit in hits:
        file, line = split_location(hit.location)
        snippet = textsafe.clean(hit.snippet)
        rows.append(HitRow(hit=hit, file=file, line=line, seq=seqs.get(hit.message_id or ""), snippet=snippet,
                           segments=highlight(snippet, query) if query else [(snippet, False)]))
    return rows


def recall_inject(*, session: AgentSession, hits: Sequence[Hit], query: str) -> SessionMessage:
    """Append the hits to the session as one recollection message (user role, named "recollection").

    It goes through the ordinary ingest service as an OpenAI message, so it
    is validated, counted and recorded like any other; the engine keeps it
    apart from the person's requests by its name.
    """
    message = recollection_message(list(hits), query=query)
    rows = session_services.messages_append_openai(session=session, messages=to_openai([message]))
    return rows[0]
