"""Sessions of agents whose context ContextLab does not manage, built from what the agent sent.

The observe inference (``contextlab.engine.observe.inference``) compares each request of a
conversation with the previous one; this writes its findings as the same rows a
managed session has, so the decision flow, the truncation ledger, the message
fate, the payload view, the summary diff and search draw them unchanged: one
``Turn`` per agent request (its trace and the exact request), one
``SummaryVersion`` per summary the agent inserted, one ``SessionMessage`` per
message it ever sent, with where it ended.

A session is rebuilt whole from its requests (``observed_session_write``): the
requests are the record, the rows are derived, and rebuilding keeps them
consistent however the requests came (an import, or the gateway in observe mode).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Count, Max
from django.utils import timezone

from contextlab.engine.convert.openai import from_openai
from contextlab.engine.core.errors import ContextLabError, MalformedInput
from contextlab.engine.core.messages import block_to_dict
from contextlab.engine.core.tokens import TiktokenCounter
from contextlab.engine.importers.copaw_workspace import (
    MAX_MEMBERS,
    REPORT_KEYS,
    REQUEST_MARKERS,
    WORKSPACE_MARKERS,
    CopawWorkspace,
    UnpackBudget,
    analyse,
    opened_folder,
    read_request_folder,
    read_workspace,
)
from contextlab.engine.memory.long_term import DAILY_DIR, MEMORY_FILE
from contextlab.engine.observe.inference import Conversation, Observer, RecordedRequest, message_keys, text_of
from contextlab.sessions.models import (
    PROFILE_KNOBS,
    AgentProfile,
    AgentSession,
    OffloadedFile,
    SessionMessage,
    SummaryVersion,
    Turn,
)
from contextlab.sessions.services.inputs import MAX_TITLE_LENGTH, upload_budget
from contextlab.sessions.services.profiles import profile_observed

OBSERVED_POLICY = "observed"


def observe(requests: list[RecordedRequest]) -> Observer:
    observer = Observer(counter=TiktokenCounter())
    for request in requests:
        observer.observe(request)
    return observer


def main_conversation(observer: Observer) -> Conversation | None:
    """The conversation with the most agent requests (side calls are part of it)."""
    agents = [c for c in observer.conversations.values() if c.requests]
    return max(agents, key=lambda c: len(c.requests)) if agents else None


class Parsed:
    """What ``_write`` derives from each request and that never changes once the request is
    recorded: its messages' keys by request ``seq``, and each session's rows so far.

    Kept beside an observer fed one request at a time (the observe-mode gateway),
    so a rewrite after one more call walks only that call's messages. Valid for
    one list of requests: the same ``seq`` always names the same request.
    """

    def __init__(self) -> None:
        self._keys: dict[int, list[str]] = {}
        # The message rows the last rewrite of each session left, by message key:
        # (row id, the written fields), so the next rewrite writes only what changed.
        self.written: dict[Any, dict[str, tuple[int, tuple[Any, ...]]]] = {}
        # How far each session's rows were derived, valid with ``written``: a rewrite
        # after one more call walks only that call's request, not every earlier one.
        self.progress: dict[Any, _Progress] = {}

    def keys(self, request: RecordedRequest) -> list[str]:
        if request.seq not in self._keys:
            self._keys[request.seq] = message_keys(request.messages)
        return self._keys[request.seq]



def _blocks(message: dict[str, Any], calls: dict[str, str]) -> list[dict[str, Any]]:
    try:
        [parsed] = from_openai([message], known_calls=calls)
    except (ContextLabError, ValueError):
        return [{"type": "text", "text": text_of(message.get("content"))}]
    return [block_to_dict(b) for b in parsed.content]


class _Progress:
    """What ``_write`` derived from a session's agent requests so far, before the last-request pass.

    The inference only appends observations to a conversation, so the next
    rewrite continues from here instead of walking every request again (which
    made recording a call cost the number of requests times their messages)."""

    def __init__(self) -> None:
        self.observed = 0  # the conversation's agent observations walked
        self.rows: dict[str, SessionMessage] = {}
        self.calls: dict[str, str] = {}
        self.turn_of_seq: dict[int, int] = {}
        self.turns: list[Turn] = []
        self.files: dict[str, OffloadedFile] = {}
        self.last_tokens = 0
        # The message each row's current content was derived from: an equal message
        # has equal blocks, so only a new or changed message is converted.
        self.sources: dict[str, tuple[dict[str, Any], str | None]] = {}


def _engine_role(message: dict[str, Any]) -> str:
    role = str(message.get("role", ""))
    return "system" if role == "tool" else role[:16]


def observed_session_write(session: AgentSession, requests: list[RecordedRequest],
                           conversation_id: str | None = None, observer: Observer | None = None,
                           parsed: Parsed | None = None) -> AgentSession:
    """Rebuild the session's rows from its requests (already observed by ``observer``), in one transaction.

    ``parsed``: what earlier rewrites of the same requests derived (see ``Parsed``)."""
    observer = observer or observe(requests)
    parsed = parsed or Parsed()
    conversation = (observer.conversations.get(conversation_id) if conversation_id
                    else main_conversation(observer))
    by_seq = {r.seq: r for r in requests}
    with transaction.atomic():
        locked = AgentSession.objects.select_for_update(of=("self",)).get(pk=session.pk)
        # Turns are kept: a request's turn never changes once written, since the
        # inference reads the requests in order (the gateway adds one per call).
        # So are the message rows that did not change since the last rewrite this
        # process made, as long as nothing else changed the session's rows.
        written = parsed.written.pop(locked.pk, None)
        progress = parsed.progress.pop(locked.pk, None)
        if progress is None:
            written = None
        if written is not None and conversation is not None:
            # Rows another writer deleted or wrote again (new ids) since: write them all.
            rows_now = SessionMessage.objects.filter(session=locked).aggregate(count=Count("pk"), last=Max("pk"))
            if (rows_now["count"], rows_now["last"]) != (len(written), max((pk for pk, _ in written.values()),
                                                                           default=None)):
                written = None
        SummaryVersion.objects.filter(session=locked).delete()
        OffloadedFile.objects.filter(session=locked).delete()
        if written is None:
            SessionMessage.objects.filter(session=locked).delete()
        if conversation is None:
            Turn.objects.filter(session=locked).delete()
            locked.save()
            return locked
        if written is None or progress is None:
            written, progress = {}, _Progress()
        kept = _write(locked, conversation, by_seq, parsed, written, progress)
        if kept is not None:
            # ``parsed`` lives only as long as the transaction commits (the gateway
            # keeps it on commit): a rollback never leaves rows it does not describe.
            parsed.written[locked.pk] = kept
            parsed.progress[locked.pk] = progress
    return locked


# The fields of a message row a rewrite sets (the others keep their defaults).
_ROW_FIELDS = ("message_id", "seq", "role", "content", "current_content", "status", "truncated_stage",
               "truncated_turn", "compacted_turn", "summary_version", "fate")


def _save_rows(session: AgentSession, rows: dict[str, SessionMessage],
               written: dict[str, tuple[int, tuple[Any, ...]]]) -> dict[str, tuple[int, tuple[Any, ...]]] | None:
    """Write the rows that differ from ``written`` (what the previous rewrite left): insert the new
    ones, update the changed ones, delete the gone ones. Returns the new ``written``, or None when
    the database gave the inserted rows no ids to remember."""
    # ``fate`` is copied: a kept row's list grows on later rewrites, the snapshot must not.
    snapshot = {key: tuple(list(row.fate) if name == "fate" else getattr(row, name) for name in _ROW_FIELDS)
                for key, row in rows.items()}
    fresh: list[SessionMessage] = []
    changed: list[SessionMessage] = []
    for key, row in rows.items():
        before = written.get(key)
        if before is None:
            fresh.append(row)
            continue
        row.pk = before[0]
        if before[1] != snapshot[key]:
            changed.append(row)
    gone = [pk for key, (pk, _) in written.items() if key not in rows]
    if gone:
        SessionMessage.objects.filter(session=session, pk__in=gone).delete()
    for row in changed:
        # A few rows a call (a status, a fate event): one short UPDATE each costs less
        # than the CASE expressions of a bulk update.
        SessionMessage.objects.filter(pk=row.pk).update(
            **{name: getattr(row, name) for name in _ROW_FIELDS if name != "message_id"})
    SessionMessage.objects.bulk_create(fresh)
    ids = {key: row.pk for key, row in rows.items() if row.pk is not None}
    if len(ids) != len(rows):
        return None
    return {key: (ids[key], snapshot[key]) for key in rows}


def _write(session: AgentSession, conversation: Conversation, by_seq: dict[int, RecordedRequest],
           parsed: Parsed, previous_rows: dict[str, tuple[int, tuple[Any, ...]]], progress: _Progress
           ) -> dict[str, tuple[int, tuple[Any, ...]]] | None:
    rows, calls, turn_of_seq, turns = progress.rows, progress.calls, progress.turn_of_seq, progress.turns
    agent_observations = [o for o in conversation.observations if not o.side_call and o.trace is not None]
    for observation in agent_observations[progress.observed:]:
        trace = observation.trace
        assert trace is not None
        request = by_seq[observation.seq]
        number = int(trace["turn"])
        turn_of_seq[observation.seq] = number
        messages = request.messages
        for message in messages:
            for call in message.get("tool_calls") or []:
                if isinstance(call, dict):
                    calls[str(call.get("id"))] = str((call.get("function") or {}).get("name", ""))
        for index, key in enumerate(parsed.keys(request)):
            message = messages[index]
            row = rows.get(key)
            source = (message, calls.get(str(message.get("tool_call_id")))) if message.get("role") == "tool" \
                else (message, None)
            if row is not None and progress.sources.get(key) == source:
                continue
            progress.sources[key] = source
            blocks = _blocks(message, calls)
            if row is None:
                row = SessionMessage(session=session, message_id=key[:200], seq=len(rows) + 1,
                                     role=_engine_role(message), content=blocks, current_content=blocks,
                                     fate=[{"event": "sent", "turn": number, "request": observation.seq}])
                rows[key] = row
            elif blocks != row.current_content:
                row.current_content = blocks
        for event in observation.events:
            if event.kind in ("tool_output_shortened", "tool_output_cut_on_arrival"):
                key = f"tool:{event.detail.get('tool_call_id', '')}"
                if key in rows:
                    rows[key].truncated_stage = 1 if event.kind == "tool_output_cut_on_arrival" else 2
                    rows[key].truncated_turn = number
                    rows[key].fate.append({"event": "truncated", "turn": number, "request": observation.seq,
                                           "stage": rows[key].truncated_stage,
                                           "bytes_before": event.detail.get("bytes_before"),
                                           "bytes_after": event.detail.get("bytes_after"),
                                           "file": event.detail.get("path", ""),
                                           "silent": event.detail.get("silent", False)})
                path = str(event.detail.get("path") or "")
                if path:
                    progress.files[path[:300]] = OffloadedFile(
                        session=session, path=path[:300], message_id=f"tool:{event.detail.get('tool_call_id', '')}",
                        stage=1 if event.kind == "tool_output_cut_on_arrival" else 2,
                        bytes=int(event.detail.get("bytes_before") or 0),
                        kept_bytes=int(event.detail.get("kept_bytes") or event.detail.get("bytes_after") or 0),
                        sha256="", referenced=True)
            if event.kind == "messages_dropped":
                version = (observation.compaction or {}).get("summary_version")
                for dropped in event.detail["messages"]:
                    row = rows.get(dropped["key"])
                    if row is None:  # the agent's reply, never sent back before it was compacted
                        blocks = [{"type": "text", "text": dropped["content"]}]
                        row = SessionMessage(session=session, message_id=dropped["key"][:200], seq=len(rows) + 1,
                                             role=dropped["role"][:16], content=blocks, current_content=blocks,
                                             fate=[])
                        rows[dropped["key"]] = row
                    row.status = SessionMessage.Status.ARCHIVED
                    row.compacted_turn = number
                    row.summary_version = version
                    row.fate.append({"event": "compacted", "turn": number, "request": observation.seq,
                                     "summary_version": version})
        tokens = trace["payload"]["tokens"]
        compaction = observation.compaction or {}
        turns.append(Turn(
            session=session, number=number, trigger=trace["trigger"], outcome=trace["outcome"],
            policy=OBSERVED_POLICY, trace=trace, payload=messages, used_tokens=int(tokens["total"]),
            payload_tokens=int(tokens["total"]), compacted_count=int(compaction.get("dropped") or 0),
            summary_version=int(trace["payload"].get("summary_version") or 0),
            # The agent's own limits are unknown: the profile's, as the gauge shows them.
            threshold=session.tokens_threshold, window=session.tokens_window, usage=request.usage))
        progress.last_tokens = int(tokens["total"])
    progress.observed = len(agent_observations)
    # Live is what the agent sent last; anything else left, a replaced summary included. Only
    # what the rows say now: undone after saving, since a later request may send the message again.
    replaced: list[SessionMessage] = []
    if agent_observations:
        last = agent_observations[-1]
        last_keys = set(parsed.keys(by_seq[last.seq]))
        for key, row in rows.items():
            if key not in last_keys and row.status == SessionMessage.Status.LIVE:
                row.status = SessionMessage.Status.ARCHIVED
                row.fate.append({"event": "replaced", "request": last.seq})
                replaced.append(row)
    try:
        return _write_rows(session, conversation, progress, previous_rows)
    finally:
        for row in replaced:
            row.status = SessionMessage.Status.LIVE
            row.fate.pop()


def _write_rows(session: AgentSession, conversation: Conversation, progress: _Progress,
                previous_rows: dict[str, tuple[int, tuple[Any, ...]]]) -> dict[str, tuple[int, tuple[Any, ...]]] | None:
    rows, turns, turn_of_seq = progress.rows, progress.turns, progress.turn_of_seq
    written = dict(Turn.objects.filter(session=session).values_list("number", "trace__observed__request"))
    stale = [t.number for t in turns if t.number in written and written[t.number] != t.trace["observed"]["request"]]
    stale += [n for n in written if n > len(turns)]
    Turn.objects.filter(session=session, number__in=stale).delete()
    fresh = [t for t in turns if t.number not in written or t.number in stale]
    for turn in fresh:
        turn.pk = None  # a kept turn written before, and deleted just now
    Turn.objects.bulk_create(fresh)
    kept = _save_rows(session, rows, previous_rows)
    versions = []
    for summary in conversation.summaries:
        compaction = next((c for c in conversation.compactions if c.get("summary_version") == summary["version"]), {})
        versions.append(SummaryVersion(
            session=session, version=summary["version"], text=summary["text"],
            turn=turn_of_seq.get(summary["seq"], 0), trigger=str(compaction.get("trigger", "")),
            compactor=f"agent (request {summary['compactor_seq']})" if summary.get("compactor_seq") else "agent",
            compacted_ids=[k for k, r in rows.items() if r.summary_version == summary["version"]]))
    SummaryVersion.objects.bulk_create(versions)
    for file in progress.files.values():
        file.pk = None  # kept between rewrites, inserted again after the delete
    OffloadedFile.objects.bulk_create(list(progress.files.values()))
    session.system_prompt = conversation.system_prompt
    session.summary = conversation.summary
    session.summary_version = len(conversation.summaries)
    session.turns_count = len(turns)
    session.compactions_count = sum(1 for c in conversation.compactions if not c["summary_erased"])
    session.failures_count = sum(1 for c in conversation.compactions if c["summary_erased"])
    session.messages_count = len(rows)
    session.live_count = sum(1 for r in rows.values() if r.status == SessionMessage.Status.LIVE)
    session.tokens_used = progress.last_tokens
    session.last_activity = timezone.now()
    session.save()
    return kept


def observed_session_create(*, owner: User, requests: list[RecordedRequest], title: str,
                            source: dict[str, Any], profile: AgentProfile | None = None) -> AgentSession:
    """A new session holding what the inference found in ``requests``."""
    profile = profile or profile_observed(owner=owner)
    session = AgentSession.objects.create(
        owner=owner, profile=profile, title=title[:MAX_TITLE_LENGTH], source=source,
        tokens_window=profile.max_input_length, tokens_threshold=profile.threshold)
    return observed_session_write(session, requests)


# -- imports: a CoPaw workspace, a folder of requests ------------------------------------------

def _copaw_profile(owner: User, name: str, knobs: dict[str, Any]) -> AgentProfile:
    profile, _ = AgentProfile.objects.update_or_create(owner=owner, name=name[:100], defaults=knobs)
    return profile


def _workspace_rows(session: AgentSession, workspace: CopawWorkspace) -> None:
    """Without a request log: the archived and live messages and the current summary, as the workspace holds them.

    Rows are inserted a batch at a time; a message id the workspace uses again gets a ``#dupN``
    suffix (as the transcript importers rename one), never a database error."""
    batch: list[SessionMessage] = []
    seen: set[str] = set()
    located = [(a["message"], SessionMessage.Status.ARCHIVED, a["file"], a["line"]) for a in workspace.archived]
    located += [(m, SessionMessage.Status.LIVE, "", None) for m in workspace.live_messages]
    for index, (message, status, file, line) in enumerate(located, start=1):
        content = message.get("content")
        blocks = ([b for b in content if isinstance(b, dict)] if isinstance(content, list)
                  else [{"type": "text", "text": str(content or "")}])
        batch.append(SessionMessage(session=session, message_id=_unique_id(str(message.get("id") or f"m{index}"), seen),
                                    seq=index, role=str(message.get("role", ""))[:16],
                                    name=str(message.get("name") or ""), timestamp=str(message.get("timestamp") or ""),
                                    content=blocks, current_content=blocks, status=status, archive_file=file,
                                    archive_line=line))
        if len(batch) >= _ROW_BATCH:
            SessionMessage.objects.bulk_create(batch)
            batch = []
    SessionMessage.objects.bulk_create(batch)
    if workspace.summary:
        SummaryVersion.objects.create(session=session, version=1, text=workspace.summary, turn=0, trigger="",
                                      compactor="agent", compacted_ids=[])
    session.summary = workspace.summary
    session.summary_version = 1 if workspace.summary else 0
    session.messages_count = len(located)
    session.live_count = len(workspace.live_messages)
    session.system_prompt = workspace.system_prompt
    session.save()


_ROW_BATCH = 500


def _unique_id(message_id: str, seen: set[str]) -> str:
    """``message_id`` (cut to what a row holds), or with a ``#dupN`` suffix when ``seen`` has it already."""
    unique = message_id[:200]
    n = 2
    while unique in seen:
        unique = f"{message_id[:190]}#dup{n}"
        n += 1
    seen.add(unique)
    return unique


