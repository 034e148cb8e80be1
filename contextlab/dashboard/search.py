"""'Where did it go?': one string, followed through everything a session keeps.

Searched, case-insensitively: every message as ingested and as the live
context holds it now, every summary version, the dialog archive files and the
offloaded tool outputs. For each message that held the string, its history:
live now; or cut out of the live text at stage S but still in file F; or
present until turn N, compacted into summary vK (which does or does not still
say it) and archived at file:line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q

from contextlab.engine.stages.summary.identifiers import mentions
from contextlab.lib.blocks import first_text
from contextlab.sessions import loss_records
from contextlab.sessions.models import AgentSession, OffloadedFile, SessionMessage

MAX_QUERY = 200
MAX_MESSAGE_HITS = 500
MAX_FILE_BYTES = 64 * 1024 * 1024  # offloaded and archive files read per search, together
SNIPPET = 70


@dataclass
class Snippet:
    before: str
    match: str
    after: str


def snippet(text: str, needle: str) -> Snippet | None:
    at = text.lower().find(needle.lower())
    if at < 0:
        return None
    start, end = max(0, at - SNIPPET), min(len(text), at + len(needle) + SNIPPET)
    return Snippet(("…" if start else "") + _flat(text[start:at]), text[at:at + len(needle)],
                   _flat(text[at + len(needle):end]) + ("…" if end < len(text) else ""))


def _flat(text: str) -> str:
    """One line of context: runs of whitespace become one space.

    A space at either end stays: it is what separates the context from the
    match ("a .dialyzerignore file", not "a.dialyzerignorefile").
    """
    return re.sub(r"\s+", " ", text)


@dataclass
class MessageHit:
    message: SessionMessage
    in_original: bool
    in_current: bool
    snippet: Snippet | None
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class SearchResult:
    query: str
    messages: list[MessageHit] = field(default_factory=list)
    message_count: int = 0
    live_count: int = 0
    cut_count: int = 0
    archived_count: int = 0
    summaries: list[dict[str, Any]] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)
    archive: list[dict[str, Any]] = field(default_factory=list)
    limited: bool = False

    @property
    def summary_versions(self) -> list[int]:
        return [s["version"] for s in self.summaries if s["contains"]]

    @property
    def found(self) -> bool:
        return bool(self.message_count or self.summary_versions or self.files or self.archive)


def _plain(needle: str) -> bool:
    # A needle the database can look for in the stored JSON text as it is: no
    # character that JSON escapes (quotes, backslashes, controls, non-ASCII).
    return all(32 <= ord(c) < 127 and c not in '"\\' for c in needle)


def _scan_file(path: Any, needle: str, budget: list[int], *, max_lines: int = 5) -> tuple[list[int], str | None]:
    """Line numbers (at most ``max_lines``) of ``path`` holding ``needle``, and the first line's text."""
    lines: list[int] = []
    first: str | None = None
    low = needle.lower()
    try:
        size = path.stat().st_size
        if size > budget[0]:
            return [], None
        budget[0] -= size
        with path.open("r", encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, start=1):
                if low in line.lower():
                    lines.append(number)
                    first = first or line
                    if len(lines) >= max_lines:
                        break
    except OSError:
        return [], None
    return lines, first


