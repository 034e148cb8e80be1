"""The demo's story: one fact the user gave that compaction really lost, found and checked at load time.

The demo session is replayed from a transcript with a small window, so compaction
fires; whether a summary drops something the user said depends on the transcript
and the compactor. Rather than claim a loss, the loader looks for one the way a
reader would: it takes the searchable strings of the user's own messages (codes,
ids, paths, names with digits, dots, slashes or underscores), in order, and asks
the session search — the same search the search page answers with — where each
one went. The first that was compacted into a summary that did not keep it, and
that neither a live message, a file nor the current summary shows any more, is
the story. When nothing was lost, the story says so, with a fact a summary kept.
"""

from __future__ import annotations

import re
from typing import Any

from contextlab.dashboard.search import search_session
from contextlab.sessions.models import AgentSession, SessionMessage, SummaryVersion

# A token a user could search for: at least 5 characters, and a digit, a slash, a dot or an
# underscore inside it (a reservation code, a user id, a path, a file, a snake_case name).
_TOKEN = re.compile(r"(?<![\w/.-])[A-Za-z0-9][\w/.-]{3,}[A-Za-z0-9](?![\w/-])")
_MARK = re.compile(r"[\d/._]")
MAX_CANDIDATES = 40


def candidates(session: AgentSession) -> list[tuple[str, int]]:
    """The searchable strings of the messages, the user's first, oldest first, each with its first message's seq."""
    seen: dict[str, int] = {}
    system = session.system_prompt or ""
    # What the user said first, then what the agent said: prose only (a tool's JSON keys are no fact).
    rows = (SessionMessage.objects.filter(session=session, role__in=("user", "assistant")).order_by("seq")
            .values_list("seq", "role", "content"))
    ordered = sorted(rows, key=lambda row: (row[1] != "user", row[0]))
    for seq, _role, content in ordered:
        prose = " ".join(str(block.get("text", "")) for block in content or [] if block.get("type") == "text")
        for token in _TOKEN.findall(prose):
            if _MARK.search(token) and token not in system and token not in seen:
                seen[token] = seq
    return list(seen.items())[:MAX_CANDIDATES]


def find_story(session: AgentSession) -> dict[str, Any] | None:
    """The first fact compaction lost for good, as the search page tells it (``kind`` "lost"); when
    none was lost, the first compacted fact and the summary that kept it (``kind`` "kept"); None
    when nothing was compacted."""
    current = (SummaryVersion.objects.filter(session=session).order_by("-version")
               .values_list("text", flat=True).first()) or ""
    kept_story: dict[str, Any] | None = None
    for needle, seq in candidates(session):
        result = search_session(session, needle)
        hit = next((h for h in result.messages if h.message.seq == seq), None)
        if hit is None or hit.message.compacted_turn is None or hit.message.summary_version is None:
            continue
        story = {"needle": needle, "seq": seq, "role": hit.message.role, "turn": hit.message.compacted_turn,
                 "version": hit.message.summary_version}
        kept = {s["version"]: s["contains"] for s in result.summaries}.get(hit.message.summary_version, False)
        still_seen = (needle in current or bool(result.files)
                      or any(h.message.is_live and h.in_current for h in result.messages))
        if not kept and not still_seen:
            return {"kind": "lost", **story}
        if kept and kept_story is None:
            kept_story = {"kind": "kept", **story}
    return kept_story


def record(session: AgentSession) -> dict[str, Any] | None:
    """Find the story and keep it with the session's source, where the sessions list reads it."""
    story = find_story(session)
    session.source = {**(session.source or {}), "demo_story": story or {}}
    session.save(update_fields=["source"])
    return story


def fate_in(session: AgentSession, needle: str, seq: int) -> dict[str, Any] | None:
    """Where the search says ``needle`` of message ``seq`` went in ``session``: the summary version its
    message was compacted into and whether that version (or a file it names) kept it; None when
    the message was never compacted there."""
    result = search_session(session, needle)
    hit = next((h for h in result.messages if h.message.seq == seq), None)
    if hit is None or hit.message.compacted_turn is None or hit.message.summary_version is None:
        return None
    version = hit.message.summary_version
    summary = next((s for s in result.summaries if s["version"] == version), None)
    return {"turn": hit.message.compacted_turn, "version": version,
            "kept": bool(summary and summary["contains"]),
            "kept_in": (summary or {}).get("kept_in") or ""}


def record_loss(home: AgentSession, copaw_session: AgentSession, contextlab_session: AgentSession) -> dict[str, Any]:
    """The loss the landing page leads to: the same conversation replayed under the faithful
    ``copaw`` policy and under ``contextlab``. The story is the first fact the copaw session lost
    for good (found as ``find_story`` finds it), with what the contextlab session did with it.
    Kept with the home demo's story (``loss``); empty when the copaw session lost nothing."""
    story = find_story(copaw_session)
    loss: dict[str, Any] = {}
    if story and story["kind"] == "lost":
        loss = {**story, "session": str(copaw_session.pk), "session_title": copaw_session.display_title,
                "compare": {"session": str(contextlab_session.pk), "title": contextlab_session.display_title,
                            "fate": fate_in(contextlab_session, story["needle"], story["seq"])}}
    home.source = {**(home.source or {}), "demo_story": {**((home.source or {}).get("demo_story") or {}),
                                                           "loss": loss}}
    home.save(update_fields=["source"])
    return loss