def unpack_budget(path: Path) -> UnpackBudget:
    """What an uploaded zip may unpack to, on disk: each member one JSON document of a bundle, in all
    twice the archive plus that. What its members cost in memory once read is ``upload_budget``'s."""
    body = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    size = path.stat().st_size if path.is_file() else 0
    return UnpackBudget(
        member_bytes=2 * body,
        total_bytes=2 * size + 2 * body,
        member_text="the limit for one member of an uploaded zip, CONTEXTLAB_MAX_BODY_BYTES × 2",
        total_text=f"twice the zip's {size:,} bytes + CONTEXTLAB_MAX_BODY_BYTES × 2",
    )


def copaw_workspace_import(*, owner: User, path: Path, title: str = "", file_name: str = "") -> AgentSession:
    """A CoPaw workspace (folder or zip, with its ``requests/`` log inside when there is one) as a session."""
    # One budget for all the workspace's files and its requests: they are one upload.
    budget = upload_budget(path.stat().st_size) if path.is_file() else None
    with opened_folder(path, WORKSPACE_MARKERS, unpack_budget(path)) as folder:
        if not any((folder / n).exists() for n in WORKSPACE_MARKERS):
            raise MalformedInput("not a CoPaw workspace: no agent.json, sessions/ or dialog/", field="file")
        workspace = read_workspace(folder, budget)
        request_dir = next((d for d in (folder / "requests", folder.parent / "requests") if d.is_dir()), None)
        requests = read_request_folder(request_dir, budget) if request_dir is not None else []
    report = analyse(workspace, observe(requests) if requests else None)
    profile = _copaw_profile(owner, f"CoPaw {workspace.folder_name}", {
        k: v for k, v in workspace.profile.items() if k in PROFILE_KNOBS})
    source = {"format": "copaw_workspace", "file": file_name or path.name, "warnings": report["warnings"][:100],
              "messages": report["live_messages"] + report["archived_messages"], "requests": len(requests),
              "report": {k: report[k] for k in REPORT_KEYS}}
    if requests:
        session = observed_session_create(owner=owner, requests=requests, profile=profile, source=source,
                                          title=title or f"CoPaw {workspace.folder_name}")
    else:
        with transaction.atomic():
            session = AgentSession.objects.create(
                owner=owner, profile=profile, source=source,
                title=(title or f"CoPaw {workspace.folder_name}")[:MAX_TITLE_LENGTH],
                tokens_window=profile.max_input_length, tokens_threshold=profile.threshold)
            _workspace_rows(session, workspace)
    _write_memory(session, workspace)
    return session