def search_session(session: AgentSession, query: str) -> SearchResult:
    needle = query.strip()[:MAX_QUERY]
    result = SearchResult(query=needle)
    if not needle:
        return result
    low = needle.lower()

    summaries = list(session.summary_versions.order_by("version").values_list("version", "turn", "text"))
    # The loss check's own test ("mentions") on the same texts (the summary and the files it
    # names, the identifier index first): search and check cannot disagree about a string.
    contains = {version: mentions(needle, text) for version, _, text in summaries}
    kept_in: dict[int, str] = {}
    for version, _, text in summaries:
        if not contains[version]:
            named = next((name for name, body in loss_records.kept_texts(session, text)[0]
                          if mentions(needle, body)), None)
            if named:
                kept_in[version] = named
    for version, turn, text in summaries:
        result.summaries.append({"version": version, "turn": turn, "contains": contains[version],
                                 "kept_in": kept_in.get(version), "snippet": snippet(text, needle)})

    offloaded: dict[str, list[OffloadedFile]] = {}
    for file in session.offloaded_files.all():
        offloaded.setdefault(file.message_id, []).append(file)

    qs = SessionMessage.objects.filter(session=session).order_by("seq")
    if _plain(needle):
        qs = qs.filter(Q(content__icontains=needle) | Q(current_content__icontains=needle))
    for message in qs.iterator(chunk_size=500):
        original = first_text(message.content)
        current = first_text(message.current_content)
        in_original, in_current = low in original.lower(), low in current.lower()
        if not (in_original or in_current):
            continue
        result.message_count += 1
        if message.is_live and in_current:
            result.live_count += 1
        elif message.is_live:
            result.cut_count += 1
        else:
            result.archived_count += 1
        if len(result.messages) >= MAX_MESSAGE_HITS:
            result.limited = True
            continue
        hit = MessageHit(message, in_original, in_current, snippet(original if in_original else current, needle))
        hit.history = _history(message, in_current, offloaded.get(message.message_id, []), contains, kept_in)
        # The ingested content is no longer needed; keep the page's memory small.
        message.content = None
        result.messages.append(hit)

    located = {(hit.message.archive_file, hit.message.archive_line): hit.message.seq
               for hit in result.messages if hit.message.archive_file}
    budget = [MAX_FILE_BYTES]
    for file in session.offloaded_files.order_by("pk"):
        path = session.workspace_file(file.path)
        if path is None:
            continue
        lines, first = _scan_file(path, needle, budget)
        if lines:
            result.files.append({"path": file.path, "lines": lines, "message_id": file.message_id,
                                 "snippet": snippet(first or "", needle)})
    dialog = session.workspace / "dialog"
    if dialog.is_dir():
        for path in sorted(dialog.glob("*.jsonl")):
            lines, _ = _scan_file(path, needle, budget, max_lines=50)
            for number in lines:
                name = f"dialog/{path.name}"
                result.archive.append({"file": name, "line": number, "seq": located.get((name, number))})
    if budget[0] <= 0:
        result.limited = True
    return result


def _history(message: SessionMessage, in_current: bool, files: list[OffloadedFile],
             contains: dict[int, bool], kept_in: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """The string's story in this message, oldest first."""
    events: list[dict[str, Any]] = []
    ingested = next((e for e in message.fate or [] if e.get("event") == "ingested"), None)
    if ingested and ingested.get("before_turn"):
        events.append({"kind": "ingested", "text": f"entered the context before turn {ingested['before_turn']}"})
    cut = list(files) if not in_current else []
    turn = message.truncated_turn
    if cut:
        stage = message.truncated_stage or cut[-1].stage
        first_turn = int(ingested.get("before_turn") or 1) if ingested else 1
        if stage == 1 or not turn:
            events.append({"kind": "present", "text": "never in the live text: cut when the result arrived"})
        elif turn - 1 < first_turn:
            events.append({"kind": "present", "text": f"never sent uncut: cut in turn {turn}, its first"})
        else:
            events.append({"kind": "present", "text": f"in the live text until turn {turn - 1}"})
        where = f" in turn {turn}" if turn and stage == 2 else (f" before turn {turn}" if turn else "")
        events.append({"kind": "truncated",
                       "text": f"cut out of the live text at stage {stage}{where}; the full text is in",
                       "file": cut[-1].path})
    if message.compacted_turn is not None:
        version = message.summary_version
        if not cut:
            # A message that entered before turn N and was compacted in turn N
            # was never sent as itself: "present until turn N-1" would be false.
            first_turn = int(ingested.get("before_turn") or 1) if ingested else 1
            last_turn = message.compacted_turn - 1
            events.append({"kind": "present", "text": f"present from turn {first_turn} until turn {last_turn}"
                           if last_turn >= first_turn else "never sent before its compaction"})
        named = (kept_in or {}).get(version or -1)
        said = contains.get(version or -1)
        if named and not said:
            events.append({"kind": "compacted", "file": named,
                           "text": f"compacted in turn {message.compacted_turn} into summary v{version}, which "
                                   "keeps it in the file it names:"})
        else:
            events.append({"kind": "compacted" if said else "lost",
                           "text": f"compacted in turn {message.compacted_turn} into summary v{version}, which "
                                   + ("says it" if said else "does not say it")})
        kept = {v: has or v in (kept_in or {}) for v, has in contains.items()}
        later = [v for v in kept if version is not None and v > version]
        if (said or named) and later and not all(kept[v] for v in later):
            dropped = next(v for v in sorted(later) if not kept[v])
            events.append({"kind": "lost", "text": f"dropped from the summary in v{dropped}"})
    if message.archive_file:
        events.append({"kind": "archived", "text": f"archived at {message.archive_file}:{message.archive_line}",
                       "file": message.archive_file, "line": message.archive_line})
    if message.is_live:
        events.append({"kind": "live", "text": "in the live context now" if in_current
                       else "the message is live, the string is not in its live text"})
    return events

