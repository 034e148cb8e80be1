"""'Why was X lost?' answered as one sentence, every part a link.

From the search's result: the first message that held the string and no longer
shows it, followed through its fate in order: where it entered, how its tool
output was cut (and where the full text is), which compaction took it into
which summary version, whether that version kept the string, and which later
version dropped it.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.urls import reverse

from contextlab.dashboard.search import MessageHit, SearchResult
from contextlab.sessions.models import AgentSession, OffloadedFile


@dataclass(frozen=True)
class Part:
    text: str
    url: str = ""


def _turn_url(session: AgentSession, number: int) -> str:
    # The session page with every panel at that turn (time travel).
    return f"{session.get_absolute_url()}?turn={number}"


def _summary_url(session: AgentSession, version: int) -> str:
    return f"{reverse('cl-session-summaries', args=[session.id])}?v={version}"


def _file_url(session: AgentSession, path: str, line: int | None = None) -> str:
    url = reverse("cl-session-file", args=[session.id, path])
    return f"{url}?line={line}" if line else url


def story_hit(result: SearchResult) -> MessageHit | None:
    """The oldest message that held the string and no longer shows it live; else the oldest."""
    gone = [hit for hit in result.messages if not (hit.message.is_live and hit.in_current)]
    hits = gone or result.messages
    return hits[0] if hits else None


def why_lost(session: AgentSession, result: SearchResult | None) -> list[Part]:
    if result is None or not result.messages:
        return []
    hit = story_hit(result)
    if hit is None:
        return []
    m = hit.message
    parts: list[Part] = [Part(f"“{result.query}”")]
    ingested = next((e for e in m.fate or [] if e.get("event") == "ingested"), None)
    entered = int(ingested["before_turn"]) if ingested and ingested.get("before_turn") else None
    message = Part(f"message #{m.seq}", reverse("cl-message-detail", args=[session.id, m.seq]))
    if entered:
        parts += [Part(" entered in "), Part(f"turn {entered}", _turn_url(session, entered)), Part(" ("), message,
                  Part(")")]
    else:
        parts += [Part(" entered in "), message]
    if m.is_live and hit.in_current:
        return [*parts, Part(" and is in the live context now.")]

    files = list(OffloadedFile.objects.filter(session=session, message_id=m.message_id).order_by("pk"))
    if files and not hit.in_current:
        cut = files[-1]
        parts.append(Part(f", its tool output was cut to {cut.kept_bytes:,} B"))
        if m.truncated_turn:
            where = "in" if cut.stage == 2 else "before"
            parts += [Part(f" {where} "), Part(f"turn {m.truncated_turn}", _turn_url(session, m.truncated_turn))]
        parts += [Part(f" (stage {cut.stage}, full text in "), Part(cut.path, _file_url(session, cut.path)),
                  Part(")")]

    if m.compacted_turn is not None:
        parts += [Part(", the message was compacted in "),
                  Part(f"turn {m.compacted_turn}", _turn_url(session, m.compacted_turn))]
        # Kept: in the summary's text, or in a file it names (the identifier index).
        contains = {s["version"]: s["contains"] or bool(s.get("kept_in")) for s in result.summaries}
        in_text = {s["version"]: s["contains"] for s in result.summaries}
        version = m.summary_version
        if version is not None:
            kept = contains.get(version, False)
            named = next((s["kept_in"] for s in result.summaries if s["version"] == version and s.get("kept_in")),
                         None)
            parts += [Part(" into "), Part(f"summary v{version}", _summary_url(session, version))]
            if in_text.get(version) or not named:
                parts.append(Part(", which kept it" if kept else ", which did not keep it"))
            else:
                # Not in the text, but in the identifier index the summary names: kept, one read away.
                parts += [Part(", which kept it in the file it names, "), Part(named, _file_url(session, named))]
            later = sorted(v for v in contains if v > version)
            dropped = next((v for v in later if not contains[v]), None) if kept else None
            if dropped is not None:
                parts += [Part("; "), Part(f"summary v{dropped}", _summary_url(session, dropped)),
                          Part(" dropped it")]
            elif kept and later:
                parts.append(Part(f"; the current summary v{later[-1]} still has it"))
        if m.archive_file:
            parts += [Part("; the original is archived at "),
                      Part(f"{m.archive_file}:{m.archive_line}", _file_url(session, m.archive_file, m.archive_line))]
    elif m.is_live:
        parts.append(Part("; the message is still live, without it"))
    parts.append(Part("."))
    return parts