def _write_memory(session: AgentSession, workspace: CopawWorkspace) -> None:
    """The agent's memory files into the session workspace, where the memory pages read them."""
    for relative, text in workspace.memory.items():
        name = PurePosixPath(relative).name
        if not name.endswith(".md") or name.startswith("."):
            continue
        target = (session.workspace / MEMORY_FILE if relative == MEMORY_FILE
                  else session.workspace / DAILY_DIR / name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def requests_import(*, owner: User, path: Path, title: str = "", file_name: str = "",
                    profile: AgentProfile | None = None) -> AgentSession:
    """A folder (or zip) of recorded request bodies, as the session of its main conversation."""
    budget = upload_budget(path.stat().st_size) if path.is_file() else None
    with opened_folder(path, REQUEST_MARKERS, unpack_budget(path)) as folder:
        inner = folder / "requests" if (folder / "requests").is_dir() else folder
        requests = read_request_folder(inner, budget)
    observer = observe(requests)
    source = {"format": "requests", "file": file_name or path.name, "requests": len(requests),
              "messages": len(requests), "conversations": len(observer.conversations), "warnings": []}
    return observed_session_create(owner=owner, requests=requests, profile=profile, source=source,
                                   title=title or f"Requests {file_name or path.name}")


def zip_kind(path: Path) -> str:
    """What an uploaded zip holds: "copaw_workspace", "requests" or "bundle" (a session export)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            names = [PurePosixPath(n) for n in archive.namelist()[:MAX_MEMBERS]]
    except zipfile.BadZipFile:
        return "bundle"  # the bundle reader says what is wrong with it
    if any(n.name == "agent.json" or (n.suffix == ".jsonl" and n.parent.name == "dialog")
           or (n.suffix == ".json" and n.parent.name == "sessions") for n in names):
        return "copaw_workspace"
    files = [n for n in names if not str(n).endswith("/")]
    if files and all(n.suffix == ".json" for n in files) and not any(n.name == "session.json" for n in files):
        return "requests"
    return "bundle"


def otlp_import(*, owner: User, path: Path, title: str = "", file_name: str = "",
                profile: AgentProfile | None = None) -> AgentSession:
    """An OTLP JSON trace file (spans of LLM calls) as the session of its main conversation."""
    from contextlab.engine.observe.inference import load_recorded_request
    from contextlab.engine.observe.otlp import file_requests

    try:
        with path.open("rb") as fh:
            records, rejected = file_requests(fh, upload_budget(path.stat().st_size))
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedInput(f"the file is not an OTLP JSON trace export: {exc}", field="file") from exc
    if not records:
        raise MalformedInput("the trace holds no LLM call (no span with gen_ai.* or llm.* input messages)",
                             field="file")
    requests = [load_recorded_request(record, record["seq"]) for record in records]
    observer = observe(requests)
    source = {"format": "otlp", "file": file_name or path.name, "requests": len(requests),
              "messages": len(requests), "conversations": len(observer.conversations),
              "warnings": [f"span left out: {reason}" for reason in rejected[:100]]}
    return observed_session_create(owner=owner, requests=requests, profile=profile, source=source,
                                   title=title or f"Trace {file_name or path.name}")
